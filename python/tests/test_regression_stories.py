"""Real-world regression stories (issue 14), each found by `bisect` from a
good and a bad launch configuration written in sglang's own words
(docs/engines.md), each with a signature of its own.

(c) Decode CUDA-graph max batch 512 on a 96 GB device: the graphs for batches
    up to 512 do not fit in what mem_fraction_static leaves, so the server dies
    in graph capture; 256 fits. (sglang reports of GLM-5.x on RTX PRO 6000.)
(a) A ModelOpt NVFP4 checkpoint whose exclude list keeps the shared experts in
    bf16, loaded with shared-experts fusion (sglang's default): loading fails on
    the shape mismatch; --disable-shared-experts-fusion fixes it.
(b) A DSA decode backend without SM120 kernels on an SM120 capture:
    unsupported_arch; a backend with SM120 code fixes it.

The tiny model's memory arithmetic is scaled (device_memory_scale) so its
weights take the share of a 96 GB device that GLM-5-NVFP4's 56 GB per rank do:
92352 weight bytes per rank / (0.58 * 96e9) = 1.6586e-6.
"""
import json
import os
import subprocess

import pytest

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
pytestmark = pytest.mark.skipif(not os.path.exists(BIN), reason="needs the crashreplay binary (CRASHREPLAY_BIN)")

SCALED_96GB = ["crashreplay.device_memory_gb = 96", "crashreplay.device_memory_scale = 1.6586e-6"]


def run(*args, **kw):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600, **kw)


def write(path, lines):
    path.write_text("\n".join(['engine = "sglang"', *lines]) + "\n")
    return str(path)


def bisect_json(*args):
    r = run("bisect", *args, "--json", "-q")
    assert r.returncode == 0, r.stderr + r.stdout
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def glm5_nvfp4(tmp_path_factory):
    """A tiny glm_moe_dsa ModelOpt NVFP4 checkpoint: routed experts NVFP4;
    attention, indexer and shared experts bf16 and in the exclude list."""
    d = tmp_path_factory.mktemp("stories") / "glm5_nvfp4"
    r = run("make-model", str(d), "--arch", "glm_moe_dsa", "--quant", "nvfp4")
    assert r.returncode == 0, r.stderr
    ignore = json.loads((d / "config.json").read_text())["quantization_config"]["ignore"]
    assert "model.layers.*.mlp.shared_experts*" in ignore
    return str(d)


# An RTX PRO 6000 (sm_120, 96 GB) with the tiny model's weights at GLM-5's
# share of it: 1426944 bytes / (0.58 * 96e9) = 2.5628e-5. JIT DeepGEMM off
# (the 2026 workaround for its UE8M0 scales on SM120; tested elsewhere).
SM120 = ['attention_backend = "dsa"', 'dsa_prefill_backend = "triton"', 'kv_cache_dtype = "fp8_e4m3"',
         "page_size = 64", "mem_fraction_static = 0.85", "cuda_graph_max_bs = 16",
         'env.SGLANG_ENABLE_JIT_DEEPGEMM = "0"', 'crashreplay.device_arch = "sm_120"',
         "crashreplay.device_memory_gb = 96", "crashreplay.device_memory_scale = 2.5628e-5"]
RTX_PRO_6000 = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def record(model, config, session):
    return run("run", model, "--config", config, "--prompt", "say hello", "--max-new-tokens", "3", "--record",
               session, "--device-name", RTX_PRO_6000)


def test_a_shared_experts_fusion_fails_loading_a_checkpoint_that_keeps_them_bf16(tmp_path, glm5_nvfp4):
    good = write(tmp_path / "good.toml", [*SM120, 'dsa_decode_backend = "triton"',
                                          "disable_shared_experts_fusion = true"])
    bad = write(tmp_path / "bad.toml", [*SM120, 'dsa_decode_backend = "triton"',
                                        "disable_shared_experts_fusion = false"])
    session = str(tmp_path / "session")
    r = record(glm5_nvfp4, bad, session)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAILED error/load/shared_experts_fusion/shared_expert_stored_like_routed" in r.stdout, r.stdout
    assert "must match the size of tensor b" in r.stdout
    assert record(glm5_nvfp4, good, str(tmp_path / "good_session")).returncode == 0
    replay = json.loads(run("replay", session, "--json").stdout)
    assert replay["weights"].startswith("verified") and "sglang layout" in replay["weights"], replay["weights"]
    assert replay["fault"]["signature"] == {"class": "other", "stage": "load", "kernel": "shared_experts_fusion",
                                            "check": "shared_expert_stored_like_routed"}
    j = bisect_json(session, "--good", good, "--bad", bad)
    assert j["culprit"] == {"disable_shared_experts_fusion": False}, j["culprit"]
    assert j["target_signature"]["stage"] == "load"


def test_b_a_dsa_decode_backend_without_sm120_kernels_fails_unsupported_arch_on_an_sm120_capture(tmp_path,
                                                                                                  glm5_nvfp4):
    good = write(tmp_path / "good.toml", [*SM120, 'dsa_decode_backend = "triton"',
                                          "disable_shared_experts_fusion = true"])
    bad = write(tmp_path / "bad.toml", [*SM120, 'dsa_decode_backend = "flashmla_kv"',
                                        "disable_shared_experts_fusion = true"])
    session = str(tmp_path / "session")
    r = record(glm5_nvfp4, bad, session)
    assert r.returncode == 1
    assert "FAILED unsupported_arch/decode/attention/flashmla_sparse_on_sm_120" in r.stdout, r.stdout
    assert "Unsupported architecture for sparse decode fwd" in r.stdout
    replay = json.loads(run("replay", session, "--json").stdout)
    assert replay["outcome"] == "failed" and replay["config"]["device_arch"] == "sm_120"
    assert replay["fault"]["signature"]["class"] == "unsupported_arch"
    # The same capture replayed as if on a Hopper: FlashMLA has code there.
    hopper = json.loads(run("replay", session, "--json", "--set", "device_arch=sm_90").stdout)
    assert hopper.get("fault", {}).get("signature", {}).get("class") != "unsupported_arch", hopper.get("fault")
    j = bisect_json(session, "--good", good, "--bad", bad)
    assert j["culprit"] == {"dsa_decode_backend": "flashmla_kv"}, j["culprit"]
    assert j["target_signature"]["class"] == "unsupported_arch" and j["target_signature"]["stage"] == "decode"


@pytest.fixture(scope="module")
def glm4_nvfp4(tmp_path_factory):
    d = tmp_path_factory.mktemp("stories") / "glm4_nvfp4"
    r = run("make-model", str(d), "--arch", "glm4_moe", "--quant", "nvfp4")
    assert r.returncode == 0, r.stderr
    return str(d)


def test_c_decode_graph_max_bs_512_on_96gb_dies_in_graph_capture_256_fits(tmp_path, glm4_nvfp4):
    common = ["tp_size = 2", "mem_fraction_static = 0.80", "max_running_requests = 512", "page_size = 16",
              *SCALED_96GB]
    good = write(tmp_path / "good.toml", [*common, "cuda_graph_max_bs = 256", 'attention_backend = "triton"'])
    bad = write(tmp_path / "bad.toml", [*common, "cuda_graph_max_bs = 512", 'attention_backend = "flashinfer"'])
    session = str(tmp_path / "session")
    r = run("run", glm4_nvfp4, "--config", bad, "--prompt", "say hello", "--max-new-tokens", "2", "--record", session)
    assert r.returncode == 1 and "FAILED oom/graph_capture/memory_planner/graph_memory_fits" in r.stdout, r.stdout
    assert run("run", glm4_nvfp4, "--config", good, "--prompt", "say hello", "--max-new-tokens", "2").returncode == 0
    replay = json.loads(run("replay", session, "--json").stdout)
    assert replay["fault"]["signature"]["class"] == "oom" and replay["fault"]["signature"]["stage"] == "graph_capture"
    j = bisect_json(session, "--good", good, "--bad", bad)
    assert j["status"] == "culprit_found"
    assert j["culprit"] == {"cuda_graph_max_bs": 512}, j["culprit"]
    assert j["target_signature"]["class"] == "oom" and j["target_signature"]["stage"] == "graph_capture"
    assert j["culprit_minimal"]
