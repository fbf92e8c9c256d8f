"""What `crashreplay run` does with checkpoints it must not run: a config that
disagrees with its weights exits 3 naming the tensor and both shapes; a
valid model the engine does not implement exits 9 (unsupported) saying what
is not supported. Nothing runs, nothing is written.
"""
import json
import os
import shutil
import subprocess

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIDELITY = os.path.join(ROOT, "tests", "data", "fidelity")
EXIT_DATA_ERROR = 3
EXIT_UNSUPPORTED = 9


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, check=False)


def edit_config(model_dir, **changes):
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        c = json.load(f)
    for k, v in changes.items():
        if v is None:
            c.pop(k, None)
        else:
            c[k] = v
    with open(path, "w") as f:
        json.dump(c, f)


def test_head_dim_absent_from_a_glm4_moe_config_is_a_mismatch_naming_the_tensor(tmp_path):
    # Weights with head_dim 32 (4 heads x 32 = 128 rows), a config without
    # head_dim: transformers' Glm4MoeConfig derives hidden/heads = 16.
    model = str(tmp_path / "m")
    assert run("make-model", model, "--arch", "glm4_moe", "--head-dim", "32").returncode == 0
    edit_config(model, head_dim=None)
    r = run("run", model, "--prompt-ids", "1,2,3", "--max-new-tokens", "1")
    assert r.returncode == EXIT_DATA_ERROR, r.stderr
    assert ("tensor 'model.layers.0.self_attn.q_proj.weight' has shape [128, 64], config.json (glm4_moe) "
            "implies [64, 64] (num_attention_heads 4 x head_dim 16 x hidden_size 64)") in r.stderr
    assert r.stdout == ""


def test_a_bias_the_config_does_not_have_is_a_mismatch(tmp_path):
    model = str(tmp_path / "m")
    shutil.copytree(os.path.join(FIDELITY, "llama_tied_hd48"), model)
    edit_config(model, attention_bias=False)  # the file has q/k/v/o biases
    r = run("run", model, "--prompt-ids", "1,2,3", "--max-new-tokens", "1")
    assert r.returncode == EXIT_DATA_ERROR
    assert "gives this projection no bias (attention_bias is false)" in r.stderr


def test_unknown_model_type_is_unsupported(tmp_path):
    model = str(tmp_path / "m")
    shutil.copytree(os.path.join(FIDELITY, "qwen3"), model)
    edit_config(model, model_type="qwen3_5_moe")
    r = run("run", model, "--prompt-ids", "1,2,3", "--max-new-tokens", "1")
    assert r.returncode == EXIT_UNSUPPORTED, r.stderr
    assert "model_type 'qwen3_5_moe' is not supported (supported: llama, mistral" in r.stderr


def test_dynamic_rope_and_mla_with_attention_biases_are_unsupported(tmp_path):
    model = str(tmp_path / "m")
    shutil.copytree(os.path.join(FIDELITY, "llama_llama3_rope"), model)
    edit_config(model, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    r = run("run", model, "--prompt-ids", "1,2,3", "--max-new-tokens", "1")
    assert r.returncode == EXIT_UNSUPPORTED, r.stderr
    assert "unsupported model: " in r.stderr and "RoPE type 'dynamic' is not implemented" in r.stderr
    mla = str(tmp_path / "mla")
    assert run("make-model", mla, "--arch", "deepseek_v3").returncode == 0
    edit_config(mla, attention_bias=True)
    r = run("run", mla, "--prompt-ids", "1,2,3", "--max-new-tokens", "1")
    assert r.returncode == EXIT_UNSUPPORTED, r.stderr
    assert "unsupported model: " in r.stderr and "deepseek_v3 with attention_bias true" in r.stderr


def test_mla_weights_are_checked_against_the_config(tmp_path):
    # kv_lora_rank says 256, the latent projection holds 512 + 64 rows.
    model = str(tmp_path / "m")
    assert run("make-model", model, "--arch", "glm_moe_dsa").returncode == 0
    edit_config(model, kv_lora_rank=256)
    r = run("run", model, "--prompt-ids", "1,2,3", "--max-new-tokens", "1")
    assert r.returncode == EXIT_DATA_ERROR, r.stderr
    assert ("tensor 'model.layers.0.self_attn.kv_a_proj_with_mqa.weight' has shape [576, 64], config.json "
            "(glm_moe_dsa) implies [320, 64] (kv_lora_rank 256 + qk_rope_head_dim 64 x hidden_size 64)") in r.stderr
    # The indexer's query projection against index_n_heads x index_head_dim.
    edit_config(model, kv_lora_rank=512, indexer_types=["full", "full"], index_head_dim=128)
    r = run("run", model, "--prompt-ids", "1,2,3", "--max-new-tokens", "1")
    assert r.returncode == EXIT_DATA_ERROR, r.stderr
    assert "'model.layers.0.self_attn.indexer.wq_b.weight' has shape [1024, 96]" in r.stderr
    assert "index_n_heads 16 x index_head_dim 128" in r.stderr
