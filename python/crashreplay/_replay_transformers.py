"""The transformers driver of crashreplay.engine_replay.

Re-executes a capture recorded by crashreplay.transformers in the model's own
forward: the checkpoint loaded with the recorded dtype, attn_implementation
and experts_implementation (or the --setting overrides), each recorded step's
token ids and positions fed into a fresh DynamicCache with the arguments
generate() passes (cache, position_ids, logits_to_keep=1, use_cache), then
generate()'s sampling of the step: the logits in float32 through
transformers' own warpers (temperature, top-k, top-p, min-p, in generate's
order), softmax and torch.multinomial, or argmax when greedy. So a failure
inside the forward or in sampling (torch's "probability tensor contains
either `inf`, `nan` or element < 0") is raised again by the same code.

The recorded tokens are fed back at every step, whatever was sampled:
greedy tokens are compared with them; sampled ones are reported only, since
the capture holds the generator's seed, not its state at generate()'s start.
The replay is recorded by crashreplay.transformers itself into OUT/session,
so its fingerprints are the same boundaries, summarised by the same code.
A batch is taken as generate() gives it (every sequence the same length, no
padding), which is what the recorder records.
"""
from __future__ import annotations

import inspect
import os
from typing import Any, Dict

import numpy as np

from crashreplay.engine_replay import EXIT_DATA, EXIT_USAGE, Capture, Refusal, check_version, record_exception

SETTINGS = ("dtype", "attn_implementation", "experts_implementation", "device")
DTYPES = ("float32", "float16", "bfloat16")


def _sampler(torch: Any, transformers: Any, params: Dict[str, Any]):
    """generate()'s next-token choice for one step's sampling parameters."""
    t = float(params.get("temperature", 0.0) or 0.0)
    if t <= 0.0:
        return True, lambda ids, logits: torch.argmax(logits, dim=-1)
    warpers = []
    if t != 1.0:
        warpers.append(transformers.TemperatureLogitsWarper(t))
    top_k = int(params.get("top_k", -1))
    if top_k > 0:
        warpers.append(transformers.TopKLogitsWarper(top_k=top_k))
    top_p = float(params.get("top_p", 1.0))
    if top_p < 1.0:
        warpers.append(transformers.TopPLogitsWarper(top_p=top_p))
    min_p = float(params.get("min_p", 0.0) or 0.0)
    if min_p > 0.0:
        warpers.append(transformers.MinPLogitsWarper(min_p=min_p))

    def sample(ids: Any, logits: Any) -> Any:
        scores = logits
        for w in warpers:
            scores = w(ids, scores)
        probs = torch.nn.functional.softmax(scores, dim=-1)
        return torch.multinomial(probs, num_samples=1).squeeze(1)

    return False, sample


def replay(cap: Capture, step: int, settings: Dict[str, str], model_dir: str, out: str,
           result: Dict[str, Any]) -> None:
    import torch
    import transformers

    from crashreplay.transformers import TransformersRecorder

    result["version"] = transformers.__version__
    check_version("transformers", transformers.__version__)
    engine = cap.manifest.get("engine", "")
    if engine != "transformers":
        raise Refusal(EXIT_DATA, f"the capture was recorded by '{engine}', not transformers: replay it with "
                                 f"--engine {engine}" if engine else "the capture names no engine")
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise Refusal(EXIT_USAGE, f"transformers replay has no setting {', '.join(unknown)} "
                                  f"(it takes {', '.join(SETTINGS)})")
    model_info = cap.manifest.get("model", {}) or {}
    ckpt = model_dir or model_info.get("checkpoint_path", "")
    if not ckpt:
        raise Refusal(EXIT_USAGE, "the capture records no checkpoint path: give it with --model DIR")
    dtype = settings.get("dtype") or model_info.get("dtype") or "float32"
    if dtype not in DTYPES:
        raise Refusal(EXIT_USAGE, f"dtype '{dtype}': transformers replay takes {', '.join(DTYPES)}")
    kwargs: Dict[str, Any] = {"dtype": getattr(torch, dtype)}
    for key in ("attn_implementation", "experts_implementation"):
        value = settings.get(key) or cap.toggles.get(f"transformers.{key}") or None
        if value:
            kwargs[key] = value
    device = settings.get("device", "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        from crashreplay.engine_replay import EXIT_NO_DEVICE

        raise Refusal(EXIT_NO_DEVICE, f"device={device}: torch sees no CUDA device here")
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, **kwargs)
    except OSError as e:
        raise Refusal(EXIT_DATA, f"{ckpt}: {e}") from e
    except (ValueError, ImportError) as e:  # an attn_implementation it does not have, ...
        raise Refusal(EXIT_USAGE, f"transformers refused {kwargs}: {e}") from e
    model.to(device).eval()
    cfg = model.config
    result["applied"] = {"checkpoint": ckpt, "dtype": dtype, "device": device,
                         "attn_implementation": getattr(cfg, "_attn_implementation", None),
                         "experts_implementation": getattr(cfg, "_experts_implementation", None)}
    steps = cap.steps_through(step)
    every = cap.steps
    positions = [int(p) for s in every for p in s["positions"]]
    max_length = (max(positions) + 1) if positions else None
    session = os.path.join(out, "session")
    rec = TransformersRecorder(model, session, checkpoint_path=ckpt, max_length=max_length,
                               install_signal_handlers=False)
    result["session"] = session
    forward_args = inspect.signature(model.forward).parameters
    cache_arg = "cache" if "cache" in forward_args else "past_key_values"
    cache = transformers.DynamicCache(config=cfg)
    tokens, sampled = [], []
    greedy_all = True
    current, mode = -1, ""
    result["steps_run"] = 0
    result["failure"] = None
    # The same draws run after run (the recording's seed; its state at
    # generate()'s start is not in the capture).
    torch.manual_seed(int(steps[0].get("rng_seed", 0) or 0))
    try:
        with rec.failures(), torch.no_grad():
            for i, s in enumerate(steps):
                current, mode = int(s["step"]), s["mode"]
                batch = len(s["request_ids"]) or 1
                ids = torch.as_tensor(np.asarray(s["token_ids"], dtype=np.int64)).reshape(batch, -1).to(device)
                pos = torch.as_tensor(np.asarray(s["positions"], dtype=np.int64)).reshape(batch, -1).to(device)
                kw = {cache_arg: cache, "position_ids": pos, "use_cache": True, "return_dict": True}
                if "logits_to_keep" in forward_args:
                    kw["logits_to_keep"] = 1
                outputs = model(input_ids=ids, **kw)
                logits = outputs.logits[:, -1].to(copy=True, dtype=torch.float32)
                params = (s.get("sampling") or [{}])[0]
                greedy, choose = _sampler(torch, transformers, params)
                greedy_all &= greedy
                chosen = choose(ids, logits).tolist()
                result["steps_run"] = i + 1
                nxt = next((t for t in every if int(t["step"]) == current + 1), None)
                if nxt is not None and len(nxt["token_ids"]) == batch:
                    row = {"step": current, "recorded": [int(t) for t in nxt["token_ids"]],
                           "replayed": [int(t) for t in chosen]}
                    (tokens if greedy else sampled).append(row)
    except Exception as e:  # noqa: BLE001 - the engine's failure is the result
        record_exception(result, e, current, mode)
    finally:
        rec.close()
    result["tokens"] = tokens
    result["sampled"] = sampled
    result["sampling"] = ("greedy: every sampled token compared with the recorded one" if greedy_all else
                          "non-greedy steps sample with a generator seeded here, not the recording's state: their "
                          "tokens are reported (sampled), not compared; the recorded tokens are fed back")
