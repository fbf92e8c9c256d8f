"""torch tensors through the recorder (CPU only; skipped without torch).

torch is not part of CI (its PyPI wheel is a CUDA build of several GB with
its NVIDIA libraries); these tests run where torch is installed. CUDA
tensors (crashreplay.cuda_staging) need a GPU and are not tested here.
"""
import numpy as np
import pytest

import crashreplay
from crashreplay import sglang as cr_sglang

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")


def make(tmp_path):
    return crashreplay.Recorder(str(tmp_path / "t.crcap"), engine="torch-unit", install_signal_handlers=False)


def test_torch_cpu_snapshots_round_trip_byte_exact(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "bf16": torch.randn(4, 6, generator=g).to(torch.bfloat16),
        "fp8": torch.randn(16, generator=g).to(torch.float8_e4m3fn),
        "i32": torch.arange(10, dtype=torch.int32),
        "transposed": torch.randn(3, 5, generator=g).t(),  # non-contiguous: made contiguous
        "param": torch.nn.Parameter(torch.ones(3)),      # requires_grad: detached, not copied
    }
    rec = make(tmp_path)
    rec.snapshot(0, tensors)
    rec.on_failure("x", step=0)
    rec.close()
    cap = crashreplay.read_capture(rec.path)
    by_name = {d["name"]: d for d in cap["snapshot_records"][0]["tensors"]}
    assert by_name["bf16"]["dtype"] == "BF16" and by_name["fp8"]["dtype"] == "F8_E4M3"
    f = crashreplay.CaptureFile(rec.path)
    for name, t in tensors.items():
        want = t.detach().contiguous()
        got = crashreplay.load_tensor(f, by_name[name])
        assert list(got.shape) == list(want.shape), name
        assert got.tobytes() == want.view(torch.uint8).numpy().tobytes(), name


def test_torch_step_fields_are_converted_to_int64(tmp_path):
    rec = make(tmp_path)
    rec.record_step(0, mode="decode", token_ids=torch.tensor([5, 6], dtype=torch.int32),
                    seq_lens=torch.tensor([3, 4]), req_pool_indices=torch.tensor([0, 1], dtype=torch.int32),
                    page_table={"rows": torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7]], dtype=torch.int32),
                                "lengths": torch.tensor([3, 4])},
                    sampling={"temperatures": torch.tensor([[0.5], [1.0]]), "top_ps": torch.ones(2),
                              "top_ks": torch.tensor([1, 2], dtype=torch.int32), "min_ps": torch.zeros(2)})
    rec.close()
    s = crashreplay.read_capture(rec.path)["step_records"][0]
    assert s["token_ids"] == [5, 6] and s["seq_lens"] == [3, 4]
    assert [r["token_slots"] for r in s["page_table"]] == [[1, 2, 3], [4, 5, 6, 7]]
    assert [p["temperature"] for p in s["sampling"]] == [0.5, 1.0]


def test_sglang_extraction_with_torch_tensors(tmp_path):
    class FakeMode:  # stand-in for an sglang ForwardMode member
        name = "DECODE"

    req_to_token = torch.tensor([[7, 8, 9, 0], [3, 4, 0, 0]], dtype=torch.int32)
    fb = type("FakeForwardBatch", (), dict(
        forward_mode=FakeMode(), input_ids=torch.tensor([11, 12]), positions=torch.tensor([2, 1]),
        seq_lens=torch.tensor([3, 2]), seq_lens_cpu=torch.tensor([3, 2]), req_pool_indices=torch.tensor([0, 1]),
        out_cache_loc=torch.tensor([9, 4]), sampling_info=None))()
    # Whole rows (page_deltas=False, as with snapshot_kv), then the default:
    # a DECODE batch's rows as deltas, out_cache_loc from column seq_len - 1,
    # which with no earlier row recorded stay incomplete and say where they start.
    (tmp_path / "False").mkdir()
    (tmp_path / "True").mkdir()
    for deltas, want in ((False, [([7, 8, 9], None), ([3, 4], None)]), (True, [([9], 2), ([4], 1)])):
        f = cr_sglang.extract_step(fb, req_to_token, page_deltas=deltas)
        rec = make(tmp_path / str(deltas))
        rec.record_step(0, **f)
        rec.close()
        s = crashreplay.read_capture(rec.path)["step_records"][0]
        assert [(r["token_slots"], r.get("start")) for r in s["page_table"]] == want, deltas


def test_weight_hashes_of_a_torch_module(tmp_path):
    from crashreplay._adapter_common import named_parameters

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    rec = make(tmp_path)
    got = rec.record_weight_hashes(named_parameters(model))
    rec.close()
    assert set(got["tensors"]) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    w = model[0].weight.detach().numpy()
    assert got["tensors"]["0.weight"]["hash"] == crashreplay.hash_bytes(w.tobytes())


def test_fingerprint_hooks_pass_tensors_by_address_with_the_same_records_as_dlpack(tmp_path):
    # The hooks' flush hands host tensors to the recorder by address
    # (_fingerprints_at); every dtype it names, a view that needs a copy
    # (rows=) and an empty tensor give the same records as
    # Recorder.fingerprints over DLPack. A dtype it has no name for goes
    # through Recorder.fingerprints, whose error names the boundary.
    from crashreplay import read_capture
    from crashreplay._fingerprint_hooks import FingerprintHooks

    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, 24, generator=g) * 100
    x[1, 2, 7] = float("nan")
    x[2, 4, 1] = float("inf")
    tensors = [("f32", x, None), ("bf16", x.to(torch.bfloat16), None), ("f16", (x * 1e3).to(torch.float16), None),
               ("e4m3", x.clamp(-400, 400).to(torch.float8_e4m3fn), None),
               ("i64", torch.randint(-9, 1 << 40, (4, 8), generator=g), None),
               ("i32", torch.randint(0, 300, (16,), generator=g, dtype=torch.int32), None),
               ("last_rows", x, lambda t: t[:, -1, :]), ("empty", torch.zeros(0, 4), None)]
    rec = make(tmp_path)
    hooks = FingerprintHooks(rec)
    hooks.step = 0
    for name, t, rows in tensors:
        hooks._note(name, t, rows)
    hooks.flush()
    rec.fingerprints([(n, rows(t) if rows else t) for n, t, rows in tensors], step=1)
    hooks.step = 2
    hooks._note("complex", torch.zeros(4, dtype=torch.complex64), None)
    with pytest.raises(Exception, match="complex"):
        hooks.flush()
    rec.close()
    by_address, by_dlpack = read_capture(str(tmp_path / "t.crcap"))["fingerprints"][:2]
    assert [f["name"] for f in by_address["fingerprints"]] == [n for n, _, _ in tensors]
    assert by_address["fingerprints"] == by_dlpack["fingerprints"]
    got = {f["name"]: f for f in by_address["fingerprints"]}
    # [3, 5, 24] is 15 rows of 24: the NaN at [1, 2, 7] is row 7, column 7.
    assert got["f32"]["nan"] == 1 and got["f32"]["pos_inf"] == 1 and got["f32"]["first_nonfinite"] == (7, 7)
    assert got["last_rows"]["numel"] == 3 * 24 and got["last_rows"]["pos_inf"] == 1 and got["last_rows"]["nan"] == 0
    assert got["empty"]["numel"] == 0 and got["i64"]["is_int"] and got["i64"]["max"] < (1 << 40)


def test_the_dsa_indexers_top_k_is_fingerprinted_as_its_own_boundary(tmp_path):
    # install_engine_boundaries on a decoder laid out as sglang's DeepSeek/GLM-5
    # models are (model.layers[n].self_attn.indexer): an indexer with a forward
    # of its own (sglang's Indexer) is hooked as L{n}.indexer_slots, its int32
    # top-k's range read back (a slot past the pool is visible); an output of
    # None (sglang's dense short-prefill path) records nothing; an indexer
    # module without a forward (vLLM's DeepseekV32Indexer, never called) is
    # not hooked. The real Indexer needs CUDA: test_adapters_sglang_real checks
    # that its class and attribute are where this reads them.
    from crashreplay._fingerprint_hooks import FingerprintHooks, install_engine_boundaries

    class TopK(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.out = None

        def forward(self, x, **kwargs):
            return self.out

    class Attn(torch.nn.Module):
        def __init__(self, indexer):
            super().__init__()
            self.indexer = indexer

        def forward(self, x):
            self.indexer(x=x, layer_id=0)
            return x

    class Layer(torch.nn.Module):
        def __init__(self, indexer):
            super().__init__()
            self.self_attn = Attn(indexer)

        def forward(self, x):
            return self.self_attn(x)

    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Layer(TopK()), Layer(torch.nn.Module())])

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Inner()

    m = Model()
    rec = make(tmp_path)
    hooks = FingerprintHooks(rec)
    assert install_engine_boundaries(hooks, m, tp_size=2) == ["L0.indexer_slots"]
    ix = m.model.layers[0].self_attn.indexer
    x = torch.zeros(3, 4)
    for step, out in enumerate((torch.tensor([[5, 9, -1, -1], [5, 9, 70000, -1], [5, 9, 12, 3]], dtype=torch.int32),
                                None)):
        hooks.step, hooks.mode = step, "decode"
        ix.out = out
        m.model.layers[0](x)
        hooks.flush()
    rec.close()
    (r,) = crashreplay.read_capture(rec.path)["fingerprints"]
    (f,) = r["fingerprints"]
    assert (r["step"], f["name"], f["dtype"], f["is_int"]) == (0, "L0.indexer_slots", "I32", True)
    assert (f["min"], f["max"], f["numel"], f["columns"]) == (-1, 70000, 12, 4)


def test_wrapped_forwards_record_what_hooks_record_and_unwind(tmp_path):
    # FingerprintHooks(wrap_forward=True) (crashreplay.transformers' choice:
    # torch's module call keeps its fast path) records the same boundaries as
    # torch hooks, and remove() gives each module its own forward back; the
    # same under torch.inference_mode (vLLM's workers run in it), whose
    # tensors have no version counter: they are summarised at once.
    from crashreplay._fingerprint_hooks import FingerprintHooks

    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(3, 8)
    got = {}
    for wrap in (False, True):
        for mode in ("no_grad", "inference_mode"):
            d = tmp_path / f"{wrap}-{mode}"
            d.mkdir()
            rec = make(d)
            hooks = FingerprintHooks(rec, wrap_forward=wrap)
            hooks.input(lin, "L0.attention")
            hooks.output(lin, "L0.o_proj")
            assert ("forward" in vars(lin)) == wrap and bool(lin._forward_hooks) != wrap
            hooks.step = 0
            with getattr(torch, mode)():
                lin(x)
            hooks.flush()
            hooks.remove()
            assert "forward" not in vars(lin) and not lin._forward_hooks and not lin._forward_pre_hooks
            rec.close()
            (r,) = crashreplay.read_capture(rec.path)["fingerprints"]
            got[wrap, mode] = r["fingerprints"]
    assert [f["name"] for f in got[True, "no_grad"]] == ["L0.attention", "L0.o_proj"]
    for key in got:
        assert got[key] == got[True, "no_grad"], key
