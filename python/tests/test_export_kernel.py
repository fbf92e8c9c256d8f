"""`crashreplay export-kernel`: one kernel of a replayed step, what a user
attaches to an upstream issue. The scripts it writes run torch's own
operation on the exported tensors; the oracle is torch's own error
(torch.multinomial's "probability tensor contains ...", index_select's
"index out of range"). The files are checked everywhere; the scripts run
where torch is installed (scripts/test-engines.sh)."""
import json
import os
import subprocess
import sys

import pytest

import crashreplay

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")


def run(*args):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, check=False, timeout=600)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("m") / "model"
    r = run("make-model", d, "--arch", "llama", "--quant", "bf16", "--layers", "2", "--hidden", "64", "--heads", "4",
            "--kv-heads", "2", "--intermediate", "128", "--vocab", "256")
    assert r.returncode == 0, r.stderr
    return d


def corrupt_page_table_session(session, ckpt):
    """As the sglang adapter records (token slots, page_size 16): one request's
    16-token prompt in page 1; at the decode step its page-table row's first
    page is 99, outside a pool of 256 tokens (16 pages): the decode writes
    its new token in page 2 (fine) and attention reads page 99."""
    rec = crashreplay.Recorder(str(session), engine="sglang", engine_version="0.5.23", session_id="s",
                               toggles=[("page_size", 16), ("tp_size", 1), ("sglang.page_table_unit", "token"),
                                        ("max_total_tokens", 256)],
                               model={"checkpoint_path": str(ckpt)},
                               device={"name": "NVIDIA H100 80GB HBM3", "sm_arch": 90,
                                       "memory_capacity_bytes": 80_000_000_000},
                               install_signal_handlers=False)
    greedy = {"temperatures": [0.0], "top_ps": [1.0], "top_ks": [-1], "min_ps": [0.0]}
    prompt = list(range(16, 32))
    rec.record_step(0, mode="extend", request_ids=["req-1"], token_ids=list(range(1, 17)), positions=list(range(16)),
                    seq_lens=[16], extend_lens=[16], req_pool_indices=[0], page_table=[prompt], out_cache_loc=prompt,
                    sampling=greedy)
    row = [99 * 16 + j for j in range(16)] + [32]
    rec.record_step(1, mode="decode", request_ids=["req-1"], token_ids=[5], positions=[16], seq_lens=[17],
                    extend_lens=[1], req_pool_indices=[0], page_table=[row], out_cache_loc=[32], sampling=greedy)
    rec.close()


def test_a_paged_attention_index_failure_exports_the_page_tables_and_a_gather_that_shows_the_index(model, tmp_path):
    corrupt_page_table_session(tmp_path / "rec", model)
    rep = json.loads(run("replay", tmp_path / "rec", "--json").stdout)
    assert rep["outcome"] == "failed" and rep["signature"]["check"] == "page_index_in_pool"
    assert rep["fault"]["layer"] == 0 and rep["signature"]["kernel"] == "attention"
    r = run("export-kernel", tmp_path / "rec", "--kernel", "L0.attention", "-o", tmp_path / "x", "--json")
    assert r.returncode == 0, r.stderr
    params = json.loads(r.stdout)
    assert params == json.loads((tmp_path / "x" / "params.json").read_text())
    assert params["step"] == 1 and params["pool_pages"] == rep["fault"]["value"] and params["page_size"] == 16
    (row,) = params["rows"]
    assert row["request"] == "req-1" and row["page_table"][0] == 99 and row["start_pos"] == 16
    assert "token_ids" not in json.dumps(params)  # the prompt stays home
    assert not (tmp_path / "x" / ".dump").exists()
    torch = pytest.importorskip("torch")
    s = subprocess.run([sys.executable, tmp_path / "x" / "repro.py"], capture_output=True, text=True, timeout=300)
    assert s.returncode != 0
    assert "IndexError" in s.stderr and "index out of range" in s.stderr, s.stderr[-2000:]
    assert torch is not None


def test_a_kernel_without_a_library_call_exports_its_tensors_and_says_so(model, tmp_path):
    r = run("run", model, "--prompt-ids", "1,2,3", "--max-new-tokens", "2", "--record", tmp_path / "rec")
    assert r.returncode == 0, r.stderr
    r = run("export-kernel", tmp_path / "rec", "--kernel", "L1.o_proj", "-o", tmp_path / "x")
    assert r.returncode == 0, r.stderr
    from safetensors.numpy import load_file

    t = load_file(str(tmp_path / "x" / "tensors.safetensors"))
    assert list(t) and all(not k.startswith("L1.") for k in t)
    assert "No library call is mapped" in (tmp_path / "x" / "repro.py").read_text()
    bad = run("export-kernel", tmp_path / "rec", "--kernel", "L9.nothing", "-o", tmp_path / "y")
    assert bad.returncode == 2 and "L9.nothing" in bad.stderr


def test_a_sampler_failure_on_nan_probabilities_raises_torchs_own_error(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import crashreplay.transformers as crt

    # A random 4-layer llama in float16 whose layer 2 MLP overflows (as in
    # test_transformers_engine.py): generate() dies in sampling.
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=300, max_position_embeddings=256)
    m = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        m.model.layers[2].mlp.up_proj.weight.mul_(2.0 ** 8)
        m.model.layers[2].mlp.down_proj.weight.mul_(2.0 ** 16)
    m.to(torch.float16).save_pretrained(tmp_path / "ckpt")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="probability tensor contains"):
        with crt.record(model, str(tmp_path / "s"), checkpoint_path=str(tmp_path / "ckpt"),
                        install_signal_handlers=False):
            model.generate(input_ids=torch.tensor([[1, 17, 42, 99, 7, 8, 150, 33]]), do_sample=True,
                           max_new_tokens=4)
    r = run("export-kernel", tmp_path / "s", "--kernel", "sampler", "-o", tmp_path / "x", "--set",
            "activation_dtype=fp16", "--json")
    assert r.returncode == 0, r.stderr
    params = json.loads(r.stdout)
    assert params["signature"]["check"] == "probs_finite"
    s = subprocess.run([sys.executable, tmp_path / "x" / "repro.py"], capture_output=True, text=True, timeout=300)
    assert s.returncode != 0
    assert "probability tensor contains either `inf`, `nan` or element < 0" in s.stderr, s.stderr[-2000:]
