"""Child process for test_crash.py: records steps of real tensors, then dies.

    python crash_child.py MODE CAPTURE_PATH STEPS

MODE: exception | oom | abort | segv | segv_ctypes | sigkill | clean.
Each step snapshots numpy tensors (input ids, positions, a bf16-sized
float16 hidden state) and records the step log; the failure happens in the
step after the last accepted one, inside the failure hook, so the capture
must hold steps 0..STEPS-1. For sigkill the child flushes (the writer has
written every accepted step), prints READY and waits for the parent's kill.
"""
import ctypes
import os
import signal
import sys
import time

import numpy as np

import crashreplay


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.OutOfMemoryError (same name and message shape)."""


def inputs(step: int):
    rng = np.random.default_rng(step)
    ids = rng.integers(0, 32000, size=8, dtype=np.int64)
    return {
        "input_ids": ids,
        "positions": np.arange(8, dtype=np.int64) + step,
        "hidden": rng.standard_normal((8, 64)).astype(np.float16),
    }


def main() -> int:
    mode, path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rec = crashreplay.Recorder(path, engine="crash-child", engine_version="1",
                               config={"attention_backend": "triton", "mem_fraction_static": 0.9},
                               parallel={"tp_size": 1, "rank": 0}, overwrite=True)
    for step in range(steps):
        t = inputs(step)
        rec.snapshot(step, t)
        rec.record_step(step, mode="decode", request_ids=[f"r{i}" for i in range(2)],
                        token_ids=t["input_ids"], positions=t["positions"], seq_lens=[step + 4, step + 5],
                        req_pool_indices=[0, 1], page_table=[list(range(step + 4)), list(range(10, step + 15))],
                        out_cache_loc=[100 + step, 200 + step],
                        sampling={"temperatures": [0.7, 1.0], "top_ps": [0.9, 1.0], "top_ks": [20, -1],
                                  "min_ps": [0.0, 0.05], "seeds": [1234, None]})
    step = steps
    if mode == "clean":
        rec.close()
        return 0
    if mode == "sigkill":
        rec.flush()
        print("READY", flush=True)
        time.sleep(60)
        return 1
    with rec.failure_hook(step=step, stage="decode"):
        if mode == "exception":
            raise RuntimeError("CUDA error: device-side assert triggered\nCompile with "
                               "`TORCH_USE_CUDA_DSA` to enable device-side assertions.")
        if mode == "oom":
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if mode == "abort":
            os.abort()
        if mode == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if mode == "segv_ctypes":
            ctypes.string_at(0)  # a real invalid read
    return 2


if __name__ == "__main__":
    sys.exit(main())
