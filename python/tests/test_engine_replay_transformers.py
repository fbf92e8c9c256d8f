"""`replay --engine transformers` and `bisect --engine transformers`: a
recorded generate() re-executed by transformers itself, beside the exact
engine. Needs torch and transformers (scripts/test-engines.sh installs
them); skipped elsewhere.

The oracle is transformers: the capture is recorded from its real
generate() on a checkpoint its save_pretrained wrote, and the replay must
give back the bits that generate() computed. The defect is transformers'
own sdpa attention with layer DEFECT_LAYER's output NaN for the first
sequence from position DEFECT_FROM on, registered through
AttentionInterface by a module the test writes - in the recording process,
and in the replay's through --engine-setup - so it exists under
attn_implementation=sdpa only, as a broken kernel of one backend does."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import crashreplay  # noqa: E402
import crashreplay.transformers as crt  # noqa: E402

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
PROMPT = [[1, 17, 42, 99, 7, 8, 150, 33], [1, 5, 6, 7, 250, 251, 9, 10]]
DEFECT_LAYER = 2
DEFECT_FROM = 13  # position: the 6th decode step of an 8-token prompt

DEFECT = textwrap.dedent(f'''
    """sdpa with layer {DEFECT_LAYER}'s output NaN for sequence 0 from position {DEFECT_FROM} on."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    ORIGINAL = sdpa_attention_forward


    def broken_sdpa(module, query, key, value, attention_mask, **kwargs):
        out, weights = ORIGINAL(module, query, key, value, attention_mask, **kwargs)
        if getattr(module, "layer_idx", None) == {DEFECT_LAYER}:
            q_len, k_len = query.shape[2], key.shape[2]
            first = k_len - q_len  # the position of the first query
            start = max({DEFECT_FROM} - first, 0)
            if start < q_len:
                out = out.clone()
                out[0, start:] = float("nan")  # out is [batch, q_len, heads, head_dim]
        return out, weights


    AttentionInterface.register("sdpa", broken_sdpa)
''')


def run(*args, timeout=600):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, check=False, timeout=timeout)


def checkpoint(d, dtype=torch.float32):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=300, max_position_embeddings=256,
                                   bos_token_id=1, eos_token_id=2)
    transformers.LlamaForCausalLM(cfg).to(dtype).save_pretrained(d)
    return d


def record(ckpt, session, attn, dtype=torch.float32, **generate):
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype, attn_implementation=attn)
    with crt.record(model, str(session), checkpoint_path=str(ckpt), install_signal_handlers=False):
        return model.generate(input_ids=torch.tensor(PROMPT), max_new_tokens=8, **generate)


def replay(cap, *args):
    r = run("replay", cap, "--json", "--engine", "transformers", "--engine-python", sys.executable, *args)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    return r.returncode, json.loads(r.stdout)


def fingerprints(session, step):
    (f,) = crashreplay.read_capture(str(session))["files"]
    (rec,) = [r for r in f["fingerprints"] if r["step"] == step]
    return rec["fingerprints"]


@pytest.fixture(scope="module")
def defect(tmp_path_factory):
    d = tmp_path_factory.mktemp("setup")
    (d / "broken_sdpa.py").write_text(DEFECT)
    return d


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_a_recorded_generate_replays_bit_for_bit(tmp_path, attn):
    ckpt = checkpoint(tmp_path / "ckpt")
    out = record(ckpt, tmp_path / "session", attn, do_sample=False)
    last = out.shape[1] - len(PROMPT[0]) - 1
    for step in (0, last):
        rc, rep = replay(tmp_path / "session", "--step", step, "--engine-out", tmp_path / f"engine{step}")
        assert rc == 0 and rep["outcome"] == "reproduced", rep["detail"]
        assert rep["real_engine"]["applied"]["attn_implementation"] == attn
        # Every boundary of the step, bit for bit: the recorder wrote both.
        assert rep["fingerprints"]["compared"] == rep["fingerprints"]["identical"] == 19
        assert fingerprints(tmp_path / f"engine{step}" / "session", step) == fingerprints(tmp_path / "session", step)
        # Greedy: each token the replay chose is the one generate() chose.
        assert rep["tokens"]["compared"] == (step + 1 if step < last else last) and not rep["tokens"].get(
            "first_mismatch")
        # The exact engine beside it agrees within its tolerances.
        assert rep["exact"]["outcome"] == "reproduced", rep["exact"]["detail"]
        assert "engine_divergence" not in rep


def test_bf16_replays_bit_for_bit_and_another_dtype_diverges(tmp_path):
    ckpt = checkpoint(tmp_path / "ckpt", torch.bfloat16)
    record(ckpt, tmp_path / "session", "sdpa", dtype=torch.bfloat16, do_sample=False)
    rc, rep = replay(tmp_path / "session", "--step", 3)
    assert rc == 0 and rep["outcome"] == "reproduced", rep["detail"]
    rc, rep = replay(tmp_path / "session", "--step", 3, "--set", "dtype=float32")
    assert rc == 1 and rep["outcome"] == "diverged"
    assert rep["signature"]["class"] == "output_mismatch"
    assert rep["real_engine"]["applied"]["dtype"] == "float32"
    assert rep["exact"]["config"]["activation_dtype"] == "fp32"  # the same setting, in the exact engine's words


@pytest.fixture(scope="module")
def failing(tmp_path_factory, defect):
    root = tmp_path_factory.mktemp("tf")
    ckpt = checkpoint(root / "ckpt")
    from transformers import AttentionInterface

    original = AttentionInterface._global_mapping["sdpa"]
    sys.path.insert(0, str(defect))
    try:
        import broken_sdpa  # noqa: F401  (registers the defect)

        with pytest.raises(RuntimeError, match=r"probability tensor contains either `inf`, `nan` or element < 0"):
            record(ckpt, root / "session", "sdpa", do_sample=True)
    finally:
        AttentionInterface.register("sdpa", original)
        sys.path.remove(str(defect))
        sys.modules.pop("broken_sdpa", None)
    return root / "session"


def test_the_recording_names_the_defective_layer(failing):
    info = json.loads(run("info", failing, "--json").stdout)
    first = info["first_nonfinite_boundary"]
    assert first["boundary"] == f"L{DEFECT_LAYER}.attention", first
    (f,) = info["files"][0]["failure_records"]
    assert f["step"] == DEFECT_FROM - len(PROMPT[0]) + 1


def test_the_engine_with_the_defect_fails_again_and_the_exact_engine_names_where(failing, defect, tmp_path):
    env = dict(os.environ, PYTHONPATH=f"{defect}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    r = subprocess.run([BIN, "replay", failing, "--json", "--engine", "transformers", "--engine-python", sys.executable,
                        "--engine-setup", "broken_sdpa", "--engine-out", tmp_path / "engine"],
                       capture_output=True, text=True, env=env, check=False, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["outcome"] == "failed" and rep["matches_recorded_failure"] is True
    assert rep["signature"]["class"] == "non_finite" and rep["signature"]["kernel"] == "sampler"
    assert "probability tensor contains" in rep["detail"]
    # The engine's replay computed the recording's NaN at the same boundaries.
    assert rep["fingerprints"]["compared"] > 0
    assert rep["fingerprints"]["compared"] == rep["fingerprints"]["identical"]
    # The exact engine stays finite and says where transformers leaves it.
    assert rep["exact"]["first_nonfinite_kernel"] == ""
    assert rep["engine_divergence"]["boundary"] == f"L{DEFECT_LAYER}.attention"
    assert rep["engine_divergence"]["engine"]["nan"] > 0 and rep["engine_divergence"]["replay"]["nan"] == 0


def test_without_the_defect_the_engine_runs_clean(failing, tmp_path):
    rc, rep = replay(failing, "--engine-out", tmp_path / "engine")
    assert rc == 1 and rep["outcome"] == "diverged"  # finite where the recording held NaN
    assert rep["fingerprints"]["first_difference"]["boundary"] == f"L{DEFECT_LAYER}.attention"
    assert rep["real_engine"]["failure"] is None


def test_bisect_over_attn_implementation_finds_the_defective_backend(failing, defect, tmp_path):
    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    good.write_text('attn_implementation = "eager"\n')
    bad.write_text('attn_implementation = "sdpa"\n')
    env = dict(os.environ, PYTHONPATH=f"{defect}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    r = subprocess.run([BIN, "bisect", failing, "--good", good, "--bad", bad, "--json", "--quiet", "--workdir",
                        tmp_path, "--engine", "transformers", "--engine-python", sys.executable, "--engine-setup",
                        "broken_sdpa", "--report", tmp_path / "report.html"],
                       capture_output=True, text=True, env=env, check=False, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["culprit"] == {"attn_implementation": "sdpa"}
    assert rep["target_signature"]["class"] == "non_finite" and rep["target_signature"]["kernel"] == "sampler"
    engines = [h["engines"] for h in rep["history"] if "engines" in h]
    assert engines and all(e.startswith("transformers: ") and "; exact engine: " in e for e in engines)
    # The report as its reader sees it: rendered by a real browser.
    dom, console = render(tmp_path / "report.html")
    assert "culprit: attn_implementation=\"sdpa\"" in dom
    assert "transformers: failed (non_finite during decode at sampler/probabilities); exact engine: diverged" in dom
    assert f"departs from the exact engine at L{DEFECT_LAYER}.attention" in dom
    assert "transformers: diverged" in dom  # the good trial, both engines' outcomes beside it
    assert "<svg" in dom and "per-kernel error vs tolerance" in dom  # the divergence chart
    assert "Uncaught" not in console, console


def render(html):
    """The DOM headless Chromium builds from `html`, and its console log."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (scripts/test-engines.sh installs Debian's)")
    r = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
                        "--virtual-time-budget=2000", "--dump-dom", f"file://{html}"],
                       capture_output=True, text=True, check=False, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout, "\n".join(line for line in r.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line)


def safetensors_table(d):
    """{name: (dtype, shape)} of every safetensors file in `d`, from their headers."""
    import struct
    table = {}
    for f in sorted(pathlib.Path(d).glob("*.safetensors")):
        b = f.read_bytes()
        (n,) = struct.unpack("<Q", b[:8])
        for k, v in json.loads(b[8:8 + n]).items():
            if k != "__metadata__":
                table[k] = (v["dtype"], v["shape"])
    return table


def test_shrink_in_the_engine_keeps_the_layers_to_the_defect_and_draws_the_weights(failing, defect, tmp_path):
    """shrink --engine transformers: every candidate re-executed by
    transformers with the defect. transformers departs from the exact engine
    at L{DEFECT_LAYER}.attention, so the slice keeps layers 0..DEFECT_LAYER;
    the defect is the kernel's, not the weights', so make-model --like the
    float32 checkpoint save_pretrained wrote stands in for it (transformers
    loads what make-model drew), and OUT ships no tensor at all."""
    # Absolute: the README's commands run from OUT.
    paths = [str(defect)] + [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    out = tmp_path / "s"
    r = subprocess.run([BIN, "shrink", failing, "-o", out, "--json", "-j", "2", "--confirm", "1", "--engine",
                        "transformers", "--engine-python", sys.executable, "--engine-setup", "broken_sdpa"],
                       capture_output=True, text=True, env=env, check=False, timeout=1800)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    rep = json.loads(r.stdout)
    assert rep["target"]["class"] == "non_finite" and rep["target"]["kernel"] == "sampler"
    stages = {s["stage"]: s for s in rep["stages"]}
    assert stages["requests"]["before"] == 2 and stages["requests"]["after"] == 1, rep["stages"]
    assert stages["layers"]["before"] == 4 and stages["layers"]["after"] == DEFECT_LAYER + 1, (rep["stages"], r.stderr)
    assert stages["weights"]["before"] > 0 and stages["weights"]["after"] == 0
    assert rep["confirmed"] == {"runs": 2, "failed_same_way": 2}
    assert not (out / "model").exists() and "checkpoint" not in rep["needs"]
    # The README's commands, as a user runs them: make-model draws the model,
    # transformers replays the step and fails the same way.
    lines = [ln.split() for ln in (out / "README.md").read_text().splitlines() if ln.startswith("crashreplay ")]
    assert [ln[1] for ln in lines] == ["make-model", "replay"]
    for words in lines:
        r = subprocess.run([BIN, *words[1:]], capture_output=True, text=True, env=env, cwd=out, check=False,
                           timeout=600)
        assert r.returncode == (0 if words[1] == "make-model" else 1), r.stdout[-2000:] + r.stderr[-2000:]
    again = json.loads(r.stdout)
    assert again["outcome"] == "failed" and again["signature"]["class"] == "non_finite"
    # What make-model drew holds the tensors save_pretrained wrote for those
    # layers: the same names, dtypes (float32) and shapes.
    ckpt = failing.parent / "ckpt"  # the fixture's save_pretrained output
    want = {k: v for k, v in safetensors_table(ckpt).items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) <= DEFECT_LAYER}
    assert safetensors_table(out / "model") == want
    assert all(dtype == "F32" for dtype, _ in want.values())


def test_vllm_refuses_on_a_cpu_with_exit_7(failing):
    pytest.importorskip("vllm")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the refusal is for CPUs")
    r = run("replay", failing, "--json", "--engine", "vllm", "--engine-python", sys.executable)
    assert r.returncode == 7, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["outcome"] == "untestable"
    # Whatever the capture: this machine cannot run vLLM's model, and says why.
    assert "GPU" in rep["refused"] and "VLLM_TARGET_DEVICE=cpu" in rep["refused"]
