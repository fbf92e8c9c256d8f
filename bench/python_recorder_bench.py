"""Per-call cost of the Python recorder's hot path, next to plain numpy copies.

    PYTHONPATH=build/python:python python3 bench/python_recorder_bench.py

Prints, for a decode step of 256 requests: record_step (step log only, with
page-table rows of 512 slots per request and sampling params) and snapshot()
of 1, 16 and 256 MiB, each beside np.copyto of the same bytes (the memcpy a
snapshot must cost at least). Figures are wall-clock medians on this
machine; this is a benchmark, not a test.
"""
import os
import statistics
import tempfile
import time

import numpy as np

import crashreplay


def median_us(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def main():
    bs, slots = 256, 512
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 32000, bs, dtype=np.int64)
    pos = rng.integers(0, slots, bs, dtype=np.int64)
    seq = np.full(bs, slots, dtype=np.int64)
    rows = np.arange(bs * slots, dtype=np.int64).reshape(bs, slots)
    pool = np.arange(bs, dtype=np.int64)
    sampling = {"temperatures": np.full(bs, 0.7, np.float32), "top_ps": np.ones(bs, np.float32),
                "top_ks": np.full(bs, -1, np.int64), "min_ps": np.zeros(bs, np.float32)}
    with tempfile.TemporaryDirectory() as d:
        rec = crashreplay.Recorder(os.path.join(d, "b.crcap"), engine="bench", install_signal_handlers=False,
                                   snapshot_ring_bytes=1 << 30, step_queue_slots=4096)
        step = [0]

        def log_only():
            rec.record_step(step[0], mode="decode", token_ids=ids, positions=pos, seq_lens=seq,
                            req_pool_indices=pool, out_cache_loc=pos, sampling=sampling)
            step[0] += 1

        def log_with_rows():
            rec.record_step(step[0], mode="decode", token_ids=ids, positions=pos, seq_lens=seq,
                            req_pool_indices=pool, page_table=(np.arange(0, bs * slots + 1, slots), rows.reshape(-1)),
                            out_cache_loc=pos, sampling=sampling)
            step[0] += 1

        print(f"record_step, decode bs={bs}, no rows:          {median_us(log_only, 2000):8.1f} us/call")
        print(f"record_step, decode bs={bs}, {slots}-slot rows:   {median_us(log_with_rows, 500):8.1f} us/call")
        for mib in (1, 16, 256):
            src = rng.integers(0, 255, mib << 20, dtype=np.uint8)
            dst = np.empty_like(src)
            reps = 50 if mib < 256 else 8
            snap = median_us(lambda: rec.snapshot(step[0], {"x": src}), reps)
            copy = median_us(lambda: np.copyto(dst, src), reps)
            print(f"snapshot {mib:4d} MiB: {snap:10.1f} us   np.copyto same bytes: {copy:10.1f} us"
                  f"   ({(mib << 20) / snap / 1e3:6.2f} GB/s vs {(mib << 20) / copy / 1e3:6.2f} GB/s)")
        rec.close()


if __name__ == "__main__":
    main()
