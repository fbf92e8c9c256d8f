"""The vLLM driver of crashreplay.engine_replay.

vLLM's PyPI wheel has no CPU kernels (its CPU platform needs a build with
VLLM_TARGET_DEVICE=cpu), so a replay in vLLM itself needs a CUDA device:
without one this driver refuses with exit 7 and says why, and bisect
counts such a trial untestable. The GPU path (GPUModelRunner.execute_model
with a SchedulerOutput built from the capture, then sample_tokens) is not
written yet: on a GPU the driver says so (exit 9) rather than pretend.
"""
from __future__ import annotations

from typing import Any, Dict

from crashreplay.engine_replay import EXIT_DATA, EXIT_NO_DEVICE, EXIT_UNSUPPORTED, Capture, Refusal


def replay(cap: Capture, step: int, settings: Dict[str, str], model_dir: str, out: str,
           result: Dict[str, Any]) -> None:
    import torch

    if not torch.cuda.is_available():
        raise Refusal(EXIT_NO_DEVICE,
                      "vLLM runs its model only on a GPU here: its PyPI wheel has no CPU kernels (the CPU platform "
                      "needs a VLLM_TARGET_DEVICE=cpu build), and torch sees no CUDA device; replay it on a machine "
                      "with one, or with --engine crashreplay")
    engine = cap.manifest.get("engine", "")
    if engine != "vllm":
        raise Refusal(EXIT_DATA, f"the capture was recorded by '{engine}', not vLLM")
    import vllm

    result["version"] = vllm.__version__
    raise Refusal(EXIT_UNSUPPORTED, f"replay in vLLM {vllm.__version__} on a GPU is not written yet "
                                    "(GPUModelRunner.execute_model from the capture's SchedulerOutput)")
