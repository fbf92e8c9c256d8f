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
