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
    f = cr_sglang.extract_step(fb, req_to_token)
    rec = make(tmp_path)
    rec.record_step(0, **f)
    rec.close()
    s = crashreplay.read_capture(rec.path)["step_records"][0]
    assert [r["token_slots"] for r in s["page_table"]] == [[7, 8, 9], [3, 4]]


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
