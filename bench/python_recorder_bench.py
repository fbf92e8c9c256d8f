"""Per-call cost of the Python recorder's hot path, next to plain numpy copies.

    PYTHONPATH=build/python:python python3 bench/python_recorder_bench.py [--quick] [--only-context | --no-context]
    PYTHONPATH=build/python:python ENGINES_VENV/bin/python bench/python_recorder_bench.py --vllm [--quick]

Prints, for a decode step of 256 requests (256 request ids, token ids,
positions, seq lens, pool indices, cache locations, outputs and sampling
parameters):
  * Recorder.record_step with 0.2 ms of busy work between calls ("busy": a
    spin over a 4 MiB array, as a scheduler is busy between steps) and with
    0.5 ms of sleep ("sleep"). Not back to back: at tens of thousands of
    steps a second the recorder's writer thread is the bound and the figure
    would be its back-pressure, not the call;
  * the same step handed straight to the extension's call that record_step
    makes (Recorder._impl._record_step_fast: arrays read through the buffer
    protocol), the part of the cost below the Python layer; and to the
    ndarray-typed binding the general path uses (nanobind's caster asks each
    array for a DLPack capsule), for comparison;
  * numpy's copy of the same arrays (np.concatenate) as the reference;
  * record_step with page-table rows of 512 slots per request (1 MiB a step;
    paced at 2 ms, about what the writer sustains for steps that large);
  * page-table rows as context grows: batch 64 and 256 at 512, 4k and 16k
    slots a request, each decode step adding one slot a row, recorded as
    whole rows (a padded 2-D block and lengths, as the sglang adapter gave
    them before) into a file of whole rows (page_table_deltas=False: the
    recorder before deltas) and into one of deltas, and as deltas
    ({"rows": new slots, "lengths", "starts"}, as the sglang adapter now
    gives a decode step): p50 per call, and file bytes per step after the
    warm-up; beside them numpy's copy of the whole rows;
  * with --vllm (and only that; needs torch): the vLLM adapter's block rows,
    whole against deltas, batch 64 and 256 at 512, 4k and 16k tokens;
  * snapshot() of 1, 16 and 256 MiB beside np.copyto of the same bytes. The
    encoder is let finish between calls (not timed), so every call is a real
    copy into the ring; the count of snapshots the ring evicted is printed.
Figures are wall-clock medians on this machine; this is a benchmark, not a
test.
"""
import os
import statistics
import tempfile
import time

import numpy as np

import crashreplay


_WORKING_SET = np.ones(4 << 20, dtype=np.uint8)


def busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        _WORKING_SET[::64] += 1  # touches every line of 4 MiB


def median_us(fn, reps, pace_s=0.0, between=None, work=False):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
        if between is not None:
            between()
        if work:
            busy(pace_s)
        elif pace_s:
            time.sleep(pace_s)
    return statistics.median(times) / 1e3


def interleaved_us(fns, reps, pace_s, work=False):
    """p50 per call of each of fns, called in turn (one call of each per
    round, paced after each call), so that the machine's drift over the run
    weighs on all of them alike."""
    times = [[] for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter_ns()
            fn()
            times[i].append(time.perf_counter_ns() - t0)
            if work:
                busy(pace_s)
            else:
                time.sleep(pace_s)
    return [statistics.median(t) / 1e3 for t in times]


def context_sweep(steps=60, warm=8):
    print(f"page-table rows as context grows ({steps} decode steps per case after {warm}; p50 per call, us)")
    print(f"  {'batch':>5} {'slots':>6}  {'rows':24s} {'p50 us':>10} {'file B/step':>12} {'np copy us':>11}")
    for bs in (64, 256):
        for ctx in (512, 4096, 16384):
            width = ctx + warm + steps + 1
            for how in ("whole, file whole", "whole, file deltas", "given as deltas"):
                table = np.zeros((bs, width), dtype=np.int64)
                table[:, :ctx] = np.arange(bs * ctx, dtype=np.int64).reshape(bs, ctx)
                lens = np.full(bs, ctx, dtype=np.int64)
                pool = np.arange(bs, dtype=np.int64)
                ones = np.ones(bs, dtype=np.int64)
                with tempfile.TemporaryDirectory() as d:
                    rec = crashreplay.Recorder(os.path.join(d, "c.crcap"), engine="bench",
                                               install_signal_handlers=False, step_queue_wait_s=600.0,
                                               page_table_deltas=how != "whole, file whole")
                    times, copies, bytes0 = [], [], 0
                    for st in range(warm + steps):
                        if st == warm:
                            rec.flush()
                            bytes0 = rec.stats()["file_bytes"]
                        if st > 0:
                            table[pool, lens] = 10**9 + st * bs + pool
                            lens += 1
                        if how == "given as deltas" and st > 0:
                            pt = {"rows": table[pool, lens - 1].reshape(bs, 1), "lengths": ones, "starts": lens - 1}
                        else:
                            pt = {"rows": table[:, :int(lens.max())], "lengths": lens}
                        t0 = time.perf_counter_ns()
                        rec.record_step(st, mode="decode", seq_lens=lens, req_pool_indices=pool, page_table=pt,
                                        out_cache_loc=table[pool, lens - 1], token_ids=ones)
                        if st >= warm:
                            times.append(time.perf_counter_ns() - t0)
                            if how == "whole, file whole":
                                t1 = time.perf_counter_ns()
                                table[:, :int(lens.max())].copy()
                                copies.append(time.perf_counter_ns() - t1)
                        busy(0.0002)
                    rec.flush()
                    per_step = (rec.stats()["file_bytes"] - bytes0) / steps
                    rec.close()
                ref = f"{statistics.median(copies) / 1e3:11.1f}" if copies else ""
                print(f"  {bs:5d} {ctx:6d}  {how:24s} {statistics.median(times) / 1e3:10.1f} {per_step:12.0f} {ref}")


def vllm_sweep(steps=60, warm=8, block=16):
    """The vLLM adapter's rows (crashreplay.vllm.extract_step_v2 then
    record_step) as context grows: block ids of a torch block table, whole
    rows (previous=None) against deltas from the block of each request's
    first new token (the adapter's default); p50 per step of both calls and
    file bytes per step. Needs torch (not vLLM: the InputBatch is a stand-in
    with its fields)."""
    import types

    import torch

    from crashreplay import vllm as cr_vllm

    print(f"vLLM adapter rows as context grows (block size {block}; extract_step_v2 + record_step, p50 us)")
    print(f"  {'batch':>5} {'tokens':>6}  {'rows':8s} {'p50 us':>10} {'file B/step':>12}")
    runner = types.SimpleNamespace(block_tables=types.SimpleNamespace(block_sizes=[block]), sampler=None)
    for bs in (64, 256):
        for ctx in (512, 4096, 16384):
            table = torch.randint(0, 1 << 20, (bs, (ctx + warm + steps) // block + 2), dtype=torch.int32)
            for how in ("whole", "deltas"):
                computed = np.full(bs, ctx, dtype=np.int64)
                previous = cr_vllm.RowsGiven() if how == "deltas" else None
                with tempfile.TemporaryDirectory() as d:
                    rec = crashreplay.Recorder(os.path.join(d, "c.crcap"), engine="bench",
                                               install_signal_handlers=False, step_queue_wait_s=600.0)
                    times, bytes0 = [], 0
                    for st in range(warm + steps):
                        if st == warm:
                            rec.flush()
                            bytes0 = rec.stats()["file_bytes"]
                        ib = types.SimpleNamespace(
                            req_ids=[f"r{i}" for i in range(bs)], num_reqs=bs, num_scheduled_tokens=np.ones(bs),
                            num_computed_tokens_np=computed, num_tokens=bs, input_ids=torch.arange(bs),
                            positions=torch.from_numpy(computed), idx_mapping_np=np.arange(bs))
                        t0 = time.perf_counter_ns()
                        rec.record_step(st, **cr_vllm.extract_step_v2(runner, ib, ((table,), None), previous=previous))
                        if st >= warm:
                            times.append(time.perf_counter_ns() - t0)
                        computed = computed + 1
                        busy(0.0002)
                    rec.flush()
                    per_step = (rec.stats()["file_bytes"] - bytes0) / steps
                    rec.close()
                print(f"  {bs:5d} {ctx:6d}  {how:8s} {statistics.median(times) / 1e3:10.1f} {per_step:12.0f}")


def main():
    if "--vllm" in os.sys.argv:
        vllm_sweep(30 if "--quick" in os.sys.argv else 60)
        return
    if "--no-context" not in os.sys.argv:
        context_sweep(30 if "--quick" in os.sys.argv else 60)
    if "--only-context" in os.sys.argv:
        return
    bs, slots = 256, 512
    rng = np.random.default_rng(0)
    rids = [f"chatcmpl-{1000000 + i}" for i in range(bs)]
    ids = rng.integers(0, 32000, bs, dtype=np.int64)
    pos = rng.integers(0, slots, bs, dtype=np.int64)
    seq = np.full(bs, slots, dtype=np.int64)
    rows = np.arange(bs * slots, dtype=np.int64).reshape(bs, slots)
    pool = np.arange(bs, dtype=np.int64)
    out = rng.integers(0, 32000, bs, dtype=np.int64)
    sampling = {"temperatures": np.full(bs, 0.7, np.float32), "top_ps": np.ones(bs, np.float32),
                "top_ks": np.full(bs, -1, np.int64), "min_ps": np.zeros(bs, np.float32)}
    arrays = [ids, pos, seq, pool, pos, out] + list(sampling.values())
    with tempfile.TemporaryDirectory() as d:
        rec = crashreplay.Recorder(os.path.join(d, "b.crcap"), engine="bench", install_signal_handlers=False,
                                   snapshot_ring_bytes=1 << 30)
        step = [0]

        def log_only():
            rec.record_step(step[0], mode="decode", request_ids=rids, token_ids=ids, positions=pos, seq_lens=seq,
                            req_pool_indices=pool, out_cache_loc=pos, sampling=sampling, output_token_ids=out)
            step[0] += 1

        t32, p32, k64, m32 = (sampling[k] for k in ("temperatures", "top_ps", "top_ks", "min_ps"))

        def extension_only():
            rec._impl.record_step(step[0], "decode", rids, ids, pos, seq, None, pool, None, None, pos, t32, p32, k64,
                                  m32, None, None, 0, 0, out, [], 0)
            step[0] += 1

        def fast_only():
            rec._impl._record_step_fast(step[0], "decode", rids, ids, pos, seq, None, pool, None, pos, sampling, 0, 0,
                                        out, None, 0)
            step[0] += 1

        def numpy_copy():
            np.concatenate(arrays)

        def log_with_rows():
            rec.record_step(step[0], mode="decode", request_ids=rids, token_ids=ids, positions=pos, seq_lens=seq,
                            req_pool_indices=pool, page_table=(np.arange(0, bs * slots + 1, slots), rows.reshape(-1)),
                            out_cache_loc=pos, sampling=sampling, output_token_ids=out)
            step[0] += 1

        print(f"decode step, {bs} requests (p50 per call, us; the four called in turn)    busy 0.2 ms   sleep 0.5 ms")
        rows_ = (("Recorder.record_step", log_only), ("its buffer-protocol call only", fast_only),
                 ("ndarray-typed binding only", extension_only), ("np.concatenate of the arrays", numpy_copy))
        fns = [fn for _, fn in rows_]
        interleaved_us(fns, 200, 0.0005)
        busy_us = interleaved_us(fns, 2000, 0.0002, work=True)
        sleep_us = interleaved_us(fns, 2000, 0.0005)
        for (label, _), b, z in zip(rows_, busy_us, sleep_us):
            print(f"  {label:32s} {b:10.1f} {z:12.1f}")
        print(f"  record_step / numpy copy: {busy_us[0] / busy_us[3]:.2f}x busy, {sleep_us[0] / sleep_us[3]:.2f}x sleep"
              " (issue 29's target: <= 2x)")
        median_us(log_with_rows, 20, 0.002)
        spilled0 = rec.stats()["steps_accepted"]
        print(f"  record_step + {slots}-slot rows (1 MiB), paced 2 ms: {median_us(log_with_rows, 300, 0.002):8.1f} us"
              f" ({rec.stats()['steps_accepted'] - spilled0} steps)")
        rec.flush()

        def encoder_idle():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                s = rec.stats()
                if s["snapshots_encoded"] + s["snapshots_dropped"] >= s["snapshots_accepted"]:
                    return
                time.sleep(0.001)

        for mib in (1, 16, 256):
            src = rng.integers(0, 255, mib << 20, dtype=np.uint8)
            dst = np.empty_like(src)
            reps = 50 if mib < 256 else 8
            before = rec.stats()["snapshots_dropped"]
            snap = median_us(lambda: rec.snapshot(step[0], {"x": src}), reps, between=encoder_idle)
            evicted = rec.stats()["snapshots_dropped"] - before
            copy = median_us(lambda: np.copyto(dst, src), reps)
            print(f"snapshot {mib:4d} MiB: {snap:10.1f} us   np.copyto same bytes: {copy:10.1f} us"
                  f"   ({(mib << 20) / snap / 1e3:6.2f} GB/s vs {(mib << 20) / copy / 1e3:6.2f} GB/s;"
                  f" {evicted} older snapshots evicted)")
        rec.close()


if __name__ == "__main__":
    main()
