"""The sglang driver of crashreplay.engine_replay.

Re-executes a capture recorded by crashreplay.sglang in sglang's own
ModelRunner, on the CPU (crashreplay._sglang_cpu_runner says what of
sglang runs and what stands in for the Scheduler around it):

  * configuration: every ServerArgs field the manifest records (the values
    sglang resolved), then the --setting overrides (ServerArgs fields under
    their own names: attention_backend, kv_cache_dtype, page_size, dtype,
    ...), then what the CPU forces: device cpu, an attention backend whose
    kernels run here (the recorded one when it is torch_native or
    flex_attention, else torch_native), sampling_backend pytorch, no CUDA
    graphs, one process, and the other kernel-backend fields left to
    sglang's choice for the CPU. The pools are sized to the recorded slots
    and rows. Recorded environment switches of sglang's envs registry that
    this process reads otherwise are set first (unless set here).
    result["applied"] holds the resolved configuration that ran and every
    ServerArgs field whose resolved value differs from the recording's;
    result["notes"] says why where it is the CPU's doing;
  * steps 0..N: each step's recorded rows of KV slots are written into
    sglang's ReqToTokenPool at the recorded req_pool_indices, and a
    ForwardBatch (EXTEND, DECODE or MIXED) is built from its recorded token
    ids, positions, seq_lens, extend_lens, out_cache_loc, request ids and
    sampling parameters; TpModelWorker.forward_batch_generation runs
    ModelRunner.forward (the KV written at the recorded slots) and sglang's
    sampler. The recorded tokens are fed back whatever was sampled. A step
    that reads slots no replayed step wrote (a capture that begins after
    its requests' prefill, a prefix from the radix cache filled before the
    capture) is replayed on an empty cache there, with a note;
  * tokens: a step whose requests are all greedy (top_k 1 after sglang's
    normalisation) or all seeded (sampling_seed, which sglang's sampler
    uses only under enable_deterministic_inference: it draws from (seed,
    position)) is compared with the next step's recorded token ids
    (result["tokens"]); others draw from torch's generator, seeded with the
    first step's recorded rng_seed, and are reported (result["sampled"]).
    Each compared token is the one sglang sampled for a request that the
    next step continues with one token at the next position (a finished
    request, or a prefill continued in another chunk, has none);
  * recording: crashreplay.sglang.attach() on the replay's runner records it
    into OUT/session with fingerprints on: the same step records, boundary
    names and summaries as the original session's, and an exception sglang
    raises is written there as a failure record (and reported in
    result["failure"], not raised).

On a GPU: --setting device=cuda runs the same steps in sglang on this
machine's CUDA device with the recorded kernel backends (attention,
sampling, MoE and GEMM runners, CUDA graphs) unless a setting names others;
sglang's own checks decide what the device runs, one process (tp 1). Not
yet run on a GPU here: python/tests/test_engine_replay_sglang.py's GPU test
runs it (scripts/test-engines.sh on a machine with one).

Refusals: a capture from another engine (3), a setting that is no ServerArgs
field or a configuration sglang refuses (2), an attention or sampling
backend, device or CUDA-graph setting that needs a GPU (7), an sglang
outside 0.5.x (9). sglang's refusals of the configuration come with its
own message (a recorded enable_deterministic_inference, for one: sglang
allows it only with GPU attention backends; --setting
enable_deterministic_inference=false replays such a capture, its seeded
requests then reported as sampled).
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from crashreplay.engine_replay import (
    EXIT_DATA,
    EXIT_USAGE,
    Capture,
    Refusal,
    check_version,
    checkpoint_dir,
    record_exception,
)

_SAMPLING_EPS = 1e-6  # sglang's: a temperature below it is greedy


def _greedy(p: Dict[str, Any]) -> bool:
    return int(p.get("top_k", -1)) == 1 or float(p.get("temperature", 1.0)) < _SAMPLING_EPS


def _needs(steps: List[Dict[str, Any]]) -> Tuple[int, int, int]:
    """(largest KV slot, largest request row, longest row) the steps use."""
    slot = row = width = 0
    for s in steps:
        slot = max([slot] + [int(x) for x in s.get("out_cache_loc") or []])
        row = max([row] + [int(x) for x in s.get("req_pool_indices") or []])
        for r in s.get("page_table") or []:
            slots = r.get("token_slots") or []
            row = max(row, int(r["req_pool_index"]))
            width = max(width, len(slots))
            if slots:
                slot = max(slot, max(int(x) for x in slots))
        width = max([width] + [int(x) for x in s.get("seq_lens") or []])
    return slot, row, width


def _version() -> str:
    """sglang's version from its distribution's metadata: importing sglang
    itself takes seconds, and a refusal should not wait for it."""
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:  # a source tree on the path, or no sglang (ImportError then)
        from crashreplay import sglang as cr_sglang

        return cr_sglang._sglang_version()


def _resolved_differences(server_args: Any, toggles: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """ServerArgs fields whose value as sglang resolved it here differs from
    the recording's, both in the manifest's form."""
    from sglang.srt.server_args import ServerArgs

    from crashreplay import sglang as cr_sglang
    from crashreplay._manifest import config_to_toggles

    now = dict(config_to_toggles(cr_sglang._fields(server_args)))
    out = {}
    for name in ServerArgs.__struct_fields__:
        if name in toggles and name in now and now[name] != toggles[name]:
            out[name] = {"recorded": toggles[name], "replayed": now[name]}
    return out


def _unwritten(s: Dict[str, Any], written: Any) -> int:
    """How many slots the step reads (each request's prefix) that no replayed step wrote."""
    missing = 0
    lens = dict(zip([int(x) for x in s.get("req_pool_indices") or []], s.get("extend_lens") or []))
    for r in s.get("page_table") or []:
        slots = r.get("token_slots") or []
        prefix = slots[:max(0, len(slots) - int(lens.get(int(r["req_pool_index"]), 1)))]
        missing += sum(1 for x in prefix if not written[int(x)])
    return missing


def replay(cap: Capture, step: int, settings: Dict[str, str], model_dir: str, out: str,
           result: Dict[str, Any], rank: int = 0, port: Optional[int] = None) -> None:
    """rank, port: a peer rank of a --setting tp_size=N replay (started by
    rank 0, which passes 0 and None and writes the result)."""
    engine = cap.manifest.get("engine", "")
    if engine != "sglang":
        raise Refusal(EXIT_DATA, f"the capture was recorded by '{engine}', not sglang: replay it with "
                                 f"--engine {engine}" if engine else "the capture names no engine")
    version = _version()
    result["version"] = version
    check_version("sglang", version)
    steps = cap.steps_through(step)
    ckpt = checkpoint_dir(cap, model_dir)

    from crashreplay import _sglang_cpu_runner as cpu_runner

    # Before the rest of sglang is imported: some of its modules read their
    # switches once, at import (a --setup module that imports sglang has
    # fixed those already).
    env = cpu_runner.recorded_env(cap.toggles)
    os.environ.update(env)
    chosen = cpu_runner.check_settings(settings)
    recorded, unreadable = cpu_runner.recorded_server_args(cap.toggles)
    max_slot, max_row, width = _needs(steps)
    page = int(chosen.get("page_size") or recorded.get("page_size") or 1)
    # Every recorded slot, in whole pages; and at least two a request row:
    # sglang caps max_running_requests at half the KV pool's tokens.
    kv_tokens = max(max_slot // page + 2, -(-2 * (max_row + 1) // page)) * page
    kwargs, notes = cpu_runner.server_args_kwargs(ckpt, recorded, chosen, max_total_tokens=kv_tokens,
                                                  max_running_requests=max_row + 1)
    result["notes"].extend(notes)
    if unreadable:
        result["notes"].append(f"recorded ServerArgs fields left to sglang's default (their recorded values do not "
                               f"read back as the field's type): {', '.join(unreadable)}")
    ranks = int(kwargs.get("tp_size") or 1)
    peers: List[Any] = []
    if ranks > 1 and rank == 0:
        port = cpu_runner._free_port()
        peers = _start_peers(cap.path, step, settings, model_dir, out, ranks, port, result.get("setup") or [])
        result["notes"].append(f"tp_size={ranks}: {ranks} sglang ranks, one process each, their groups over gloo; "
                               f"rank 0 judged, every rank recorded in the session")
    try:
        cpu = cpu_runner.build(ckpt, kwargs, rank, port)
    except BaseException:
        _stop_peers(peers)
        raise
    result["notes"].extend(cpu.notes)
    import numpy as np
    import torch

    runner = cpu.runner
    rows, cols = cpu.req_to_token.shape
    if max_row >= rows or width > cols:
        raise Refusal(EXIT_DATA, f"sglang made a ReqToTokenPool of {rows} rows x {cols} tokens; the capture uses row "
                                 f"{max_row} and rows of {width} tokens (context_length "
                                 f"{cpu.model_config.context_len})")
    if max_slot >= runner.max_total_num_tokens + page:
        raise Refusal(EXIT_DATA, f"sglang made a KV pool of {runner.max_total_num_tokens} tokens; the capture writes "
                                 f"slot {max_slot}")
    sa = cpu.server_args
    result["applied"] = {
        "checkpoint": ckpt, "device": cpu.device, "attention_backend": sa.attention_backend,
        "prefill_attention_backend": runner.prefill_attention_backend_str,
        "decode_attention_backend": runner.decode_attention_backend_str,
        "sampling_backend": sa.sampling_backend, "kv_cache_dtype": sa.kv_cache_dtype,
        "kv_cache_torch_dtype": str(runner.kv_cache_dtype).replace("torch.", ""),
        "dtype": sa.dtype, "model_dtype": str(runner.dtype).replace("torch.", ""), "page_size": sa.page_size,
        "max_total_tokens": runner.max_total_num_tokens, "max_running_requests": runner.max_running_requests,
        "random_seed": sa.random_seed, "env": env,
        "changed": _resolved_differences(sa, cap.toggles)}
    session = os.path.join(out, "session")
    adapter = cpu.attach(session, fingerprints=True)
    result["session"] = session
    written = np.zeros(runner.max_total_num_tokens + page, dtype=bool)
    every = cap.steps
    tokens: List[Dict[str, Any]] = []
    sampled: List[Dict[str, Any]] = []
    compared_all = True
    current, mode = -1, ""
    result["steps_run"] = 0
    result["failure"] = None  # the contract's null until sglang raises
    # Unseeded sampling draws from torch's generator: the same draws run
    # after run (the recording's state at each step is not in the capture).
    torch.manual_seed(int(steps[0].get("rng_seed", 0) or 0))
    try:
        for i, s in enumerate(steps):
            current, mode = int(s["step"]), str(s["mode"])
            n = len(s.get("seq_lens") or [])
            if mode == "idle" or n == 0:
                result["notes"].append(f"step {current} ({mode}) has no requests on this rank: not run")
                result["steps_run"] = i + 1
                continue
            missing = _unwritten(s, written)
            if missing:
                result["notes"].append(f"step {current} reads {missing} KV slots no replayed step wrote (computed "
                                       "before the capture begins): they hold zeros here")
            cpu.write_rows((int(r["req_pool_index"]), r.get("token_slots") or []) for r in s.get("page_table") or [])
            params: List[Dict[str, Any]] = list(s.get("sampling") or [])
            if len(params) != n:
                params = [{"temperature": 0.0}] * n
                result["notes"].append(f"step {current} records no sampling parameters: taken as greedy")
            fb = cpu.forward_batch(mode=mode, token_ids=s["token_ids"], positions=s["positions"],
                                   seq_lens=s["seq_lens"], extend_lens=s.get("extend_lens") or [1] * n,
                                   req_pool_indices=s["req_pool_indices"], out_cache_loc=s["out_cache_loc"],
                                   sampling=params, rids=s.get("request_ids") or None)
            adapter.step = current  # the adapter numbers the forwards it records: the recorded step's number
            # Sampling runs outside ModelRunner.forward (the adapter's hook):
            # its failure is recorded here, as the server's event-loop hook would.
            with adapter.recorder.failure_hook(step=current, stage=mode):
                chosen_ids = cpu.generate(fb)
            written[[int(x) for x in s["out_cache_loc"]]] = True
            result["steps_run"] = i + 1
            # Seeds reach sglang's sampler only under enable_deterministic_inference.
            seeded = fb.sampling_info.sampling_seed is not None and all(p.get("seed") is not None for p in params)
            compared = all(_greedy(p) for p in params) or seeded
            compared_all &= compared
            pairs = _continuations(s, _next_step(every, current))
            if pairs:
                row = {"step": current, "recorded": [t for _, t in pairs],
                       "replayed": [chosen_ids[j] for j, _ in pairs]}
                (tokens if compared else sampled).append(row)
    except Exception as e:  # noqa: BLE001 - the engine's failure is the result
        record_exception(result, e, current, mode)
    finally:
        adapter.recorder.close()
    for note in _wait_peers(peers):
        result["notes"].append(note)
        if result["failure"] is None:
            result["failure"] = {"type": "crashreplay.PeerRankFailed", "short_type": "PeerRankFailed",
                                 "message": note, "step": current, "mode": mode}
    result["tokens"] = tokens
    result["sampled"] = sampled
    result["sampling"] = ("greedy or seeded: every sampled token compared with the recorded one" if compared_all else
                          "steps with unseeded non-greedy requests draw from torch's generator seeded here, not the "
                          "recording's state: their tokens are reported (sampled), not compared; the recorded tokens "
                          "are fed back")


def _start_peers(capture: str, step: int, settings: Dict[str, str], model_dir: str, out: str, ranks: int,
                 port: int, setup: List[str]) -> List[Any]:
    """Ranks 1..N-1 of a tensor-parallel replay, each this module in a
    process of this Python, replaying the same steps (TP ranks serve the same
    batches) and recording its own rank file of OUT/session."""
    import subprocess
    import sys

    procs = []
    for r in range(1, ranks):
        cmd = [sys.executable, "-m", "crashreplay._replay_sglang", "--rank", str(r), "--port", str(port),
               "--capture", capture, "--step", str(step), "--out", out]
        cmd += ["--model", model_dir] if model_dir else []
        cmd += [a for k, v in settings.items() for a in ("--setting", f"{k}={v}")]
        cmd += [a for m in setup for a in ("--setup", m)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    return procs


def _stop_peers(peers: List[Any]) -> None:
    for p in peers:
        p.kill()
        p.wait()


def _wait_peers(peers: List[Any], timeout: float = 600.0) -> List[str]:
    """Waits for the peer ranks; a note for each that failed."""
    import subprocess

    notes = []
    for r, p in enumerate(peers, start=1):
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            notes.append(f"rank {r} did not finish within {timeout:.0f} s (killed)")
            continue
        if p.returncode != 0:
            tail = (err or "").strip().splitlines()[-3:]
            notes.append(f"rank {r} exited {p.returncode}: {' | '.join(tail)}")
    return notes


def _peer_main(argv: Optional[List[str]] = None) -> int:
    """One peer rank (see _start_peers): exit 0 when its steps ran, 1 when
    sglang raised (recorded in its rank file), the Refusal's code otherwise."""
    import argparse
    import importlib
    import sys

    from crashreplay.engine_replay import parse_settings

    p = argparse.ArgumentParser(prog="python -m crashreplay._replay_sglang")
    for flag in ("--rank", "--port", "--step"):
        p.add_argument(flag, type=int, required=True)
    p.add_argument("--capture", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="")
    p.add_argument("--setting", action="append", default=[])
    p.add_argument("--setup", action="append", default=[])
    a = p.parse_args(argv)
    result: Dict[str, Any] = {"notes": []}
    try:
        for m in a.setup:
            importlib.import_module(m)
        replay(Capture(a.capture), a.step, parse_settings(a.setting), a.model, a.out, result, rank=a.rank,
               port=a.port)
    except Refusal as e:
        print(f"rank {a.rank}: {e}", file=sys.stderr)
        return e.code
    if result.get("failure"):
        print(f"rank {a.rank}: {result['failure']['short_type']}: {result['failure']['message']}", file=sys.stderr)
        return 1
    return 0


def _next_step(every: List[Dict[str, Any]], current: int) -> Optional[Dict[str, Any]]:
    return next((t for t in every if int(t["step"]) == current + 1), None)


def _segments(s: Dict[str, Any]) -> List[Tuple[int, int, int]]:
    """Each request's (req_pool_index, first token's index, extend_len) in a step."""
    lens = [int(x) for x in s.get("extend_lens") or [1] * len(s.get("seq_lens") or [])]
    out, at = [], 0
    for rp, n in zip(s.get("req_pool_indices") or [], lens):
        out.append((int(rp), at, n))
        at += n
    return out


def _continuations(s: Dict[str, Any], nxt: Optional[Dict[str, Any]]) -> List[Tuple[int, int]]:
    """(request index in s, the token the next step feeds it) for each request
    of s that the next step continues with one new token at the position
    after its last one: the token sampled from s's logits. A request that
    finished, or whose prefill goes on in another chunk, has none."""
    if nxt is None:
        return []
    pos, npos, ntok = s["positions"], nxt["positions"], nxt["token_ids"]
    following = {rp: (at, n) for rp, at, n in _segments(nxt)}
    out = []
    for i, (rp, at, n) in enumerate(_segments(s)):
        if n == 0 or rp not in following:
            continue
        nat, nn = following[rp]
        if nn == 1 and int(npos[nat]) == int(pos[at + n - 1]) + 1:
            out.append((i, int(ntok[nat])))
    return out


if __name__ == "__main__":
    import sys

    # Run as the package's module: Refusal must be crashreplay.engine_replay's.
    from crashreplay import _replay_sglang

    sys.exit(_replay_sglang._peer_main())
