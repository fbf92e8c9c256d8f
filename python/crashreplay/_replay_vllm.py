"""The vLLM driver of crashreplay.engine_replay.

vLLM's PyPI wheel has no CPU kernels (its CPU platform needs a build with
VLLM_TARGET_DEVICE=cpu), so a replay in vLLM itself needs a CUDA device:
without one this driver refuses with exit 7 and says why, and bisect
counts such a trial untestable.

On a GPU it re-executes the capture in vLLM's own engine:

  * configuration: EngineArgs, vLLM's own argument set, from the manifest:
    every EngineArgs field whose name the recorded VllmConfig part holds
    ("cache_config.block_size" is block_size; kv_cache_dtype is
    cache_config.cache_dtype, attention_backend attention_config.backend)
    with a plain recorded value (a number, a string, a boolean), except
    where the server ran (model path, addresses, ranks) and the parallel
    widths (the replay is one GPU unless a --setting asks for more); then
    the --setting overrides, EngineArgs fields under their own names
    (attention_backend, kv_cache_dtype, block_size, dtype, enforce_eager,
    ...). num_gpu_blocks_override makes the KV cache hold every recorded
    block id. result["applied"] holds what ran;
  * the engine: vLLM's EngineCore with the executor vLLM picks for the
    configuration (in-process for one GPU): its worker, model loader,
    KV cache sizing, warm-up and CUDA-graph capture, all vLLM's. The
    recorder (crashreplay.vllm, fingerprints on) is attached after the
    warm-up, so that vLLM's dummy runs are not recorded as steps;
  * steps 0..N: each step's SchedulerOutput is rebuilt from the capture
    (scheduler_outputs below): a request's first step gives its prompt,
    block ids, computed-token count and sampling parameters
    (NewRequestData), its later steps the blocks it gained and its
    computed-token count (CachedRequestData), a request that left the batch
    is finished; the recorded sampling seed (the one vLLM's Gumbel sampler
    draws with, recorded for every request) makes each draw vLLM's own.
    The executor's execute_model then sample_tokens run the step; before
    each step the recorded input token of every decoding request is written
    where vLLM's runner takes it from (the second-generation runner's last
    sampled token, vllm/v1/worker/gpu, the only one in 0.34; the
    first-generation runner's host token row, vLLM 0.33's default), with
    async scheduling off, so the recorded tokens are fed back whatever was
    sampled;
  * tokens: every sampled token the next recorded step feeds back is
    compared (greedy and seeded draws alike: both are vLLM's exact
    function of the recorded seed and position); the result lists them.

What this driver has not been run against: it was written against vLLM
0.34's sources and its SchedulerOutput construction is tested on the CPU
against captures recorded from vLLM's own classes; the GPU run is in
tests/gpu/run_bundle.sh (python/tests/test_engine_replay_vllm.py's GPU
tests), which skips where vLLM is not installed.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
from typing import Any, Dict, List, Optional, Tuple

from crashreplay.engine_replay import (
    EXIT_DATA,
    EXIT_NO_DEVICE,
    EXIT_USAGE,
    Capture,
    Refusal,
    check_version,
    checkpoint_dir,
    record_exception,
)

# EngineArgs fields that say where the server ran, not what it computed.
_PLACEMENT = ("model", "tokenizer", "served_model_name", "download_dir", "data_parallel_address",
              "data_parallel_rpc_port", "data_parallel_rank", "data_parallel_start_rank", "data_parallel_size_local",
              "device_ids", "hf_token", "log_config_file", "distributed_executor_backend", "load_format",
              "model_loader_extra_config", "num_gpu_blocks_override", "master_addr", "master_port", "nnodes",
              "node_rank", "numa_bind", "numa_bind_nodes", "numa_bind_cpus")
_WIDTHS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "prefill_context_parallel_size",
           "decode_context_parallel_size", "enable_expert_parallel")
# EngineArgs fields whose VllmConfig counterpart has another name.
_RENAMED = {"kv_cache_dtype": "cache_config.cache_dtype", "attention_backend": "attention_config.backend"}
_PARTS = ("model_config", "cache_config", "parallel_config", "scheduler_config", "device_config", "load_config",
          "attention_config", "kernel_config", "compilation_config")
_SCALARS = (bool, int, float, str)


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        import vllm

        return str(vllm.__version__)


def _engine_fields() -> Dict[str, Any]:
    """EngineArgs' fields and their defaults (None where the default is a factory)."""
    from vllm.engine.arg_utils import EngineArgs

    out = {}
    for f in dataclasses.fields(EngineArgs):
        out[f.name] = f.default if f.default is not dataclasses.MISSING else None
    return out


def recorded_engine_args(toggles: Dict[str, Any]) -> Dict[str, Any]:
    """EngineArgs keyword arguments from a manifest's flattened VllmConfig:
    each field with a plain recorded value under its own name in one of the
    config parts (or its renamed counterpart)."""
    out: Dict[str, Any] = {}
    defaults = _engine_fields()
    for name in defaults:
        if name in _PLACEMENT or name in _WIDTHS or name.startswith("_"):
            continue
        keys = [_RENAMED[name]] if name in _RENAMED else [f"{p}.{name}" for p in _PARTS]
        found = [k for k in keys if k in toggles]
        if len(found) != 1:
            continue
        value = toggles[found[0]]
        default = defaults[name]
        if value is None and default is not None:
            continue  # unresolved where it was recorded: vLLM's default
        if isinstance(value, str) and value[:1] in "[{":
            try:
                value = json.loads(value)  # lists and dicts are recorded as their JSON text
            except ValueError:
                continue
        elif isinstance(value, str) and name == "dtype" and value.startswith("torch."):
            value = value[len("torch."):]  # the resolved torch dtype; EngineArgs takes its name
        if value is None or isinstance(value, (_SCALARS, list, dict)):
            out[name] = value
    return out


def check_settings(settings: Dict[str, str]) -> Dict[str, Any]:
    """--setting name=value pairs as EngineArgs values (booleans, numbers
    and None read as such); a name that is no EngineArgs field is refused
    with the nearest ones."""
    fields = _engine_fields()
    out: Dict[str, Any] = {}
    for name, raw in settings.items():
        if name not in fields or name.startswith("_"):
            near = difflib.get_close_matches(name, [f for f in fields if not f.startswith("_")], n=3)
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            raise Refusal(EXIT_USAGE, f"--setting {name}: vLLM's EngineArgs has no field '{name}'{hint} (the driver "
                                      "takes EngineArgs fields under their own names: attention_backend, "
                                      "kv_cache_dtype, block_size, dtype, enforce_eager, ...)")
        if name in _PLACEMENT:
            raise Refusal(EXIT_USAGE, f"--setting {name}: the driver sets {name} itself (the checkpoint is --model)")
        low = raw.strip().lower()
        if low in ("true", "false"):
            value: Any = low == "true"
        elif low in ("none", "null"):
            value = None
        else:
            try:
                value = int(raw)
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    value = raw
        default = fields[name]
        if isinstance(default, str) and not isinstance(value, str) and value is not None:
            value = raw  # a string field given digits ("--setting kv_cache_dtype=8" stays text)
        out[name] = value
    return out


# ---- the steps as vLLM's scheduler handed them to the worker ----------------
@dataclasses.dataclass
class PlannedStep:
    """One recorded step as the worker receives it."""
    step: int
    mode: str
    output: Any  # vllm.v1.core.sched.output.SchedulerOutput
    # (request id, position, token): the recorded input token of each
    # decoding request, written where the runner keeps its last sampled token.
    feed: List[Tuple[str, int, int]]
    # request id -> its request-state slot in the recording (idx_mapping).
    slots: Dict[str, int]


def _rows(s: Dict[str, Any]) -> Dict[int, List[int]]:
    return {int(r["req_pool_index"]): [int(x) for x in (r.get("token_slots") or [])] for r in s.get("page_table") or []}


def _prompts(steps: List[Dict[str, Any]]) -> Dict[str, Tuple[int, List[int]]]:
    """Per request: (position its recorded tokens begin at, its prompt's
    tokens as far as the capture shows them). A request's prompt is what
    its steps fed while they fed more than one token (its prefill chunks),
    or, for a request first seen with one token and nothing computed, that
    token; the decode steps after feed sampled tokens."""
    out: Dict[str, Tuple[int, List[int]]] = {}
    done: set = set()
    for s in steps:
        ids, lens = s.get("request_ids") or [], [int(x) for x in s.get("extend_lens") or []]
        seq = [int(x) for x in s.get("seq_lens") or []]
        toks = [int(x) for x in s.get("token_ids") or []]
        at = 0
        for rid, n, length in zip(ids, lens, seq):
            chunk = toks[at:at + n]
            at += n
            computed = length - n
            if rid not in out:
                out[rid] = (computed, list(chunk))
                if n == 1 and computed > 0:
                    done.add(rid)  # first seen decoding: its prompt precedes the capture
                continue
            if rid in done:
                continue
            start, prompt = out[rid]
            if n > 1 and computed == start + len(prompt):
                prompt.extend(chunk)
            else:
                done.add(rid)
    return out


def scheduler_outputs(steps: List[Dict[str, Any]], max_tokens: int) -> Tuple[List[PlannedStep], List[str]]:
    """The SchedulerOutput of each recorded step (vLLM's own dataclasses),
    and notes on what the capture could not give exactly. The steps' page
    tables hold block ids (the vLLM adapter records page_table_unit
    "block")."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    notes: List[str] = []
    prompts = _prompts(steps)
    given: Dict[str, int] = {}  # request id -> blocks the worker holds for it
    live: List[str] = []
    planned: List[PlannedStep] = []
    for s in steps:
        ids = [str(r) for r in s.get("request_ids") or []]
        lens = [int(x) for x in s.get("extend_lens") or []]
        seq = [int(x) for x in s.get("seq_lens") or []]
        slots = [int(x) for x in s.get("req_pool_indices") or []]
        toks = [int(x) for x in s.get("token_ids") or []]
        pos = [int(x) for x in s.get("positions") or []]
        if not (len(ids) == len(lens) == len(seq) == len(slots)):
            raise Refusal(EXIT_DATA, f"step {s['step']}: request ids, extend_lens, seq_lens and req_pool_indices "
                                     f"differ in length ({len(ids)}, {len(lens)}, {len(seq)}, {len(slots)})")
        rows = _rows(s)
        params = list(s.get("sampling") or [])
        if len(params) != len(ids):
            params = [{"temperature": 0.0}] * len(ids)
            notes.append(f"step {s['step']} records no sampling parameters: taken as greedy")
        finished = {r for r in live if r not in ids}
        new_reqs, cached = [], CachedRequestData.make_empty()
        feed: List[Tuple[str, int, int]] = []
        at = 0
        for rid, n, length, slot, p in zip(ids, lens, seq, slots, params):
            computed = length - n
            row = rows.get(slot)
            if row is None:
                raise Refusal(EXIT_DATA, f"step {s['step']}: request {rid} (slot {slot}) has no page-table row")
            start, prompt = prompts[rid]
            if rid not in given or rid in finished:
                if start > 0 and rid not in given:
                    notes.append(f"request {rid} begins at position {start} in the capture (its earlier tokens were "
                                 "computed before it): replayed with zeros for them and its KV blocks as vLLM "
                                 "allocates them")
                known = [0] * start + prompt
                sp = SamplingParams(temperature=float(p.get("temperature", 0.0)), top_p=float(p.get("top_p", 1.0)),
                                    top_k=int(p.get("top_k", -1)) or -1, min_p=float(p.get("min_p", 0.0)),
                                    seed=None if p.get("seed") is None else int(p["seed"]), max_tokens=max_tokens)
                new_reqs.append(NewRequestData(
                    req_id=rid, prompt_token_ids=known, mm_features=[], sampling_params=sp, pooling_params=None,
                    block_ids=(list(row),), num_computed_tokens=computed, lora_request=None,
                    prefill_token_ids=known))
                given[rid] = len(row)
            else:
                have = given[rid]
                cached.req_ids.append(rid)
                cached.new_token_ids.append([])
                cached.new_block_ids.append((list(row[have:]),) if len(row) > have else None)
                cached.num_computed_tokens.append(computed)
                cached.num_output_tokens.append(max(0, length - (start + len(prompt))))
                given[rid] = max(have, len(row))
            if n == 1 and computed >= start + len(prompt) and at < len(toks):
                feed.append((rid, pos[at] if at < len(pos) else computed, toks[at]))
            at += n
        for rid in finished:
            given.pop(rid, None)
        live = ids
        out = SchedulerOutput(
            scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
            num_scheduled_tokens=dict(zip(ids, lens)), total_num_scheduled_tokens=sum(lens),
            scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={}, finished_req_ids=finished,
            free_encoder_mm_hashes=[])
        planned.append(PlannedStep(step=int(s["step"]), mode=str(s["mode"]), output=out, feed=feed,
                                   slots=dict(zip(ids, slots))))
    return planned, notes


# ---- the run -----------------------------------------------------------------
def _needs(steps: List[Dict[str, Any]]) -> Tuple[int, int]:
    """(largest block id, longest sequence) the steps use."""
    block = length = 0
    for s in steps:
        for r in s.get("page_table") or []:
            ids = r.get("token_slots") or []
            if ids:
                block = max(block, max(int(x) for x in ids))
        length = max([length] + [int(x) for x in s.get("seq_lens") or []])
    return block, length


def engine_kwargs(ckpt: str, toggles: Dict[str, Any], chosen: Dict[str, Any], max_block: int,
                  longest: int) -> Tuple[Dict[str, Any], List[str]]:
    notes: List[str] = []
    kw = recorded_engine_args(toggles)
    wide = {k: toggles.get(f"parallel_config.{k}") for k in _WIDTHS}
    wide = {k: v for k, v in wide.items() if isinstance(v, int) and not isinstance(v, bool) and v > 1}
    if wide and not any(k in chosen for k in _WIDTHS):
        notes.append(f"recorded with {', '.join(f'{k}={v}' for k, v in wide.items())}; replayed on one GPU: the same "
                     "model, its reductions in another order (--setting tensor_parallel_size=N where N GPUs are "
                     "here)")
    kw.update(chosen)
    kw["model"] = ckpt
    kw["tokenizer"] = ckpt
    if kw.get("async_scheduling"):
        # The recorded tokens are fed back from the host before each step;
        # async scheduling would take the previous step's sampled tokens
        # from the device instead (the first-generation runner).
        notes.append("recorded with async_scheduling: replayed synchronously, each step's recorded tokens fed back")
    kw["async_scheduling"] = False
    kw["skip_tokenizer_init"] = True
    # Every recorded block id must exist in the replay's KV cache.
    blocks = max(max_block + 1, int(kw.get("num_gpu_blocks_override") or 0))
    kw["num_gpu_blocks_override"] = blocks
    if kw.get("max_model_len") is not None and int(kw["max_model_len"]) < longest:
        notes.append(f"recorded max_model_len {kw['max_model_len']} is below the capture's longest sequence "
                     f"({longest}): raised to it")
        kw["max_model_len"] = longest
    return kw, notes


def _slot_of(runner: Any, rid: str) -> Optional[int]:
    """The request-state slot vLLM's runner gave a request (either runner)."""
    states = getattr(runner, "req_states", None)
    table = states.req_id_to_index if states is not None else runner.input_batch.req_id_to_index
    return table.get(rid)


def _feed_back(runner: Any, feed: List[Tuple[str, int, int]]) -> None:
    """The recorded input token of each decoding request where vLLM's runner
    takes it from: the second-generation runner's last sampled token (and the
    request's token row); the first-generation runner's host token row and
    the request's last output token (async scheduling is off in the replay,
    so no device copy of the previous step's tokens takes their place)."""
    import torch

    states = getattr(runner, "req_states", None)
    if states is None:
        batch = runner.input_batch
        for rid, position, token in feed:
            idx = batch.req_id_to_index.get(rid)
            if idx is None:
                continue
            batch.token_ids_cpu[idx, position] = token
            req = runner.requests.get(rid)
            if req is not None and req.output_token_ids:
                req.output_token_ids[-1] = token
        return
    for rid, position, token in feed:
        idx = states.req_id_to_index.get(rid)
        if idx is None:
            continue
        states.last_sampled_tokens[idx, 0] = token
        all_ids = getattr(getattr(states, "all_token_ids", None), "gpu", None)
        if isinstance(all_ids, torch.Tensor) and position < all_ids.shape[1]:
            all_ids[idx, position] = token


def replay(cap: Capture, step: int, settings: Dict[str, str], model_dir: str, out: str,
           result: Dict[str, Any]) -> None:
    import torch

    # Whatever the capture: without a device none of vLLM's model runs here.
    if not torch.cuda.is_available():
        raise Refusal(EXIT_NO_DEVICE,
                      "vLLM runs its model only on a GPU here: its PyPI wheel has no CPU kernels (the CPU platform "
                      "needs a VLLM_TARGET_DEVICE=cpu build), and torch sees no CUDA device; replay it on a machine "
                      "with one, or with --engine crashreplay")
    engine = cap.manifest.get("engine", "")
    if engine != "vllm":
        raise Refusal(EXIT_DATA, f"the capture was recorded by '{engine}', not vLLM: replay it with --engine {engine}"
                      if engine else "the capture names no engine")
    version = _version()
    result["version"] = version
    check_version("vllm", version)
    chosen = check_settings(settings)
    steps = cap.steps_through(step)
    ckpt = checkpoint_dir(cap, model_dir)
    max_block, longest = _needs(cap.steps)
    kw, notes = engine_kwargs(ckpt, cap.toggles, chosen, max_block, longest)
    result["notes"].extend(notes)
    planned, plan_notes = scheduler_outputs(steps, max_tokens=max(1, int(kw.get("max_model_len") or longest) - 1))
    result["notes"].extend(plan_notes)

    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.executor.abstract import Executor

    try:
        vllm_config = EngineArgs(**kw).create_engine_config()
    except Exception as e:  # noqa: BLE001 - vLLM's validation names the field
        raise Refusal(EXIT_USAGE, f"vLLM refused the configuration (EngineArgs): {type(e).__name__}: {e}") from e
    core = EngineCore(vllm_config, executor_class=Executor.get_class(vllm_config), log_stats=False)
    executor = core.model_executor
    worker = getattr(getattr(executor, "driver_worker", None), "worker", None)
    runner = getattr(worker, "model_runner", None)
    if runner is None or not (hasattr(runner, "req_states") or hasattr(runner, "input_batch")):
        raise Refusal(EXIT_USAGE, "the vLLM driver feeds recorded tokens through an in-process worker's model "
                                  f"runner; this configuration gave {type(executor).__name__} without one")
    cc = vllm_config.cache_config
    result["applied"] = {"checkpoint": ckpt, "device": "cuda", "attention_backend": kw.get("attention_backend"),
                         "kv_cache_dtype": cc.cache_dtype, "block_size": cc.block_size,
                         "dtype": str(vllm_config.model_config.dtype).replace("torch.", ""),
                         "enforce_eager": vllm_config.model_config.enforce_eager,
                         "num_gpu_blocks": cc.num_gpu_blocks, "engine_args": {k: v for k, v in kw.items()
                                                                              if k not in ("model", "tokenizer")}}
    # The recorder, after vLLM's warm-up (its dummy runs are not steps).
    from crashreplay import vllm as cr_vllm

    session = os.path.join(out, "session")
    os.environ["CRASHREPLAY_DIR"] = session
    cr_vllm.install()
    adapter = cr_vllm.attach(runner, session, fingerprints=True)
    cr_vllm.record_weights(adapter, runner)
    result["session"] = session
    tokens: List[Dict[str, Any]] = []
    result["steps_run"] = 0
    result["failure"] = None
    current, mode = -1, ""
    every = cap.steps
    try:
        for i, ps in enumerate(planned):
            current, mode = ps.step, ps.mode
            adapter.step = current
            _feed_back(runner, ps.feed)
            executor.execute_model(ps.output)
            output = executor.sample_tokens(None)
            if hasattr(output, "result"):  # a Future (an executor of other processes)
                output = output.result()
            if hasattr(output, "get_output"):  # async scheduling's AsyncModelRunnerOutput
                output = output.get_output()
            result["steps_run"] = i + 1
            moved = {rid: _slot_of(runner, rid) for rid in ps.slots}
            moved = {r: (ps.slots[r], v) for r, v in moved.items() if v is not None and v != ps.slots[r]}
            if moved and i == 0:
                result["notes"].append(f"vLLM gave other request-state slots than the recording's (request: "
                                       f"(recorded, replayed)): {moved}")
            nxt = next((t for t in every if int(t["step"]) == current + 1), None)
            pairs = _continuations(ps, nxt)
            if pairs and output is not None:
                sampled = dict(zip(output.req_ids, output.sampled_token_ids))
                tokens.append({"step": current, "recorded": [t for _, t in pairs],
                               "replayed": [int(sampled[r][-1]) if sampled.get(r) else None for r, _ in pairs]})
    except Exception as e:  # noqa: BLE001 - the engine's failure is the result
        record_exception(result, e, current, mode)
    finally:
        adapter.recorder.close()
        try:
            core.shutdown()
        except Exception:  # noqa: BLE001 - a failed step can leave the device unusable
            pass
    result["tokens"] = tokens
    result["sampled"] = []
    result["sampling"] = ("every sampled token compared: vLLM's sampler draws from the recorded per-request seed and "
                          "the position (greedy requests take the argmax)")


def _continuations(ps: PlannedStep, nxt: Optional[Dict[str, Any]]) -> List[Tuple[str, int]]:
    """(request id, the token the next step feeds it) for each request of
    the step that the next step continues with one token."""
    if nxt is None:
        return []
    ids = [str(r) for r in nxt.get("request_ids") or []]
    lens = [int(x) for x in nxt.get("extend_lens") or []]
    toks = [int(x) for x in nxt.get("token_ids") or []]
    out, at = [], 0
    for rid, n in zip(ids, lens):
        if n == 1 and rid in ps.slots and at < len(toks):
            out.append((rid, toks[at]))
        at += n
    return out
