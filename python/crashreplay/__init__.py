"""crashreplay: an always-on flight recorder for LLM inference steps.

Record the step log and tensor snapshots of a serving process, so that when
it dies (a device-side assert, an OOM, a signal) the steps that led there are
on disk, ready for `crashreplay replay` and `crashreplay bisect`.

    import crashreplay
    with crashreplay.Recorder("/tmp/cap", engine="myengine", config={...}) as rec:
        for step in range(n):
            rec.snapshot(step, {"input_ids": ids})
            rec.record_step(step, mode="decode", token_ids=ids, ...)
            with rec.failure_hook(step=step, stage="decode"):
                run_step()

See docs/python.md. The compiled half is crashreplay._crashreplay.
"""
import pkgutil as _pkgutil

# In-tree builds keep the extension in <build>/python/crashreplay/ and the
# Python files in <source>/python/crashreplay/; with both on sys.path this
# makes them one package. Installed wheels have both in one folder already.
__path__ = _pkgutil.extend_path(__path__, __name__)

from crashreplay._crashreplay import (  # noqa: E402
    CaptureCorruptError,
    CaptureFile,
    DeviceFingerprints,
    Error,
    describe_tensor,
    hash_bytes,
    list_capture_files,
)
from crashreplay._reader import read_capture, load_tensor  # noqa: E402
from crashreplay._tensors import hash_tensor, host_view  # noqa: E402
from crashreplay._manifest import config_to_toggles, detect_device  # noqa: E402
from crashreplay._recorder import Recorder  # noqa: E402
from crashreplay.failure import FailureHook, classify_failure  # noqa: E402


def failure_hook(recorder: "Recorder", step=None, stage: str = "") -> FailureHook:
    """Context manager / decorator: records an exception escaping a step, re-raises it."""
    return FailureHook(recorder, step=step, stage=stage)


__all__ = [
    "CaptureCorruptError",
    "CaptureFile",
    "DeviceFingerprints",
    "FailureHook",
    "Recorder",
    "classify_failure",
    "config_to_toggles",
    "detect_device",
    "failure_hook",
    "Error",
    "describe_tensor",
    "hash_bytes",
    "hash_tensor",
    "host_view",
    "list_capture_files",
    "load_tensor",
    "read_capture",
]
