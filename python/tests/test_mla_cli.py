"""The MLA models end to end through the CLI: `make-model` writes
deepseek_v3 (DeepSeek FP8 128x128 blocks), deepseek_v32 and glm_moe_dsa
(ModelOpt NVFP4 with attention, indexer and shared experts left bf16 by the
config's ignore list); `hash` names them, `run --record` records them,
`replay` re-executes a decode step bit-exactly with every MLA/DSA kernel in
`--json` kernels listing the checks it carries, and `bisect` pins a FlashMLA
precondition failure on the toggle that selects the kernel.
"""
import json
import os
import subprocess

import pytest

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")


def run(*args):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, check=False)


@pytest.mark.parametrize("arch,quant", [("deepseek_v3", "fp8"), ("deepseek_v32", "bf16"), ("glm_moe_dsa", "nvfp4")])
def test_record_and_replay_bit_exact_with_the_mla_kernels_and_their_checks(tmp_path, arch, quant):
    model, rec = tmp_path / "m", tmp_path / "rec"
    extra = ["--index-pattern", "FS"] if arch == "glm_moe_dsa" else []
    assert run("make-model", model, "--arch", arch, "--quant", quant, *extra).returncode == 0
    config = json.loads((model / "config.json").read_text())
    assert config["model_type"] == arch and config["kv_lora_rank"] == 512
    if quant == "nvfp4":
        ignore = config["quantization_config"]["ignore"]
        assert "model.layers.*.mlp.shared_experts*" in ignore and "model.layers.*.self_attn*" in ignore
    h = run("hash", model)
    assert h.returncode == 0, h.stderr
    r = run("run", model, "--prompt", "Say hello", "--max-new-tokens", "4", "--record", rec)
    assert r.returncode == 0, r.stderr
    rep = run("replay", rec, "--step", "2", "--json")
    assert rep.returncode == 0, rep.stderr
    out = json.loads(rep.stdout)
    assert out["outcome"] == "reproduced"
    kernels = {k["name"]: k for k in out["kernels"]}
    # Layer 0's write also carries the step's slot checks (once a step); later layers' do not.
    assert kernels["L0.kv_write"]["checks"] == ["position_in_page_table", "page_index_in_pool", "kv_slot_written_once",
                                                "kv_slot_not_read_while_written"]
    assert kernels["L1.kv_write"]["checks"] == ["position_in_page_table", "page_index_in_pool"]
    assert kernels["L0.q_absorb" if arch != "deepseek_v3" else "L0.kv_b_proj"]["checks"] == []
    if arch == "deepseek_v3":  # dense MLA decodes naive by default
        assert "L0.latent_gather" in kernels and "L0.indexer" not in kernels
    else:  # DSA decodes absorbed over the top-k
        assert "topk_index_in_sequence" in kernels["L0.attention"]["checks"]
        assert "mla_head_dim_576" not in kernels["L0.attention"]["checks"]  # the reference form has no such limit
        assert kernels["L0.indexer"]["checks"] == ["position_in_page_table", "page_index_in_pool"]
    if arch == "glm_moe_dsa":
        assert "L1.indexer" not in kernels  # a "shared" layer reuses layer 0's top-k


def test_flashmla_kernels_list_their_preconditions(tmp_path):
    model, rec = tmp_path / "m", tmp_path / "rec"
    assert run("make-model", model, "--arch", "glm_moe_dsa").returncode == 0
    r = run("run", model, "--prompt", "Hi", "--max-new-tokens", "2", "--record", rec,
            "--set", "dsa_decode=tiled64", "--set", "page_size=64", "--set", "index_cache_dtype=fp8_e4m3")
    assert r.returncode == 0, r.stderr
    out = json.loads(run("replay", rec, "--step", "1", "--json").stdout)
    kernels = {k["name"]: k for k in out["kernels"]}
    assert kernels["L0.attention"]["checks"] == [
        "position_in_page_table", "page_index_in_pool", "mla_head_dim_576", "mla_v_head_dim_512",
        "sparse_mla_heads_supported", "topk_multiple_of_64", "topk_index_in_sequence"]
    assert "index_head_dim_supported" in kernels["L0.indexer"]["checks"]


def test_bisect_pins_a_flashmla_sparse_precondition_on_dsa_decode(tmp_path):
    # index_topk 48 is not whole 64-index tiles: FlashMLA's sparse decode
    # (dsa_decode=tiled64) refuses it, the reference form does not.
    model, rec = tmp_path / "m", tmp_path / "rec"
    assert run("make-model", model, "--arch", "glm_moe_dsa", "--index-topk", "48").returncode == 0
    bad, good = tmp_path / "bad.toml", tmp_path / "good.toml"
    bad.write_text('dsa_decode = "tiled64"\nkv_cache_dtype = "fp8_e4m3"\npage_size = 64\n')
    good.write_text('dsa_decode = "reference"\nkv_cache_dtype = "bf16"\npage_size = 16\n')
    r = run("run", model, "--prompt", "Say hello", "--max-new-tokens", "4", "--config", bad, "--record", rec)
    assert "assert/decode/attention/topk_multiple_of_64" in r.stdout + r.stderr
    rep = json.loads(run("replay", rec, "--step", "1", "--json").stdout)
    failed = [k for k in rep["kernels"] if k["failed"]]
    assert failed and "topk_multiple_of_64" in failed[0]["checks"]  # the check that fired is listed
    b = run("bisect", rec, "--good", good, "--bad", bad, "--json")
    assert b.returncode == 0, b.stderr
    result = json.loads(b.stdout)
    assert result["status"] == "culprit_found"
    assert result["culprit"] == {"dsa_decode": "tiled64"}
