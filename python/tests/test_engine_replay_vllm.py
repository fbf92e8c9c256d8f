"""`replay --engine vllm`: a capture re-executed by vLLM's own engine.

vLLM's PyPI wheel runs its model on a GPU only, so on a CPU these tests
hold what runs there against vLLM's own classes: the refusal (exit 7), the
driver's SchedulerOutputs rebuilt from a capture recorded from vLLM's
BlockPool, InputBatch and sampler states (vllm_worker_child.py), built from
vLLM's dataclasses and checked against the schedule the child served and
the blocks vLLM's allocator gave, and the configuration as vLLM's
EngineArgs. The GPU tests (skipped without a CUDA device; run by
tests/gpu/run_bundle.sh where vLLM is installed) record a session through
vllm.LLM with the crashreplay plugin and replay it in vLLM: reproduced,
every greedy token the same. Needs torch and vLLM (scripts/test-engines.sh)."""
import json
import os
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

import crashreplay  # noqa: E402
from crashreplay import _replay_vllm as driver  # noqa: E402
from crashreplay.engine_replay import Capture, Refusal  # noqa: E402

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
CHILD = os.path.join(os.path.dirname(__file__), "vllm_worker_child.py")
VOCAB = 300
# Three requests of different lengths; the first crosses into its second
# 16-token block during decode (position 16), so a later step appends one.
SCHEDULE = {"block_size": 16, "seed": 5, "decode_steps": 4,
            "requests": [{"rid": "req-a", "prompt": list(range(1, 16))},
                         {"rid": "req-b", "prompt": [9, 8, 7]},
                         {"rid": "req-c", "prompt": [(7 * i) % VOCAB + 1 for i in range(33)], "temperature": 0.8,
                          "seed": 11}]}


def run(*args, timeout=600, env=None):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, check=False, timeout=timeout,
                          env=env)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A session recorded from vLLM's own classes on the CPU (vllm_worker_child.py)."""
    if not os.path.exists(BIN):
        pytest.skip("needs the crashreplay binary (CRASHREPLAY_BIN)")
    tmp = tmp_path_factory.mktemp("vllm")
    ckpt = tmp / "llama"
    r = run("make-model", ckpt, "--arch", "llama", "--quant", "bf16", "--vocab", VOCAB, timeout=120)
    assert r.returncode == 0, r.stderr
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, CHILD, str(ckpt), str(tmp / "session"), str(free_port()),
                        json.dumps(SCHEDULE)], env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0 and "InputBatch" in r.stderr and "unexpected keyword" in r.stderr:
        pytest.skip("this vLLM's InputBatch is not the one vllm_worker_child.py builds")
    assert r.returncode == 0, r.stderr[-4000:]
    return ckpt, tmp / "session"


def test_on_a_cpu_vllm_refuses_with_exit_7_and_says_why(recorded):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the refusal is for CPUs")
    _, session = recorded
    r = run("replay", session, "--json", "--engine", "vllm", "--engine-python", sys.executable)
    assert r.returncode == 7, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["outcome"] == "untestable" and "VLLM_TARGET_DEVICE=cpu" in rep["refused"]


def test_an_engine_python_that_cannot_start_is_a_usage_error(recorded, tmp_path):
    _, session = recorded
    r = run("replay", session, "--json", "--engine", "vllm", "--engine-python", tmp_path / "no-such-python")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cannot start the engine's Python" in r.stderr and "--engine-python PATH" in r.stderr


def test_scheduler_outputs_rebuild_what_vllms_scheduler_handed_the_worker(recorded):
    _, session = recorded
    cap = Capture(str(session))
    plan, notes = driver.scheduler_outputs(cap.steps, max_tokens=64)
    assert notes == []
    assert [p.mode for p in plan] == ["prefill"] + ["decode"] * SCHEDULE["decode_steps"]
    from vllm.v1.core.sched.output import SchedulerOutput

    assert all(isinstance(p.output, SchedulerOutput) for p in plan)
    reqs = SCHEDULE["requests"]
    first = plan[0].output
    # The prompts are the ones the child served, each with vLLM's sampling parameters.
    assert [r.req_id for r in first.scheduled_new_reqs] == [q["rid"] for q in reqs]
    assert [r.prompt_token_ids for r in first.scheduled_new_reqs] == [q["prompt"] for q in reqs]
    assert [r.num_computed_tokens for r in first.scheduled_new_reqs] == [0, 0, 0]
    assert first.num_scheduled_tokens == {q["rid"]: len(q["prompt"]) for q in reqs}
    sp = first.scheduled_new_reqs[2].sampling_params
    assert sp.temperature == pytest.approx(0.8) and sp.seed == 11
    # Each request's blocks, as the worker accumulates them (new, then
    # appended), are the ones vLLM's BlockPool gave it, step by step.
    held = {r.req_id: list(r.block_ids[0]) for r in first.scheduled_new_reqs}
    appended = 0
    for k, (p, s) in enumerate(zip(plan, cap.steps)):
        c = p.output.scheduled_cached_reqs
        for rid, new in zip(c.req_ids, c.new_block_ids):
            if new is not None:
                held[rid] += list(new[0])
                appended += 1
        rows = {r["req_pool_index"]: list(r["token_slots"]) for r in s["page_table"]}
        for rid, slot in zip(s["request_ids"], s["req_pool_indices"]):
            assert held[rid] == rows[slot], (k, rid)
        if k:
            assert c.req_ids == [q["rid"] for q in reqs]
            # The decode tokens the child fed ((5 * step + 13 * i + 1) % vocab)
            # go where vLLM's runner takes a decoding request's input from.
            assert p.feed == [(q["rid"], len(q["prompt"]) + k - 1, (5 * (k - 1) + 13 * i + 1) % VOCAB)
                              for i, q in enumerate(reqs)]
            assert c.num_computed_tokens == [len(q["prompt"]) + k - 1 for q in reqs]
            assert c.num_output_tokens == [k] * 3
    assert appended == 1  # req-a's second block, at position 16


def test_a_request_that_leaves_is_finished_and_one_that_joins_is_new():
    """The batch's make-up changing between recorded steps, in vLLM's words."""
    pytest.importorskip("vllm.v1.core.sched.output")

    def step(n, mode, reqs):
        return {"step": n, "mode": mode, "request_ids": [r[0] for r in reqs], "extend_lens": [len(r[2]) for r in reqs],
                "seq_lens": [r[1] + len(r[2]) for r in reqs], "req_pool_indices": [r[3] for r in reqs],
                "token_ids": [t for r in reqs for t in r[2]],
                "positions": [r[1] + j for r in reqs for j in range(len(r[2]))],
                "page_table": [{"req_pool_index": r[3], "token_slots": r[4]} for r in reqs],
                "sampling": [{"temperature": 0.0}] * len(reqs)}

    steps = [step(0, "prefill", [("x", 0, [1, 2, 3], 7, [4]), ("y", 0, [5, 6], 6, [5])]),
             step(1, "decode", [("x", 3, [9], 7, [4]), ("y", 2, [8], 6, [5])]),
             # y finished; z joins with a chunk of its prompt beside x's decode
             step(2, "extend", [("x", 4, [10], 7, [4]), ("z", 0, [20, 21, 22, 23], 6, [9])]),
             step(3, "extend", [("x", 5, [11], 7, [4]), ("z", 4, [24, 25], 6, [9])])]
    plan, notes = driver.scheduler_outputs(steps, max_tokens=8)
    assert notes == []
    assert plan[2].output.finished_req_ids == {"y"}
    (z,) = plan[2].output.scheduled_new_reqs
    # z's prompt is both its chunks: vLLM's worker holds the whole prompt and
    # feeds it chunk by chunk from its computed-token count.
    assert z.req_id == "z" and z.prompt_token_ids == [20, 21, 22, 23, 24, 25] and z.block_ids == ([9],)
    assert plan[3].output.scheduled_cached_reqs.req_ids == ["x", "z"]
    assert plan[3].output.scheduled_cached_reqs.num_computed_tokens == [5, 4]
    # Only decoding requests are fed a recorded token (z's chunk comes from its prompt).
    assert plan[3].feed == [("x", 5, 11)]


def test_the_recorded_configuration_becomes_vllms_engine_args(recorded):
    ckpt, session = recorded
    cap = Capture(str(session))
    chosen = driver.check_settings({"attention_backend": "FLASHINFER", "enforce_eager": "true", "block_size": "32"})
    kw, _ = driver.engine_kwargs(str(ckpt), cap.toggles, chosen, *driver._needs(cap.steps))
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(**kw)  # every keyword is one of vLLM's
    assert args.attention_backend == "FLASHINFER" and args.enforce_eager is True and args.block_size == 32
    assert args.dtype == "bfloat16" and args.seed == SCHEDULE["seed"]  # as recorded
    assert args.model == str(ckpt) and args.num_gpu_blocks_override >= 1 + max(
        x for s in cap.steps for r in s["page_table"] for x in r["token_slots"])
    with pytest.raises(Refusal) as e:
        driver.check_settings({"attention_bakend": "FLASHINFER"})
    assert e.value.code == 2 and "did you mean attention_backend" in str(e.value)


# ---- on a GPU ----------------------------------------------------------------
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (vLLM runs on GPUs only)")


@needs_gpu
def test_a_session_vllm_served_replays_reproduced_in_vllm(tmp_path):
    """vllm.LLM serves three greedy prompts with the crashreplay plugin
    recording; the replay in vLLM gives back every token."""
    ckpt = tmp_path / "llama"
    r = run("make-model", ckpt, "--arch", "llama", "--quant", "bf16", "--vocab", VOCAB, timeout=120)
    assert r.returncode == 0, r.stderr
    script = (
        "import json, sys\n"
        "from vllm import LLM, SamplingParams\n"
        "from vllm.inputs import TokensPrompt\n"
        f"llm = LLM(model={str(ckpt)!r}, skip_tokenizer_init=True, enforce_eager=True, gpu_memory_utilization=0.3,"
        " max_model_len=256, seed=3)\n"
        "prompts = [TokensPrompt(prompt_token_ids=p) for p in ([1, 2, 3, 4, 5], list(range(10, 40)), [7, 7, 9])]\n"
        "outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True))\n"
        "print(json.dumps([list(o.outputs[0].token_ids) for o in outs]))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), CRASHREPLAY_DIR=str(tmp_path / "session"),
               CRASHREPLAY_FINGERPRINTS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    served = json.loads(r.stdout.strip().splitlines()[-1])
    f = crashreplay.read_capture(str(tmp_path / "session"))["files"][0]
    last = max(int(s["step"]) for s in f["step_records"])
    r = run("replay", tmp_path / "session", "--json", "--engine", "vllm", "--engine-python", sys.executable,
            "--step", last, "--engine-out", tmp_path / "out", timeout=900)
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["outcome"] == "reproduced", r.stdout + r.stderr
    result = json.load(open(tmp_path / "out" / "result.json"))
    assert result["failure"] is None and result["steps_run"] == last + 1
    assert all(t["recorded"] == t["replayed"] for t in result["tokens"]) and result["tokens"]
    assert len(served) == 3 and all(len(t) == 9 for t in served)
