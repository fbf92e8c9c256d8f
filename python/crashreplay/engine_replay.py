"""`python -m crashreplay.engine_replay`: a capture's steps re-executed by the
engine that recorded them, in that engine's own model runner.

`crashreplay replay CAPTURE --engine NAME` starts this module in the
engine's Python (--engine-python) as a child process (DESIGN decision 12;
tools/engine_replay.h is the other side):

    python -m crashreplay.engine_replay --engine transformers --capture CAP \
        --step N --out OUT [--model DIR] [--setting k=v ...] [--setup MODULE ...]

It imports each --setup module first (a user's patches, a fork's kernels:
the tests install their defects this way), rebuilds the model from the
recorded checkpoint (or --model) under the recorded configuration in the
engine's own words with the --setting overrides, and feeds it the recorded
steps 0..N: their token ids and positions into a fresh cache, the recorded
tokens fed back after each step. Sampling runs as the engine ran it; where
the capture cannot make it the same draw (non-greedy sampling without a
recorded generator state) the sampled token is reported, not compared.
It records the replay with the same recorder and boundaries as the
original session (OUT/session: a capture of its own, fingerprints
included) and writes OUT/result.json:

    {"engine", "version", "step", "settings", "steps_run", "session",
     "failure": null | {"type", "message", "step", "mode"},
     "tokens": [{"step", "recorded", "replayed"}]  (greedy steps),
     "sampled": [{"step", "recorded", "replayed"}] (non-greedy steps),
     "sampling": one line on how tokens were compared, "notes": [...]}

An exception the engine raises while replaying is the result, not an
error: the driver exits 0 and the failure is in result.json (and in the
session's failure record). Exit codes of its own, with {"refused": why} in
result.json: 2 a setting or --setup module the driver cannot use, 3 a
capture it cannot read or that another engine recorded, 7 the engine
cannot run here (vLLM without a GPU), 9 an engine version outside those the
driver was written for.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import traceback
from typing import Any, Dict, List, Optional

EXIT_USAGE = 2
EXIT_DATA = 3
EXIT_NO_DEVICE = 7
EXIT_UNSUPPORTED = 9

# The versions each driver was written and tested for (docs/engines.md).
SUPPORTED_VERSIONS = {
    "transformers": ("5.",),
    "sglang": ("0.5.",),
    "vllm": ("0.33.", "0.34."),
}


class Refusal(Exception):
    """The driver cannot replay the capture here; `code` is its exit code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def check_version(engine: str, version: str) -> None:
    if not any(version.startswith(p) for p in SUPPORTED_VERSIONS[engine]):
        raise Refusal(EXIT_UNSUPPORTED,
                      f"{engine} {version} is not a version this driver was written for "
                      f"({', '.join(p + 'x' for p in SUPPORTED_VERSIONS[engine])}); install one of those in "
                      f"the --engine-python environment")


class Capture:
    """The records the drivers need from one capture (rank 0's file)."""

    def __init__(self, path: str) -> None:
        from crashreplay._reader import read_capture

        try:
            data = read_capture(path)
        except Exception as e:  # noqa: BLE001 - the reader's message names what is wrong
            raise Refusal(EXIT_DATA, f"{path}: {e}") from e
        files = data["files"] if "files" in data else [data]
        if not files:
            raise Refusal(EXIT_DATA, f"{path}: no capture file")
        f = files[0]
        if not f.get("manifest"):
            raise Refusal(EXIT_DATA, f"{path}: no session manifest")
        self.path = path
        self.manifest: Dict[str, Any] = f["manifest"]
        self.toggles: Dict[str, Any] = self.manifest.get("toggles", {}) or {}
        steps: Dict[int, Dict[str, Any]] = {}
        for s in f["step_records"]:
            steps.setdefault(int(s["step"]), s)  # the first record of a step wins
        self.steps = [steps[k] for k in sorted(steps)]
        self.failures = f["failure_records"]

    def steps_through(self, step: int) -> List[Dict[str, Any]]:
        out = [s for s in self.steps if int(s["step"]) <= step]
        if not out or int(out[-1]["step"]) != step:
            raise Refusal(EXIT_USAGE, f"the capture has no step {step}")
        return out


def checkpoint_dir(cap: "Capture", model_dir: str) -> str:
    """The checkpoint the replay loads: --model, else the recorded path,
    which must exist here."""
    ckpt = model_dir or (cap.manifest.get("model", {}) or {}).get("checkpoint_path", "")
    if not ckpt:
        raise Refusal(EXIT_USAGE, "the capture records no checkpoint path: give it with --model DIR")
    if not os.path.isdir(ckpt):
        if model_dir:
            raise Refusal(EXIT_DATA, f"--model {ckpt}: no such directory")
        raise Refusal(EXIT_DATA, f"checkpoint {ckpt}: no such directory here (the capture records the path on the "
                                 "machine that served it): give the checkpoint with --model DIR")
    return ckpt


def parse_settings(items: List[str]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep or not k:
            raise Refusal(EXIT_USAGE, f"--setting '{it}': expected name=value")
        out[k] = v
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m crashreplay.engine_replay", description=__doc__.split("\n")[0])
    p.add_argument("--engine", required=True, choices=sorted(SUPPORTED_VERSIONS))
    p.add_argument("--capture", required=True)
    p.add_argument("--step", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="")
    p.add_argument("--setting", action="append", default=[])
    p.add_argument("--setup", action="append", default=[])
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    # OUT/session and OUT/result.json are this driver's own: a run into the
    # same OUT replaces them rather than appending to an older recording.
    shutil.rmtree(os.path.join(a.out, "session"), ignore_errors=True)
    for name in ("result.json", "result.json.tmp"):
        if os.path.exists(os.path.join(a.out, name)):
            os.remove(os.path.join(a.out, name))
    result: Dict[str, Any] = {"engine": a.engine, "step": a.step, "notes": []}
    code = 0
    try:
        settings = parse_settings(a.setting)
        result["settings"] = settings
        for m in a.setup:
            try:
                importlib.import_module(m)
            except Exception as e:  # noqa: BLE001 - the user's module: say which and why
                raise Refusal(EXIT_USAGE, f"--engine-setup {m}: {type(e).__name__}: {e}") from e
        cap = Capture(a.capture)
        if a.engine == "transformers":
            from crashreplay import _replay_transformers as driver
        elif a.engine == "sglang":
            from crashreplay import _replay_sglang as driver  # type: ignore[no-redef]
        else:
            from crashreplay import _replay_vllm as driver  # type: ignore[no-redef]
        result["setup"] = list(a.setup)  # also imported by the ranks a tp_size=N replay starts
        driver.replay(cap, a.step, settings, a.model, a.out, result)
    except Refusal as r:
        result["refused"] = str(r)
        code = r.code
    except ImportError as e:
        result["refused"] = f"{a.engine} does not import in {sys.executable}: {e}"
        code = EXIT_UNSUPPORTED
    with open(os.path.join(a.out, "result.json.tmp"), "w") as out:
        json.dump(result, out, indent=1, default=str)
    os.replace(os.path.join(a.out, "result.json.tmp"), os.path.join(a.out, "result.json"))
    if code:
        print(f"crashreplay.engine_replay: {result['refused']}", file=sys.stderr)
    return code


def record_exception(result: Dict[str, Any], e: BaseException, step: int, mode: str) -> None:
    """The engine's exception as the run's result (re-raised by nobody)."""
    from crashreplay.failure import exception_type_name

    t = type(e)
    result["failure"] = {"type": f"{t.__module__}.{t.__qualname__}", "short_type": exception_type_name(e),
                         "message": str(e), "step": step, "mode": mode,
                         "traceback": "".join(traceback.format_exception(t, e, e.__traceback__))[-4000:]}


if __name__ == "__main__":
    # Run as the package's module, not as __main__: the drivers import
    # Refusal from crashreplay.engine_replay, which must be this one's.
    from crashreplay import engine_replay

    sys.exit(engine_replay.main())
