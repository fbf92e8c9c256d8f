"""transformers as a recorded engine (crashreplay.transformers): the real
model's generate() in float16 overflows at one layer and dies in sampling
with torch's own error; the capture says where, and replay and bisect find
it. Needs torch and transformers (scripts/test-engines.sh installs them);
skipped elsewhere.

The checkpoint is a random 4-layer llama written by transformers'
save_pretrained in float16, with layer 2's up_proj scaled by 2^8 and
down_proj by 2^16 (exact exponent shifts): its MLP output reaches ~1.5e5,
which bf16 and fp32 hold and fp16 does not."""
import json
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import crashreplay.transformers as crt  # noqa: E402

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
LAYER = 2
PROMPT = [[1, 17, 42, 99, 7, 8, 150, 33]]


def run(*args):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, check=False)


def checkpoint(d, hot):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=300, max_position_embeddings=256,
                                   bos_token_id=1, eos_token_id=2)
    m = transformers.LlamaForCausalLM(cfg)
    if hot:
        with torch.no_grad():
            m.model.layers[LAYER].mlp.up_proj.weight.mul_(2.0 ** 8)
            m.model.layers[LAYER].mlp.down_proj.weight.mul_(2.0 ** 16)
    m.to(torch.float16).save_pretrained(d)
    return transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float16)


def generate(model, ckpt, session):
    with crt.record(model, str(session), checkpoint_path=str(ckpt), install_signal_handlers=False):
        return model.generate(input_ids=torch.tensor(PROMPT), do_sample=True, max_new_tokens=4)


def replay(cap, *args):
    args = ["replay", cap, "--json", *args]
    r = run(*args)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


@pytest.fixture(scope="module")
def failing(tmp_path_factory):
    root = tmp_path_factory.mktemp("tf")
    model = checkpoint(root / "ckpt", hot=True)
    with pytest.raises(RuntimeError, match=r"probability tensor contains either `inf`, `nan` or element < 0"):
        generate(model, root / "ckpt", root / "session")
    return root / "session"


def test_a_healthy_run_replays_every_step_reproduced(tmp_path):
    model = checkpoint(tmp_path / "ckpt", hot=False)
    out = generate(model, tmp_path / "ckpt", tmp_path / "session")
    steps = out.shape[1] - len(PROMPT[0])
    for step in range(steps):
        rc, rep = replay(tmp_path / "session", "--step", step)
        assert rc == 0 and rep["outcome"] == "reproduced", rep["detail"]
        assert rep["weights"] == "verified 39 tensors of 1 rank (transformers layout)"
        assert rep["fingerprints"]["compared"] == 19
        assert rep["config"]["activation_dtype"] == "fp16"


def test_info_names_the_overflowing_layer(failing):
    info = json.loads(run("info", failing, "--json").stdout)
    first = info["first_nonfinite_boundary"]
    assert first["boundary"] == f"L{LAYER}.mlp", first
    assert first["pos_inf"] + first["neg_inf"] > 0 and first["dtype"] == "F16"
    (f,) = info["files"][0]["failure_records"]
    assert "probability tensor contains" in f["reason"] and f["step"] == 0


def test_fp16_replay_reproduces_the_failure_at_that_boundary(failing):
    rc, rep = replay(failing, "--set", "activation_dtype=fp16")
    assert rc == 1 and rep["outcome"] == "failed"
    assert rep["signature"]["kernel"] == "sampler" and rep["signature"]["check"] == "probs_finite"
    assert "engine_divergence" not in rep  # the replay computed what the engine did
    assert rep["first_nonfinite_kernel"] == f"L{LAYER}.down_proj"


def test_bf16_replay_is_finite_and_reports_the_divergence_there(failing):
    rc, rep = replay(failing, "--set", "activation_dtype=bf16")
    assert rc == 1 and rep["outcome"] == "diverged"
    d = rep["engine_divergence"]
    assert d["boundary"] == f"L{LAYER}.mlp"
    assert d["replay"]["pos_inf"] + d["replay"]["neg_inf"] + d["replay"]["nan"] == 0
    assert d["replay"]["max_abs"] > 65504


def test_bisect_over_the_dtype_finds_it(failing, tmp_path):
    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    good.write_text('activation_dtype = "bf16"\n')
    bad.write_text('activation_dtype = "fp16"\n')
    r = run("bisect", failing, "--good", good, "--bad", bad, "--json", "--quiet", "--workdir", tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["culprit"] == {"activation_dtype": "fp16"}
    assert rep["first_bad_kernel"]["kernel"] == f"L{LAYER}.down_proj"


def test_an_output_changed_in_place_later_is_never_recorded_stale(tmp_path):
    # The recorder's hooks only note a boundary's output and summarise the
    # step at its end; a module that changes a noted output in place later
    # (here a forward hook registered after the recorder's) bumps the
    # tensor's version: that step's stale value is dropped, and from the
    # next step on the boundary is summarised at once, before the change.
    import numpy as np
    from crashreplay import read_capture

    model = checkpoint(tmp_path / "ckpt", hot=False)
    with crt.record(model, str(tmp_path / "session"), checkpoint_path=str(tmp_path / "ckpt"),
                    install_signal_handlers=False):
        mlp = model.model.layers[1].mlp
        seen = []

        def double_in_place(mod, args, out):
            seen.append(out.detach().float().clone())
            out.mul_(2)  # returns None: the output object stays, changed
        mlp.register_forward_hook(double_in_place)
        model.generate(input_ids=torch.tensor(PROMPT), do_sample=False, max_new_tokens=3)
    (path,) = [p for p in (tmp_path / "session").iterdir() if p.suffix == ".crcap"]
    records = read_capture(str(path))["fingerprints"]
    names = [[f["name"] for f in r["fingerprints"]] for r in records]
    assert "L1.mlp" not in names[0] and "L0.mlp" in names[0]
    for step in (1, 2):
        (f,) = [f for f in records[step]["fingerprints"] if f["name"] == "L1.mlp"]
        # The value the module returned, not the doubled one.
        want = seen[step].reshape(-1, seen[step].shape[-1]).numpy().astype(np.float64)
        assert f["max_abs"] == pytest.approx(float(np.abs(want).max()), rel=1e-6)


def test_decode_steps_give_their_page_rows_as_deltas_and_replay_to_whole_rows(tmp_path):
    # After the prefill each step hands the recorder only its new slot per
    # sequence ("starts"); the capture still reads back every sequence's
    # whole row (sequence b at b * stride + position), and each step replays.
    from crashreplay import read_capture

    model = checkpoint(tmp_path / "ckpt", hot=False)
    prompts = torch.tensor([PROMPT[0], PROMPT[0][::-1]])
    given = []
    with crt.record(model, str(tmp_path / "session"), checkpoint_path=str(tmp_path / "ckpt"),
                    install_signal_handlers=False) as rec:
        inner = rec.rec.record_step

        def spy(step, **kw):
            given.append(kw["page_table"])
            return inner(step, **kw)
        rec.rec.record_step = spy
        out = model.generate(input_ids=prompts, do_sample=False, max_new_tokens=4)
    assert "starts" not in given[0] and all("starts" in pt for pt in given[1:])
    assert all(pt["rows"].shape == (2, 1) for pt in given[1:])
    (path,) = [p for p in (tmp_path / "session").iterdir() if p.suffix == ".crcap"]
    steps = read_capture(str(path))["step_records"]
    assert len(steps) == out.shape[1] - len(PROMPT[0])
    stride = ((out.shape[1] + 63) // 64) * 64
    for s in steps:
        assert s["page_table"] == [{"req_pool_index": b, "token_slots": [b * stride + p for p in range(n)]}
                                   for b, n in enumerate(s["seq_lens"])]
    for step in range(len(steps)):
        rc, rep = replay(tmp_path / "session", "--step", step)
        assert rc == 0 and rep["outcome"] == "reproduced", rep["detail"]
