"""Captures shaped as the engine adapters write them, replayed by `crashreplay replay`.

The adapters' own tests over sglang's and vLLM's real classes
(test_adapters_sglang_real.py, test_adapters_vllm_real.py) need the engines
and torch, which CI does not install (torch's wheel and its CUDA libraries
are several GB). These tests run everywhere: they write captures through
crashreplay.Recorder with what the sglang adapter records (token-slot page
rows at page_size 64, UUID request ids, a decode step without extend
lengths as the adapter wrote it before, per-rank files with the weights
hashed in sglang's fused layout) and replay them. The fused layout here is
built with numpy by this file, after sglang's loaders; the real-class test
checks the same replay against sglang's loaders themselves.
Needs CRASHREPLAY_BIN (scripts/test.sh sets it).
"""
import json
import os
import struct
import subprocess

import numpy as np
import pytest

import crashreplay

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
pytestmark = pytest.mark.skipif(not os.path.exists(BIN), reason="needs the crashreplay binary (CRASHREPLAY_BIN)")

H100 = {"name": "NVIDIA H100 80GB HBM3", "sm_arch": 90, "memory_capacity_bytes": 80_000_000_000}
REQ_A = "3f2a9c1e-5b7d-4e8a-9c0f-1a2b3c4d5e6f"
REQ_B = "b7e1d2c3-0000-4e8a-9c0f-ffffffffffff"


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300)


def replay_json(*args):
    r = run("replay", *args, "--json")
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt") / "llama"
    r = run("make-model", str(d), "--arch", "llama", "--quant", "bf16", "--vocab", "300")
    assert r.returncode == 0, r.stderr
    return str(d)


def read_safetensors(path):
    """name -> (dtype, shape, raw bytes as uint8)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        body = f.read()
    return {k: (v["dtype"], v["shape"], np.frombuffer(body[v["data_offsets"][0]:v["data_offsets"][1]], np.uint8))
            for k, v in header.items() if k != "__metadata__"}


def sglang_layout(ckpt, tp, rank):
    """What sglang's loaders hold on `rank` (layers/linear.py, vocab_parallel_embedding.py):
    qkv_proj = rank's rows of q, k, v; gate_up_proj = rank's rows of gate, up;
    o/down_proj = rank's columns; embed/lm_head = the vocabulary padded to 64, split."""
    t = read_safetensors(os.path.join(ckpt, "model.safetensors"))
    cfg = json.load(open(os.path.join(ckpt, "config.json")))

    def m(name):
        _, shape, raw = t[name]
        return raw.view(np.uint16).reshape(shape)

    def rows(a, parts, part):
        n = a.shape[0] // parts
        return a[part * n:(part + 1) * n]

    def cols(a, parts, part):
        n = a.shape[1] // parts
        return a[:, part * n:(part + 1) * n]

    kv = cfg["num_key_value_heads"]
    kv_parts, kv_part = (tp, rank) if kv >= tp else (kv, rank * kv // tp)
    out = {}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out[p + "self_attn.qkv_proj.weight"] = np.concatenate([
            rows(m(p + "self_attn.q_proj.weight"), tp, rank), rows(m(p + "self_attn.k_proj.weight"), kv_parts, kv_part),
            rows(m(p + "self_attn.v_proj.weight"), kv_parts, kv_part)])
        out[p + "self_attn.o_proj.weight"] = np.ascontiguousarray(cols(m(p + "self_attn.o_proj.weight"), tp, rank))
        out[p + "mlp.gate_up_proj.weight"] = np.concatenate([rows(m(p + "mlp.gate_proj.weight"), tp, rank),
                                                             rows(m(p + "mlp.up_proj.weight"), tp, rank)])
        out[p + "mlp.down_proj.weight"] = np.ascontiguousarray(cols(m(p + "mlp.down_proj.weight"), tp, rank))
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out[p + norm + ".weight"] = m(p + norm + ".weight")
    out["model.norm.weight"] = m("model.norm.weight")
    vocab = cfg["vocab_size"]
    per = -(-vocab // 64) * 64 // tp
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        padded = np.zeros((per * tp, cfg["hidden_size"]), np.uint16)
        padded[:vocab] = m(name)
        out[name] = padded[rank * per:(rank + 1) * per]
    return out


def record_session(session, ckpt, *, tp=2, weights=True, corrupt=None, extra=None, toggles=(), model=None):
    """Two requests, prefill then four decode steps, as the sglang adapter
    records them at page_size 64 (KV slots = page * 64 + offset)."""
    base = [("page_size", 64), ("tp_size", tp), ("mem_fraction_static", 0.85), ("sglang.page_table_unit", "token"),
            ("attention_backend", "flashinfer"), ("max_total_tokens", 4096), ("max_prefill_tokens", 2048)]
    prompt_a, prompt_b = list(range(1, 63)), [5, 6, 7]
    for rank in range(tp):
        rec = crashreplay.Recorder(str(session), engine="sglang", engine_version="0.5.23", session_id="s",
                                   toggles=base + list(toggles), model={"checkpoint_path": ckpt, **(model or {})}, device=H100,
                                   parallel={"tp_size": tp, "tp_rank": rank, "rank": rank, "world_size": tp},
                                   install_signal_handlers=False)
        if weights:
            w = sglang_layout(ckpt, tp, rank)
            if corrupt is not None and corrupt[0] == rank:
                w[corrupt[1]] = w[corrupt[1]].copy()
                w[corrupt[1]].reshape(-1)[0] ^= 1
            w.update(extra or {})
            rec.record_weight_hashes(w)
        # Request A holds KV page 2 (slots 128..191) and later page 3; B page 1.
        slots_a, slots_b = list(range(128, 128 + 62)), list(range(64, 67))
        rec.record_step(0, mode="extend", request_ids=[REQ_A, REQ_B], token_ids=prompt_a + prompt_b,
                        positions=list(range(62)) + [0, 1, 2], seq_lens=[62, 3], extend_lens=[62, 3],
                        req_pool_indices=[1, 2], page_table=[slots_a, slots_b], out_cache_loc=slots_a + slots_b,
                        sampling={"temperatures": [0.0, 0.8], "top_ps": [1.0, 1.0], "top_ks": [-1, -1],
                                  "min_ps": [0.0, 0.0], "seeds": [None, 42]}, rng_seed=1234, rng_offset=0)
        for step in range(1, 5):
            slots_a.append(128 + len(slots_a) if len(slots_a) < 64 else 192 + len(slots_a) - 64)
            slots_b.append(64 + len(slots_b))
            # no extend_lens: what the adapter recorded for decode steps before
            rec.record_step(step, mode="decode", request_ids=[REQ_A, REQ_B], token_ids=[step, 2 * step],
                            positions=[len(slots_a) - 1, len(slots_b) - 1], seq_lens=[len(slots_a), len(slots_b)],
                            req_pool_indices=[1, 2], page_table=[list(slots_a), list(slots_b)],
                            out_cache_loc=[slots_a[-1], slots_b[-1]],
                            sampling={"temperatures": [0.0, 0.8], "top_ps": [1.0, 1.0], "top_ks": [-1, -1],
                                      "min_ps": [0.0, 0.0], "seeds": [None, 42]}, rng_seed=1234, rng_offset=4 * step)
        rec.close()
    return str(session)


def test_an_sglang_tp2_session_replays_from_either_rank_with_every_weight_verified(tmp_path, checkpoint):
    session = record_session(tmp_path / "s", checkpoint)
    for path in (session, os.path.join(session, "rank-00001.crcap")):
        j = replay_json(path)
        assert j["outcome"] == "reproduced", j
        assert j["weights"] == "verified 30 tensors of 2 ranks (sglang layout)"
        # sglang's words through the engine vocabulary: flashinfer is split-KV decode on an sm_90 device
        assert j["config"]["page_size"] == "64" and j["config"]["tp_size"] == "2"
        assert j["config"]["max_total_tokens"] == "4096" and float(j["config"]["device_memory_gb"]) == 80
        assert j["config"]["attention_backend"] == "flashdecode" and j["config"]["attention_kernel"] == "flashinfer"
        assert j["config"]["device_arch"] == "sm_90"
        assert not any("attention_backend" in n for n in j.get("notes", [])), j.get("notes")


@pytest.mark.parametrize("dtype,config_dtype,want", [("bfloat16", None, "bf16"), ("float16", None, "fp16"),
                                                     ("auto", "float16", "fp16"), ("float32", None, "fp32")])
def test_activations_are_stored_in_the_dtype_the_engine_ran(tmp_path, checkpoint, dtype, config_dtype, want):
    model = {"dtype": dtype}
    if config_dtype:
        cfg = json.load(open(os.path.join(checkpoint, "config.json")))
        cfg["torch_dtype"] = config_dtype
        model["config_json"] = json.dumps(cfg)
    session = record_session(tmp_path / "s", checkpoint, tp=1, weights=False, model=model)
    j = replay_json(session)
    assert j["config"]["activation_dtype"] == want
    assert any("activation_dtype" in n for n in j.get("notes", [])) == (want != "fp32"), j.get("notes")
    # The user's --set wins over the recorded dtype.
    assert replay_json(session, "--set", "activation_dtype=fp32")["config"]["activation_dtype"] == "fp32"


def test_token_slot_rows_become_pages_and_need_pages_of_the_replayed_size(tmp_path, checkpoint):
    session = record_session(tmp_path / "s", checkpoint, weights=False)
    # 64-token pages hold whole 16-token pages: the rows can be cut finer.
    assert replay_json(session, "--set", "page_size=16")["outcome"] == "reproduced"
    r = run("replay", session, "--set", "page_size=128")  # slot 64 starts no 128-token page
    assert r.returncode == 2, r.stderr
    assert f"request '{REQ_B}'" in r.stderr and "KV slot 64" in r.stderr and "a page of 128 tokens" in r.stderr


def test_a_weight_that_differs_names_the_rank_the_tensor_and_both_hashes(tmp_path, checkpoint):
    name = "model.layers.1.self_attn.qkv_proj.weight"
    session = record_session(tmp_path / "s", checkpoint, corrupt=(1, name))
    r = run("replay", session)
    assert r.returncode == 3, r.stderr
    assert f"rank 1 tensor '{name}'" in r.stderr
    assert "model.layers.1.self_attn.q_proj.weight, model.layers.1.self_attn.k_proj.weight" in r.stderr
    assert r.stderr.count("the recording has ") == 1 and "the checkpoint gives " in r.stderr


def test_a_tensor_that_cannot_be_mapped_is_listed(tmp_path, checkpoint):
    extra = {"model.layers.0.mlp.gate_up_proj.weight_scale": np.ones(4, np.float32),
             "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(8, np.float32)}
    j = replay_json(record_session(tmp_path / "s", checkpoint, extra=extra))
    assert j["outcome"] == "reproduced"
    w = j["weights"]
    assert w.startswith("verified 30 tensors of 2 ranks (sglang layout); 4 not mapped: "), w
    assert "rank 0 'model.layers.0.mlp.gate_up_proj.weight_scale': a quantization scale" in w
    assert "rank 1 'model.layers.0.self_attn.rotary_emb.inv_freq': no sglang layout known" in w


def test_a_missing_rank_file_is_said_not_verified(tmp_path, checkpoint):
    session = record_session(tmp_path / "s", checkpoint)
    os.remove(os.path.join(session, "rank-00001.crcap"))
    j = replay_json(session)
    assert j["weights"] == "verified 15 tensors of 1 rank (sglang layout); rank 1 has no capture file here, not verified"


def test_decode_graphs_are_planned_no_larger_than_the_request_pool(tmp_path, checkpoint):
    # An sglang server on an 80 GB card at mem_fraction_static 0.88 with
    # cuda_graph_max_bs 256 captures graphs up to its request pool (64
    # requests here); planning 256 graph slots was an OOM it never had.
    common = [("cuda_graph_max_bs", 256), ("mem_fraction_static", 0.88)]
    session = record_session(tmp_path / "s", checkpoint, weights=False, toggles=common)
    j = replay_json(session)
    assert j["outcome"] == "reproduced", j
    # With a pool of 256 requests the same graphs do not fit: the check is live.
    j = replay_json(session, "--set", "max_running_requests=256")
    assert j["outcome"] == "failed" and j["signature"]["check"] == "graph_memory_fits"


def test_request_ids_that_are_not_numbers_stay_distinct(tmp_path, checkpoint):
    # sglang's UUIDs (and vLLM's "cmpl-...") once all became request 0.
    session = record_session(tmp_path / "s", checkpoint, weights=False)
    r = run("replay", session, "--dump", str(tmp_path / "dump"), "--dump-kernels", "embedding")
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "dump" / "step4.rank0.safetensors", "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    ids = json.loads(header["__metadata__"]["request_ids"])
    assert len(ids) == 2 and len(set(ids)) == 2 and 0 not in ids


def test_a_session_whose_rank_0_left_no_file_replays_from_its_lowest_rank(tmp_path, checkpoint):
    session = record_session(tmp_path / "s", checkpoint)
    os.remove(os.path.join(session, "rank-00000.crcap"))
    j = replay_json(session)
    assert j["outcome"] == "reproduced"
    assert j["weights"] == "verified 15 tensors of 1 rank (sglang layout); rank 0 has no capture file here, not verified"
