"""crashreplay.Recorder with real numpy tensors, read back through the C++ reader."""
import os

import numpy as np
import pytest

import crashreplay

ml_dtypes = pytest.importorskip("ml_dtypes")


def make(tmp_path, **kw):
    return crashreplay.Recorder(str(tmp_path / "cap.crcap"), engine="unit", engine_version="0",
                                install_signal_handlers=False, overwrite=True, **kw)


def test_config_becomes_typed_sorted_toggles_in_the_manifest(tmp_path):
    class Backend:  # an enum-like value is recorded by its string form
        def __str__(self):
            return "fa3"

    cfg = {"mem_fraction_static": 0.88, "tp_size": 8, "disable_cuda_graph": False, "quantization": None,
           "attention_backend": Backend(), "cuda_graph_bs": [1, 2, 4], "moe": {"runner": "deep_gemm"}}
    with make(tmp_path, config=cfg, parallel={"tp_size": 8, "rank": 0}) as rec:
        path = rec.path
    m = crashreplay.read_capture(path)["manifest"]
    assert m["toggles"] == {"attention_backend": "fa3", "cuda_graph_bs": "[1, 2, 4]", "disable_cuda_graph": False,
                            "mem_fraction_static": 0.88, "moe.runner": "deep_gemm", "quantization": None,
                            "tp_size": 8}
    assert isinstance(m["toggles"]["tp_size"], int) and isinstance(m["toggles"]["disable_cuda_graph"], bool)
    assert m["engine"] == "unit" and m["parallel"]["tp_size"] == 8
    assert m["device"]["name"] == "cpu"  # no GPU here, and torch is not imported


def test_unknown_manifest_key_is_rejected_by_name(tmp_path):
    with pytest.raises(ValueError, match="manifest.parallel: unknown key 'tp'"):
        make(tmp_path, parallel={"tp": 2})


def test_step_log_round_trips_every_field(tmp_path):
    with make(tmp_path) as rec:
        rec.record_step(7, mode="extend", request_ids=["a", "b"], token_ids=np.array([5, 6, 7], np.int32),
                        positions=[0, 1, 0], seq_lens=np.array([2, 1]), extend_lens=[2, 1],
                        req_pool_indices=[3, 9], page_table={"rows": np.array([[10, 11, 99], [12, 98, 97]]),
                                                             "lengths": [2, 1]},
                        out_cache_loc=[10, 11, 12],
                        sampling=[{"temperature": 0.0, "top_k": 1, "seed": 5}, {"top_p": 0.5, "min_p": 0.1}],
                        rng_seed=11, rng_offset=4, output_token_ids=[42, 43],
                        digests={"logits": 123, "hidden": "0123456789abcdef0123456789abcdef"})
        path = rec.path
    s = crashreplay.read_capture(path)["step_records"][0]
    assert (s["step"], s["mode"], s["request_ids"]) == (7, "extend", ["a", "b"])
    assert s["token_ids"] == [5, 6, 7] and s["positions"] == [0, 1, 0] and s["seq_lens"] == [2, 1]
    assert s["page_table"] == [{"req_pool_index": 3, "token_slots": [10, 11]},
                               {"req_pool_index": 9, "token_slots": [12]}]
    assert s["sampling"][0]["top_k"] == 1 and s["sampling"][0]["seed"] == 5
    assert s["sampling"][1]["seed"] is None and abs(s["sampling"][1]["min_p"] - 0.1) < 1e-6
    assert (s["rng_seed"], s["rng_offset"], s["output_token_ids"]) == (11, 4, [42, 43])
    assert s["digests"] == {"logits": 123, "hidden": "0123456789abcdef0123456789abcdef"}


def test_request_ids_of_any_sequence_are_read_as_text(tmp_path):
    # Strings are read in place (non-ASCII as UTF-8); other items go through
    # str(); any iterable is accepted; the arrays as given are not copied.
    ids = np.arange(3, dtype=np.int64)
    with make(tmp_path) as rec:
        rec.record_step(0, mode="decode", request_ids=["chatcmpl-ü", "запрос", "請求-🙂"], token_ids=ids)
        rec.record_step(1, mode="decode", request_ids=(7, None, b"x"), token_ids=ids)
        rec.record_step(2, mode="decode", request_ids=(f"g{i}" for i in range(3)), token_ids=ids)
        rec.record_step(3, mode="decode", request_ids=np.array(["a", "bb", ""]), token_ids=ids)
        with pytest.raises(TypeError, match="request_ids must be a sequence of str"):
            rec.record_step(4, mode="decode", request_ids=5, token_ids=ids)
        with pytest.raises(UnicodeEncodeError):  # a lone surrogate has no UTF-8
            rec.record_step(4, mode="decode", request_ids=["ok", "\ud800"], token_ids=ids)
        path = rec.path
    steps = crashreplay.read_capture(path)["step_records"]
    assert [s["request_ids"] for s in steps] == [["chatcmpl-ü", "запрос", "請求-🙂"], ["7", "None", "b'x'"],
                                                 ["g0", "g1", "g2"], ["a", "bb", ""]]


def test_a_step_larger_than_the_queue_arena_grows_it_instead_of_spilling(tmp_path):
    # step_queue_bytes is the minimum (64 KiB): a 256-row page table (128 KiB)
    # does not fit; with the queue empty the arena grows, so nothing spills,
    # and stats() says so.
    rows = np.arange(256 * 64, dtype=np.int64).reshape(256, 64)
    with make(tmp_path, step_queue_bytes=64 << 10) as rec:
        rec.record_step(0, mode="decode", token_ids=np.arange(256), page_table=rows)
        rec.flush()
        assert rec.stats()["steps_spilled"] == 0
        path = rec.path
    s = crashreplay.read_capture(path)["step_records"][0]
    assert s["page_table"][255]["token_slots"] == list(range(255 * 64, 256 * 64))
    with pytest.raises(ValueError, match="options.step_queue_bytes"):
        make(tmp_path, step_queue_bytes=-1)


def test_bad_mode_and_mismatched_sampling_lengths_are_refused(tmp_path):
    with make(tmp_path) as rec:
        with pytest.raises(ValueError, match="mode 'decoding'"):
            rec.record_step(0, mode="decoding")
        with pytest.raises(ValueError, match="one entry per request"):
            rec.record_step(0, mode="decode", sampling={"temperatures": [1.0, 1.0], "top_ps": [1.0]})


def test_snapshots_of_every_dtype_are_written_on_failure_byte_exact(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "ids": rng.integers(0, 1000, 16).astype(np.int64),
        "f32": rng.standard_normal((4, 4)).astype(np.float32),
        "bf16": rng.standard_normal((3, 5)).astype(ml_dtypes.bfloat16),
        "fp8": rng.standard_normal(32).astype(ml_dtypes.float8_e4m3fn),
        "strided": rng.standard_normal((6, 6)).astype(np.float16)[:, ::2],  # made contiguous
        "mask": rng.integers(0, 2, 9).astype(bool),
    }
    with make(tmp_path) as rec:
        rec.snapshot(3, tensors)
        rec.record_step(3, mode="decode")
        rec.on_failure("test failure", stage="decode", step=3)
        path = rec.path
    cap = crashreplay.read_capture(path)
    assert cap["failure_records"][0]["reason"] == "test failure"
    (snap,) = cap["snapshot_records"]
    by_name = {d["name"]: d for d in snap["tensors"]}
    assert by_name["bf16"]["dtype"] == "BF16" and by_name["fp8"]["dtype"] == "F8_E4M3"
    assert by_name["strided"]["shape"] == [6, 3]
    f = crashreplay.CaptureFile(path)
    for name, want in tensors.items():
        got = crashreplay.load_tensor(f, by_name[name])
        assert got.dtype == want.dtype, name
        assert got.tobytes() == np.ascontiguousarray(want).tobytes(), name


def test_weight_hashes_match_hash_tensor_and_are_recorded(tmp_path):
    w = {"layers.0.w": np.arange(64, dtype=np.float32).reshape(8, 8), "embed": np.ones(10, np.float16)}
    with make(tmp_path) as rec:
        got = rec.record_weight_hashes(w)
        path = rec.path
    assert got["tensors"]["embed"]["hash"] == crashreplay.hash_tensor(w["embed"])
    assert got["tensors"]["layers.0.w"]["byte_size"] == 256
    (shard,) = crashreplay.read_capture(path)["weight_hashes"]
    assert shard["root"] == got["root"] and shard["tensors"] == got["tensors"]
    # The root depends on every tensor: change one byte, the root changes.
    w2 = dict(w, embed=np.ones(10, np.float16) * 2)
    assert crashreplay._crashreplay.hash_tensors(0, [(k, v, "") for k, v in w2.items()], 0)["root"] != got["root"]


def test_hash_tensor_is_xxh128_of_the_bytes():
    a = np.arange(100, dtype=np.int32)
    assert crashreplay.hash_tensor(a) == crashreplay.hash_bytes(a.tobytes())


def test_unsupported_dtype_and_closed_recorder_errors_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="has no capture dtype"):
        crashreplay.describe_tensor(np.zeros(3, np.complex64))
    rec = make(tmp_path)
    rec.close()
    rec.close()  # idempotent
    with pytest.raises(crashreplay.Error, match="is closed"):
        rec.record_step(0)


def test_failure_hook_records_once_and_reraises(tmp_path):
    rec = make(tmp_path)

    @rec.failure_hook(stage="prefill")
    def step():
        with rec.failure_hook(step=4, stage="decode"):  # the inner hook wins
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        step()
    rec.close()
    (f,) = crashreplay.read_capture(rec.path)["failure_records"]
    assert (f["step"], f["stage"], f["failure_class"]) == (4, "decode", "exception")


def test_context_manager_records_escaping_exception_and_closes_ok(tmp_path):
    with pytest.raises(KeyError):
        with make(tmp_path) as rec:
            rec.record_step(0, mode="decode")
            raise KeyError("boom")
    cap = crashreplay.read_capture(rec.path)
    assert cap["ok"] and cap["steps"] == 1 and len(cap["failure_records"]) == 1


@pytest.mark.parametrize("text,cls", [
    ("CUDA error: device-side assert triggered", "device-assert"),
    ("torch.AcceleratorError: CUDA error: device-side assert triggered", "device-assert"),
    ("CUDA out of memory. Tried to allocate 20.00 MiB", "out-of-memory"),
    ("RuntimeError: CUDA error: out of memory", "out-of-memory"),
    ("ValueError: bad shape", "exception"),
])
def test_classify_failure_from_text(text, cls):
    assert crashreplay.classify_failure(text) == cls


def test_classify_failure_reads_the_exception_type_and_chained_causes():
    class OutOfMemoryError(RuntimeError):
        pass

    assert crashreplay.classify_failure(OutOfMemoryError("allocation failed")) == "out-of-memory"
    try:
        try:
            raise RuntimeError("CUDA error: device-side assert triggered")
        except RuntimeError as inner:
            raise ValueError("batch failed") from inner
    except ValueError as outer:
        assert crashreplay.classify_failure(outer) == "device-assert"


def test_session_directory_layout_names_the_rank(tmp_path):
    rec = crashreplay.Recorder(str(tmp_path / "sess"), engine="unit", parallel={"tp_size": 2, "tp_rank": 1, "rank": 1},
                               install_signal_handlers=False)
    rec.record_step(0, mode="decode")
    rec.close()
    assert rec.path.endswith("rank-00001.crcap")
    d = crashreplay.read_capture(str(tmp_path / "sess"))
    assert [f["ranks"] for f in d["files"]] == [[1]]


def test_device_tensor_without_torch_is_refused_clearly(tmp_path):
    import sys

    if "torch" in sys.modules:
        pytest.skip("torch is imported: the CUDA staging path would be taken")

    class FakeCudaArray:  # stand-in: a DLPack producer claiming CUDA memory
        def __dlpack_device__(self):
            return (2, 0)

    with make(tmp_path) as rec:
        with pytest.raises(ValueError, match="import torch first"):
            rec.snapshot(0, {"x": FakeCudaArray()})


def test_registered_host_weights_catch_an_in_place_overwrite(tmp_path):
    """A stray write into a registered weight buffer is recorded as corruption."""
    w = {"a": np.arange(4096, dtype=np.float32), "b": np.ones(2048, np.float16)}
    rec = crashreplay.Recorder(str(tmp_path / "w.crcap"), engine="unit", install_signal_handlers=False,
                               weight_chunk_bytes=4096, weight_check_bytes_per_step=4096)
    rec.register_weights(w)
    for step in range(3):
        rec.record_step(step, mode="decode")
    rec.flush()
    w["a"][100] = -1.0  # the "kernel bug": an out-of-bounds write into a weight
    for step in range(3, 3 + 12):
        rec.record_step(step, mode="decode")
    rec.close()
    stats = rec.stats()
    assert stats["weight_bytes"] == 4096 * 4 + 2048 * 2
    cap = crashreplay.read_capture(rec.path)
    bad = [s for r in cap["weight_check_records"] for s in r["slices"] if s["corrupt"]]
    assert bad and bad[0]["tensor"] == "a" and bad[0]["byte_begin"] <= 400 < bad[0]["byte_end"]


@pytest.mark.parametrize("deltas_in_file", [True, False])
def test_page_table_given_as_deltas_reads_back_as_whole_rows(tmp_path, deltas_in_file):
    # A prefill gives two rows whole; each decode step gives one new slot a
    # request ({"starts": ...} and the CSR triple); a retraction cuts a row
    # back. Whatever the file holds, the reader returns the whole rows.
    rows = {3: [10, 11, 12], 9: [20, 21]}
    with make(tmp_path, page_table_deltas=deltas_in_file) as rec:
        rec.record_step(0, mode="extend", req_pool_indices=[3, 9],
                        page_table={"rows": np.array([[10, 11, 12], [20, 21, -1]]), "lengths": [3, 2]})
        for step in range(1, 40):
            new = [100 + step, 200 + step]
            starts = np.array([len(rows[3]), len(rows[9])])
            rows[3].append(new[0])
            rows[9].append(new[1])
            if step % 2:
                pt = {"rows": np.array(new).reshape(2, 1), "lengths": [1, 1], "starts": starts}
            else:
                pt = (np.array([0, 1, 2]), np.array(new), starts)
            rec.record_step(step, mode="decode", req_pool_indices=[3, 9], page_table=pt)
        del rows[9][5:]  # retracted: the whole (shorter) row again
        rec.record_step(40, mode="extend", req_pool_indices=[9], page_table=[np.array(rows[9])])
        stats = rec.stats()
        path = rec.path
    assert stats["page_rows_incomplete"] == 0
    steps = crashreplay.read_capture(path)["step_records"]
    assert len(steps) == 41
    assert steps[39]["page_table"] == [{"req_pool_index": 3, "token_slots": rows[3]},
                                       {"req_pool_index": 9, "token_slots": [20, 21] + [200 + s for s in range(1, 40)]}]
    assert steps[40]["page_table"] == [{"req_pool_index": 9, "token_slots": rows[9]}]
    assert steps[1]["page_table"][0]["token_slots"] == [10, 11, 12, 101]


def test_page_table_deltas_past_what_was_recorded_are_kept_incomplete(tmp_path):
    with make(tmp_path) as rec:
        rec.record_step(0, mode="decode", req_pool_indices=[5], page_table=([0, 1], [77], [30]))
        assert rec.stats()["page_rows_incomplete"] == 1
        with pytest.raises(ValueError, match=r"1 page_table_starts for 2 page-table rows"):
            rec.record_step(1, mode="decode", req_pool_indices=[5, 6], page_table=([0, 1, 2], [78, 79], [31]))
        path = rec.path
    (s,) = crashreplay.read_capture(path)["step_records"]
    assert s["page_table"] == [{"req_pool_index": 5, "token_slots": [77], "start": 30}]


def _step_args(**over):
    """A decode step of 3 requests in the forms record_step's fast path takes (int64/float32 numpy)."""
    i64 = lambda v: np.array(v, dtype=np.int64)  # noqa: E731
    f32 = lambda v: np.array(v, dtype=np.float32)  # noqa: E731
    args = dict(mode="decode", request_ids=["r0", "r1", "r2"], token_ids=i64([5, 6, 7]), positions=i64([3, 1, 4]),
                seq_lens=i64([4, 2, 5]), extend_lens=i64([1, 1, 1]), req_pool_indices=i64([2, 0, 1]),
                page_table={"rows": i64([[10, 11, 12, 13, 0], [20, 21, 0, 0, 0], [30, 31, 32, 33, 34]]),
                            "lengths": i64([4, 2, 5])},
                out_cache_loc=i64([13, 21, 34]),
                sampling={"temperatures": f32([0.7, 1.0, 0.0]), "top_ps": f32([1.0, 0.9, 1.0]),
                          "top_ks": i64([-1, 40, 1]), "min_ps": f32([0.0, 0.05, 0.0]), "seeds": i64([9, 8, 7])},
                rng_seed=11, rng_offset=4, output_token_ids=i64([42, 43, 44]),
                digests={"logits": 123, "hidden": "0123456789abcdef0123456789abcdef"}, timestamp_nanos=1000)
    args.update(over)
    return args


def _fast(rec, step, a):
    return rec._impl._record_step_fast(step, a["mode"], a["request_ids"], a.get("token_ids"), a.get("positions"),
                                       a.get("seq_lens"), a.get("extend_lens"), a.get("req_pool_indices"),
                                       a.get("page_table"), a.get("out_cache_loc"), a.get("sampling"),
                                       a.get("rng_seed", 0), a.get("rng_offset", 0), a.get("output_token_ids"),
                                       a.get("digests"), a.get("timestamp_nanos", 0))


def test_record_steps_fast_path_takes_exact_host_arrays_and_records_what_the_general_path_records(tmp_path):
    # The same step through the buffer-protocol fast path (numpy int64 and
    # float32, as given) and through the general path (lists, int32, the
    # sampling as per-request dicts): identical records. The page table in
    # every form the fast path takes: padded rows cut to their lengths, CSR,
    # CSR with starts, a 2-D block, and padded rows with starts.
    a = _step_args()
    rows = a["page_table"]["rows"]
    csr = (np.array([0, 4, 6, 11]), np.concatenate([rows[0, :4], rows[1, :2], rows[2]]))
    forms = [a["page_table"], csr, (csr[0], csr[1], None), rows[:, :2].copy(), rows[:, :2]]
    general = dict(a, token_ids=[5, 6, 7], positions=np.array([3, 1, 4], np.int32), seq_lens=[4, 2, 5],
                   extend_lens=[1, 1, 1], req_pool_indices=[2, 0, 1], out_cache_loc=[13, 21, 34],
                   output_token_ids=[42, 43, 44],
                   sampling=[{"temperature": 0.7, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "seed": 9},
                             {"temperature": 1.0, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 8},
                             {"temperature": 0.0, "top_p": 1.0, "top_k": 1, "min_p": 0.0, "seed": 7}])
    with make(tmp_path, page_table_deltas=False) as rec:
        for i, pt in enumerate(forms):
            assert _fast(rec, 2 * i, dict(a, page_table=pt)) is True
            rec.record_step(2 * i + 1, **dict(general, page_table=[list(r) for r in
                                                                    (pt[:, :] if isinstance(pt, np.ndarray) else
                                                                     [rows[0, :4], rows[1, :2], rows[2]])]))
        path = rec.path
    steps = crashreplay.read_capture(path)["step_records"]
    assert len(steps) == 2 * len(forms)
    for fast, slow in zip(steps[::2], steps[1::2]):
        fast.pop("step"), slow.pop("step")
        assert fast == slow
    assert steps[0]["page_table"][1] == {"req_pool_index": 0, "token_slots": [20, 21]}
    assert steps[0]["sampling"][2]["seed"] == 7 and steps[0]["timestamp_nanos"] == 1000


def test_record_steps_fast_path_refuses_every_other_form_and_records_nothing(tmp_path):
    i64 = np.arange(3, dtype=np.int64)
    refused = {
        "int32 tokens": dict(token_ids=i64.astype(np.int32)),
        "a list": dict(positions=[3, 1, 4]),
        "a strided view": dict(seq_lens=np.arange(6, dtype=np.int64)[::2]),
        "big-endian": dict(extend_lens=i64.astype(">i8")),
        "2-D for a vector": dict(req_pool_indices=i64.reshape(3, 1)),
        "float64 temperatures": dict(sampling={"temperatures": np.ones(3)}),
        "an unknown sampling key": dict(sampling={"temp": np.ones(3, np.float32)}),
        "seeds as a list": dict(sampling={"seeds": [1, None, 2]}),
        "page rows as lists": dict(page_table=[[1], [2], [3]]),
        "a length past the row": dict(page_table={"rows": i64.reshape(3, 1), "lengths": np.full(3, 2)}),
        "fewer lengths than rows": dict(page_table={"rows": i64.reshape(3, 1), "lengths": np.ones(2, np.int64)}),
        "a CSR tuple of 4": dict(page_table=(i64, i64, i64, i64)),
        "a numpy rng_seed": dict(rng_seed=np.int64(3)),
        "bool offset": dict(rng_offset=True),
        "digests not a dict": dict(digests=[("a", 1)]),
        "an unknown mode": dict(mode="decoding"),
    }
    with make(tmp_path) as rec:
        for what, over in refused.items():
            assert _fast(rec, 0, _step_args(**over)) is False, what
        rec.flush()
        assert rec.stats()["steps_accepted"] == 0
        # The general path still takes what it converts, and names what is wrong.
        rec.record_step(0, **_step_args(token_ids=i64.astype(np.int32), positions=[3, 1, 4]))
        with pytest.raises(ValueError, match="a length 2 exceeds the row width 1"):
            rec.record_step(1, **_step_args(page_table={"rows": i64.reshape(3, 1), "lengths": np.full(3, 2)}))
        with pytest.raises(ValueError, match="unknown keys"):
            rec.record_step(1, **_step_args(sampling={"temp": np.ones(3, np.float32)}))
        # Errors of the step itself raise from the fast path as from the general one.
        with pytest.raises(ValueError, match="one entry per request"):
            _fast(rec, 1, _step_args(sampling={"temperatures": np.ones(3, np.float32), "top_ps": np.ones(2, np.float32)}))
        path = rec.path
    assert [s["step"] for s in crashreplay.read_capture(path)["step_records"]] == [0]


def test_step_list_deltas_on_and_off_read_back_the_same_steps(tmp_path):
    # Format 2.4 stores a decode step's positions, sequence lengths and cache
    # slots as differences from the step before (step_list_deltas, on by
    # default); off, as values. Either way the reader gives back the values,
    # also when a request leaves the batch; the differences make the file
    # smaller.
    rng = np.random.default_rng(3)
    steps = []
    lens = rng.integers(100, 2000, 128)
    slots = np.arange(128, dtype=np.int64) << 20
    for i in range(200):
        if i == 120:
            lens, slots = lens[1:], slots[1:]
        steps.append(dict(positions=lens.copy(), seq_lens=lens + 1, out_cache_loc=slots.copy(),
                          token_ids=rng.integers(0, 150000, lens.size)))
        lens, slots = lens + 1, slots + 1
    sizes, read = {}, {}
    for on in (True, False):
        d = tmp_path / str(on)
        d.mkdir()
        with make(d, step_list_deltas=on) as rec:
            for i, s in enumerate(steps):
                rec.record_step(i, mode="decode", **s)
            path = rec.path
        sizes[on] = os.path.getsize(path)
        read[on] = crashreplay.read_capture(path)["step_records"]
    for got_on, got_off, s in zip(read[True], read[False], steps):
        for key in ("positions", "seq_lens", "out_cache_loc", "token_ids"):
            assert got_on[key] == list(s[key]) == got_off[key]
    assert sizes[True] < sizes[False]
