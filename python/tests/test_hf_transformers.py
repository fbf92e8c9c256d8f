"""crashreplay's engine against Hugging Face transformers' own modeling code
run in float64, where torch and transformers are installed (not in CI: the
torch wheel on PyPI is a CUDA build of several GB; CI runs test_fidelity.py on
checkpoints and float32 logits fidelity_cases.py wrote).
scripts/test-engines.sh installs everything and runs this file.

Two sets of checkpoints, each run by the engine with default toggles for
prefill + 8 greedy decode steps (`run --record`, so that each step can be
replayed kernel by kernel):

1. fresh ones written by transformers 5's `save_pretrained` and ModelOpt's
   exporter (fidelity_cases.CASES, written here into a temp dir, or read
   from $FIDELITY_DIR when scripts/fidelity.sh already wrote them);
2. `crashreplay make-model` checkpoints, which transformers must load from
   the config.json crashreplay writes. transformers cannot run FP8-block /
   NVFP4 / MXFP4 weights on CPU, so their reference holds the weights
   dequantized by this file, exactly, in float64 (torch's float8 decoders,
   an e2m1 table, ModelOpt's low-nibble-first packing). NVFP4 runs as
   nvfp4_activation=w4a16: the reference does not quantize activations.

The reference: transformers in float64, so that its own rounding is far
below the engine's (float32) and it does not depend on the host's
summation order. Every float32 request in transformers' modeling code
(RMSNorm's upcast, softmax's dtype, the router's .type(float32), the
rotary's .float()) is turned into float64 while it runs (`float64_forward`),
MoE experts run eagerly (grouped_mm has no float64) and attention eagerly.
The engine stores K and V (for MLA the normalized latent and the roped
k_rot; for DSA also the indexer's keys) in bf16, its KV cache dtype, so the
reference rounds each of them to bf16 as it enters transformers' cache.
Rounding is not continuous: where the reference's value of an element lies
within a few float32 ulps of a bf16 rounding midpoint, float32 accumulation
error alone decides the side, and either side is right. There the element
takes the engine's rounding, read from the engine's own per-kernel dump of
the step (`crashreplay replay SESSION --step N --dump DIR`: L<l>.rope.k and
L<l>.v_proj.v; L<l>.rope.kv_a for MLA; L<l>.indexer_rope.index_k), and only
when the engine's bf16 value is one of the two neighbours of the
reference's value; every other element keeps the reference's own rounding.
"A few ulps" is KV_ULPS = 16 float32 ulps of the largest |element| of the
token's row (an absolute error scale: a projection's error follows its
inputs' magnitude, not its output's), and every element the engine stores
is asserted to be that close to the reference (measured: at most 10). Each
case prints how many midpoint elements it met and how many of them the
engine rounded the other way (the ones that matter): 4 .. 30 per case, and
193 .. 220 for the make-model MLA ones (512-wide latents); 0 .. 11 of them
rounded otherwise.

Tolerance, one for every family, MLA and DSA included:
|engine - reference| <= ATOL + RTOL |reference| = 1e-5 (1 + |reference|) on
every logit, greedy tokens equal. With K/V rounded alike, what is left is the
engine's float32 arithmetic: a unit roundoff of 6e-8 per operation, grown
over dot products of 32..136 terms, 2-3 layers and the lm_head, relative to
the logits' magnitude (up to 131 with tied embeddings). Measured over the 32
cases (torch 2.15.0, transformers 5.25.0, Intel Xeon): max |engine - reference|
/ (1 + |reference|) = 4.0e-6 (llama_fp8_pb_wo, logits up to 131; max
|engine - reference| 1.8e-5 there), 3.7e-7 .. 2.0e-6 for the others, the MLA
and DSA ones 6.8e-7 .. 1.8e-6: the tolerance is 2.5 times the largest.
Without the midpoint rule make-model's llama/bf16 (seed 11) is 2.1e-4 off:
one V element of L0 at prefill, 0.0254516, sits 55 of its own float32 ulps
(under one of its row's) from the midpoint 0.02545166, the engine rounds up
and the reference down; and mixtral/bf16 was 6.7e-4 off
with the float32 reference, an element of L1's post-RoPE K 1e-8 from the
midpoint 2.5703125.

gpt_oss (GptOssForCausalLM: sinks, a sliding window per layer, biased
experts with the clamped SwiGLU, top-k-then-softmax routing): its own
checkpoints below (bf16, fp32, and experts in OpenAI's MXFP4 layout, read
back by transformers' Mxfp4Config(dequantize=True) for the reference), three
requests of different lengths as one engine batch, each compared with
transformers alone, at the same tolerance. Measured: 1.5e-6 .. 2.1e-6 of
1 + |reference|.

The oracle still catches defects (test_oracle_catches_*): one bf16 weight's
bits changed in the checkpoint the engine reads, RoPE read from other
config keys (`--set rope_config=legacy`), K/V stored as fp8
(`--set kv_cache_dtype=fp8_e4m3`): each moves the logits by far more than
the tolerance.
"""
import contextlib
import json
import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import fidelity_cases as fc  # noqa: E402

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")

ATOL = 1e-5
RTOL = 1e-5
# |engine - reference| of every stored K/V element, in float32 ulps of the
# largest |element| of its token's row (asserted), and so the band around a
# bf16 midpoint where the engine's rounding is taken.
KV_ULPS = 16

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                    dtype=torch.float64)


# ---- weights -----------------------------------------------------------

def unpack_e2m1(packed):
    """[R, C/2] uint8 -> [R, C] float64; element 2i is the low nibble."""
    lo = E2M1[(packed & 0x0F).long()]
    hi = E2M1[(packed >> 4).long()]
    return torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], -1)


def expand_blocks(scale, rows, cols, br, bc):
    return scale.repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]


def dequantize(tensors):
    """Checkpoint tensors -> float64 tensors with every quantized weight
    decoded exactly (e2m1 x e4m3 x fp32 and e4m3 x fp32 products fit float64)."""
    out = {}
    for name, t in tensors.items():
        if name.endswith((".weight_scale_inv", ".weight_scale", ".weight_scale_2", ".input_scale")):
            continue
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if base and base + ".weight_scale_inv" in tensors:  # FP8 block, 128x128
            s = tensors[base + ".weight_scale_inv"].double()
            w = t.double()
            out[name] = w * expand_blocks(s, w.shape[0], w.shape[1], 128, 128)
        elif base and base + ".weight_scale_2" in tensors:  # NVFP4 (ModelOpt)
            w = unpack_e2m1(t)
            s = tensors[base + ".weight_scale"].double()
            g = tensors[base + ".weight_scale_2"].double()
            out[name] = w * (expand_blocks(s, w.shape[0], w.shape[1], 1, 16) * g)
        elif base and base + ".weight_scale" in tensors:  # MXFP4: e8m0 scales per 32
            w = unpack_e2m1(t)
            s = tensors[base + ".weight_scale"].view(torch.float8_e8m0fnu).double()
            out[name] = w * expand_blocks(s, w.shape[0], w.shape[1], 1, 32)
        else:
            out[name] = t.double()
    return out


def checkpoint_tensors(model_dir):
    tensors = {}
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors") and f != "golden.safetensors":
            tensors.update(load_file(os.path.join(model_dir, f)))
    return tensors


# ---- the float64 reference ---------------------------------------------

@contextlib.contextmanager
def float64_forward():
    """transformers' modeling code asks for float32 in places (RMSNorm's
    upcast, softmax(dtype=float32), the router's .type(float32), the
    rotary's .float() of positions); while this is active every such request
    gives float64, and new floating tensors default to float64."""
    T = torch.Tensor
    f32, f64 = torch.float32, torch.float64
    to, flt, typ = T.to, T.float, T.type
    softmax = torch.nn.functional.softmax
    default = torch.get_default_dtype()

    def to64(self, *args, **kwargs):
        args = tuple(f64 if a is f32 else a for a in args)
        if kwargs.get("dtype") is f32:
            kwargs["dtype"] = f64
        return to(self, *args, **kwargs)

    def float64(self, *args, **kwargs):
        return to(self, f64)

    def type64(self, dtype=None, *args, **kwargs):
        if dtype is f32:
            dtype = f64
        return typ(self, dtype, *args, **kwargs) if dtype is not None else typ(self)

    def softmax64(x, *args, dtype=None, **kwargs):
        return softmax(x, *args, dtype=f64 if dtype is f32 else dtype, **kwargs)

    T.to, T.float, T.type = to64, float64, type64
    torch.nn.functional.softmax = softmax64
    torch.set_default_dtype(f64)
    try:
        yield
    finally:
        T.to, T.float, T.type = to, flt, typ
        torch.nn.functional.softmax = softmax
        torch.set_default_dtype(default)


def _rows(t):
    """A tensor as it enters the cache -> [tokens, values] in the engine's
    order: [1, heads, tokens, dim] -> [tokens, heads * dim]; [1, tokens, dim] -> [tokens, dim]."""
    if t.dim() == 4:
        return t[0].transpose(0, 1).reshape(t.shape[2], -1)
    return t[0]


def _unrows(r, like):
    if like.dim() == 4:
        return r.reshape(like.shape[2], like.shape[1], like.shape[3]).transpose(0, 1).unsqueeze(0)
    return r.unsqueeze(0)


def _align(ref, eng):
    """The engine's [tokens, values] in the reference's column order, or None.
    Interleaved RoPE is stored pairwise by the engine and de-interleaved by
    transformers: columns are matched by value when the order differs."""
    if eng is None or eng.shape != ref.shape:
        return None
    close = 1e-3 * (1 + float(ref.abs().max()))
    if float((ref - eng).abs().max()) <= close:
        return eng
    cost = (ref.T[:, None, :] - eng.T[None, :, :]).abs().sum(-1)  # [ref col, eng col]
    perm = cost.argmin(1)
    if len(set(perm.tolist())) != ref.shape[1]:
        return None
    eng = eng[:, perm]
    return eng if float((ref - eng).abs().max()) <= close else None


def round_bf16_like_engine(ref, eng, stats):
    """`ref` (float64, [tokens, values]) rounded to bf16 (nearest, ties to
    even), except where it lies within KV_ULPS float32 ulps of its row's
    largest |value| from a rounding midpoint: there the engine's bf16 value is
    taken when it is one of the two neighbours."""
    _, e = torch.frexp(ref)
    one = torch.ones_like(ref)
    spacing = torch.ldexp(one, e - 8)  # bf16 keeps 8 significant bits
    lo = torch.floor(ref / spacing) * spacing
    hi = lo + spacing
    rem = ref - lo
    even = torch.remainder(lo / spacing, 2) == 0
    own = torch.where(rem < spacing / 2, lo, torch.where(rem > spacing / 2, hi, torch.where(even, lo, hi)))
    if eng is None:
        return own
    _, e_row = torch.frexp(ref.abs().amax(-1, keepdim=True))
    band = KV_ULPS * torch.ldexp(torch.ones_like(ref[:, :1]), e_row - 24)  # float32 ulps of the row
    stats["kv_ulps"] = max(stats["kv_ulps"], float(((eng.double() - ref).abs() / (band / KV_ULPS)).max()))
    near = (rem - spacing / 2).abs() <= band
    eng_bf16 = eng.to(torch.bfloat16).double()
    take = near & ((eng_bf16 == lo) | (eng_bf16 == hi))
    stats["midpoints"] += int(take.sum())
    stats["flipped"] += int((take & (eng_bf16 != own)).sum())
    return torch.where(take, eng_bf16, own)


def engine_cache_values(session, steps, out_dir):
    """{(kind, layer, step): float32 [tokens, values]} from the engine's
    per-kernel dumps of each replayed step: what its KV cache stores, before
    the rounding to the cache dtype."""
    values = {}
    for step in range(steps):
        d = os.path.join(out_dir, f"step{step}")
        r = subprocess.run([BIN, "replay", session, "--step", str(step), "--dump", d, "--json"],
                           capture_output=True, text=True, check=False)
        assert r.returncode == 0, f"replay {session} --step {step} exited {r.returncode}: {r.stderr}"
        dump = {}
        for f in os.listdir(d):
            dump.update(load_file(os.path.join(d, f)))
        layer = 0
        while any(k.startswith(f"L{layer}.") for k in dump):
            p = f"L{layer}."
            if p + "rope.kv_a" in dump:  # MLA: [latent | k_rot]
                values[("kv_a", layer, step)] = dump[p + "rope.kv_a"]
            if p + "rope.k" in dump:
                values[("k", layer, step)] = dump[p + "rope.k"][0]
            if p + "v_proj.v" in dump:
                values[("v", layer, step)] = dump[p + "v_proj.v"][0]
            if p + "indexer_rope.index_k" in dump:
                values[("index_k", layer, step)] = dump[p + "indexer_rope.index_k"]
            layer += 1
    return values


def float64_reference(model_dir, state, engine, forced):
    """(tokens, logits float64 [steps, V], midpoint stats) of transformers in
    float64 with the cache rounded as the engine stores it."""
    model = fc.load_reference(model_dir, state, torch, transformers, dtype=torch.float64,
                              attn_implementation="eager", experts_implementation="eager")
    model.to(torch.float64)  # modules transformers keeps in float32 (router weights, biases) too
    stats = {"midpoints": 0, "flipped": 0, "kv_ulps": 0.0, "unmatched": 0}

    def store(kind, layer, step, t):
        ref = _rows(t)
        eng = engine.get((kind, layer, step))
        kv_a = engine.get(("kv_a", layer, step))
        if eng is None and kv_a is not None:  # MLA: "k" the latent, "v" k_rot
            eng = kv_a[:, : ref.shape[1]] if kind == "k" else kv_a[:, kv_a.shape[1] - ref.shape[1]:]
        eng = _align(ref, eng)
        if eng is None:
            stats["unmatched"] += 1
        return _unrows(round_bf16_like_engine(ref, eng, stats), t)

    with float64_forward():
        tokens, logits = fc.reference_logits(model, torch, store=store, forced=forced)
    return tokens, logits.double(), stats


def compare(name, model_dir, state, sets, tmp_path, engine_model_dir=None):
    """Runs the engine (on `engine_model_dir`, default `model_dir`) and the
    float64 reference (on `model_dir` holding `state`); returns (max |engine -
    reference|, max excess over the tolerance, tokens equal, the reference's
    tokens, midpoint stats with "relative": max |engine - reference| / (1 + |reference|))."""
    session = str(tmp_path / "session")
    got, got_tokens, _, _ = fc.run_engine_on(BIN, engine_model_dir or model_dir, fc.PROMPT, fc.STEPS,
                                             str(tmp_path / "logits"), sets, record=session)
    engine = engine_cache_values(session, fc.STEPS, str(tmp_path / "kernels"))
    forced = got_tokens  # teacher-forced on the engine's tokens; the reference's argmax must agree
    tokens, want, stats = float64_reference(model_dir, state, engine, forced)
    got = torch.from_numpy(got).double()
    d = (got - want).abs()
    stats["relative"] = float((d / (1 + want.abs())).max())
    return float(d.max()), float((d - (ATOL + RTOL * want.abs())).max()), tokens == got_tokens, tokens, stats


def check(name, model_dir, state, sets, tmp_path):
    worst, excess, same, tokens, stats = compare(name, model_dir, state, sets, tmp_path)
    print(f"{name}: max |engine - float64 transformers| = {worst:.3g} ({stats['relative']:.2g} of 1 + |ref|);"
          f" {stats['midpoints']} midpoint elements"
          f" ({stats['flipped']} rounded the other way), stored K/V within {stats['kv_ulps']:.2g} float32 ulps")
    kept = f" (the engine's session and per-kernel dumps: {tmp_path})"
    assert stats["unmatched"] == 0, f"{name}: {stats['unmatched']} cache writes with no engine tensor to match{kept}"
    assert stats["kv_ulps"] <= KV_ULPS, f"{name}: stored K/V {stats['kv_ulps']:.3g} ulps from the reference{kept}"
    assert same, f"{name}: greedy tokens differ from float64 transformers' {tokens}{kept}"
    assert excess <= 0, f"{name}: max |engine - float64 transformers| = {worst:.3g} > {ATOL} + {RTOL} |ref|{kept}"
    return worst, stats


# ---- the cases ---------------------------------------------------------

@pytest.fixture(scope="module")
def fresh_dir(tmp_path_factory):
    given = os.environ.get("FIDELITY_DIR")
    return given if given else str(tmp_path_factory.mktemp("fidelity"))


def fresh_case(case, fresh_dir):
    c = next(c for c in fc.CASES if c.name == case)
    d = os.path.join(fresh_dir, case)
    if not os.path.isfile(os.path.join(d, "golden.safetensors")):
        if c.quant:
            pytest.importorskip("modelopt")
        torch.set_num_threads(1)
        fc.write_case(c, fresh_dir)
    _, meta = fc.golden(d)
    if c.quant:  # ModelOpt's own decoders (float32), exact in float64
        state = {k: v.double() for k, v in fc._dequantized_state_dict(d, torch).items()}
    else:
        state = {k: v.double() for k, v in checkpoint_tensors(d).items()}
    return d, state, json.loads(meta.get("engine_sets", "[]"))


@pytest.mark.parametrize("case", [c.name for c in fc.CASES])
def test_checkpoint_written_by_transformers_matches(case, fresh_dir, tmp_path):
    d, state, sets = fresh_case(case, fresh_dir)
    check(case, d, state, sets, tmp_path)


MAKE_MODEL = [
    ("llama", "bf16"),
    ("qwen3", "bf16"),
    ("qwen3_moe", "bf16"),
    ("mixtral", "bf16"),
    ("glm4_moe", "bf16"),
    ("llama", "fp8"),
    ("qwen3", "nvfp4"),
    ("qwen3_moe", "mxfp4"),
    ("glm4_moe", "nvfp4"),
    ("deepseek_v3", "fp8"),
    ("deepseek_v32", "bf16"),
    ("glm_moe_dsa", "nvfp4"),
    ("gpt_oss", "bf16"),
]


def make_model(path, arch, quant, seed=11):
    r = subprocess.run([BIN, "make-model", str(path), "--arch", arch, "--quant", quant, "--seed", str(seed)],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    return str(path)


@pytest.mark.parametrize("arch,quant", MAKE_MODEL)
def test_make_model_checkpoint_matches_hf_transformers(tmp_path, arch, quant):
    torch.set_num_threads(1)
    model = make_model(tmp_path / "model", arch, quant)
    sets = ["nvfp4_activation=w4a16"] if quant == "nvfp4" else []
    _, stats = check(f"{arch}/{quant}", model, dequantize(checkpoint_tensors(model)), sets, tmp_path)
    if (arch, quant) == ("mixtral", "bf16"):
        # L1's post-RoPE K at prefill has an element 1e-8 from a bf16 midpoint
        # (the case behind the rule): it must have been met.
        assert stats["midpoints"] >= 1


# ---- the oracle still sees defects -------------------------------------

def _far_beyond_tolerance(name, model_dir, state, sets, tmp_path, engine_model_dir=None):
    worst, excess, same, _, _ = compare(name, model_dir, state, sets, tmp_path, engine_model_dir)
    print(f"{name}: max |engine - float64 transformers| = {worst:.3g} (tokens {'equal' if same else 'differ'})")
    assert worst > 100 * ATOL, f"{name}: the defect moved the logits by only {worst:.3g}"


def test_oracle_catches_one_changed_weight(tmp_path):
    # One bf16 weight of L1's k_proj loses its top mantissa bit in the file the
    # engine reads; the reference holds the original.
    torch.set_num_threads(1)
    model = make_model(tmp_path / "model", "llama", "bf16")
    state = dequantize(checkpoint_tensors(model))
    broken = tmp_path / "broken"
    shutil.copytree(model, broken)
    name = "model.layers.1.self_attn.k_proj.weight"
    for f in os.listdir(broken):
        if not f.endswith(".safetensors"):
            continue
        t = load_file(str(broken / f))
        if name in t:
            w = t[name].clone()
            bits = w.view(torch.int16)
            bits.view(-1)[5] ^= 0x40  # bf16 bit 6: the top mantissa bit
            assert float((w.double() - t[name].double()).abs().max()) > 0
            t[name] = w
            save_file(t, str(broken / f), metadata={"format": "pt"})
            break
    else:
        pytest.fail(f"no {name} in {model}")
    _far_beyond_tolerance("llama/bf16 with one weight changed", model, state, [], tmp_path, str(broken))


def test_oracle_catches_rope_from_other_config_keys(tmp_path, fresh_dir):
    # llama3 RoPE (theta 500000) in rope_parameters only; rope_config=legacy
    # makes the engine read rope_theta/rope_scaling: theta 10000, no scaling.
    d, state, sets = fresh_case("llama_llama3_rope", fresh_dir)
    _far_beyond_tolerance("llama_llama3_rope --set rope_config=legacy", d, state,
                          sets + ["rope_config=legacy"], tmp_path)


def test_oracle_catches_fp8_kv_cache(tmp_path):
    torch.set_num_threads(1)
    model = make_model(tmp_path / "model", "mixtral", "bf16")
    _far_beyond_tolerance("mixtral/bf16 --set kv_cache_dtype=fp8_e4m3", model,
                          dequantize(checkpoint_tensors(model)), ["kv_cache_dtype=fp8_e4m3"], tmp_path)


# ---- gpt_oss: a batch of requests against transformers' GptOssForCausalLM --

# Three layers (sliding, full, sliding: GptOssConfig's default layer_types),
# a window of 6 that every request outgrows, 4 experts of 16 (top-2), head_dim
# 16, gpt-oss's YaRN scaled down (factor 32 over an original 64 positions,
# truncate false), q/k/v/o biases and attention sinks.
GPT_OSS = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=3,
               intermediate_size=16, vocab_size=128, max_position_embeddings=2048, num_local_experts=4,
               num_experts_per_tok=2, sliding_window=6,
               rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                                "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64})
# Requests of different lengths, run as one batch by the engine, one at a
# time by transformers (each request's logits do not depend on the others).
GPT_OSS_PROMPTS = [fc.PROMPT, [5, 9, 77, 31, 2], [101, 4, 66, 12, 90, 3, 45, 18, 7]]
# gate_up_proj scaled up so that the clamped SwiGLU's limit (7) is reached:
# without it _randomize's weights keep every gate and up value far inside.
GPT_OSS_GATE_UP_SCALE = 6.0


def write_gpt_oss(d, dtype="bfloat16", seed=1234):
    """A GptOssForCausalLM written by save_pretrained (weights as fidelity_cases
    randomizes them); returns its tensors as the file has them."""
    torch.manual_seed(seed)
    cfg = transformers.GptOssConfig(architectures=["GptOssForCausalLM"], **GPT_OSS)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    fc._randomize(model, torch, seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("experts.gate_up_proj"):
                p.mul_(GPT_OSS_GATE_UP_SCALE)
    model.to(getattr(torch, dtype)).save_pretrained(d)
    return checkpoint_tensors(d)


def run_batch(model_dir, prompts, steps, tmp_path):
    """(logits [requests, steps, V] float64, tokens [requests][steps], session)
    of one `crashreplay run --record` over every prompt as one batch."""
    dump, session = str(tmp_path / "logits"), str(tmp_path / "session")
    args = [BIN, "run", model_dir, "--max-new-tokens", str(steps), "--dump", dump, "--record", session, "--json"]
    for p in prompts:
        args += ["--prompt-ids", ",".join(str(x) for x in p)]
    r = subprocess.run(args, capture_output=True, text=True, check=False)
    assert r.returncode == 0, f"{' '.join(args)} exited {r.returncode}: {r.stderr}"
    files = sorted(os.listdir(dump), key=lambda f: int(f.split("_")[1].split(".")[0]))
    assert len(files) == steps, f"{len(files)} steps dumped, expected {steps}"
    rows = [load_file(os.path.join(dump, f)) for f in files]
    logits = torch.stack([s["logits"].double() for s in rows], dim=1)  # [R, steps, V]
    tokens = [[int(s["next_tokens"][i]) for s in rows] for i in range(len(prompts))]
    return logits, tokens, session, json.loads(r.stdout).get("notes", [])


def request_cache_values(engine, prompts, request):
    """The engine's stored K/V of one request: rows of each step's [tokens,
    values] dumps, the batch's tokens in request order (every prompt at the
    prefill, one token each at every decode step)."""
    out = {}
    for (kind, layer, step), t in engine.items():
        lens = [len(p) for p in prompts] if step == 0 else [1] * len(prompts)
        assert t.shape[0] == sum(lens), f"step {step} stored {t.shape[0]} rows for lengths {lens}"
        start = sum(lens[:request])
        out[(kind, layer, step)] = t[start:start + lens[request]]
    return out


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_gpt_oss_batch_matches_hf_transformers(tmp_path, dtype):
    torch.set_num_threads(1)
    model = str(tmp_path / "model")
    state = {k: v.double() for k, v in write_gpt_oss(model, dtype).items()}
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    assert config["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"], config
    check_gpt_oss_batch(f"gpt_oss/{dtype}", model, state, tmp_path)


# OpenAI's MXFP4 layout for the experts, as the released checkpoints ship it:
# gate_up_proj_blocks [E, 2I, H/32, 16] (rows [out, in], packed e2m1, low
# nibble first), gate_up_proj_scales [E, 2I, H/32] (e8m0), down_proj_* alike;
# quantization_config {"quant_method": "mxfp4", "modules_to_not_convert":
# [...]} as in gpt-oss-20b's config.json. Widths are multiples of 32.
GPT_OSS_MXFP4 = dict(GPT_OSS, hidden_size=64, intermediate_size=32)
MXFP4_NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def mxfp4_pack(w):
    """[E, R, C] -> (blocks [E, R, C/32, 16] uint8, scales [E, R, C/32] uint8):
    each block of 32 scaled by 2^(floor(log2 amax) - 2), its values rounded to
    the nearest e2m1 (E2M1's order: code = index), two a byte, low nibble first."""
    E, R, C = w.shape
    b = w.double().reshape(E, R, C // 32, 32)
    e = torch.floor(torch.log2(b.abs().amax(-1).clamp_min(2.0 ** -100))) - 2
    v = b / torch.ldexp(torch.ones_like(e), e.int())[..., None]
    codes = (v[..., None] - E2M1).abs().argmin(-1)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8), (e + 127).to(torch.uint8)


def write_gpt_oss_mxfp4(d, seed=1234):
    """The bf16 model of write_gpt_oss at GPT_OSS_MXFP4's widths with its experts
    rewritten in OpenAI's MXFP4 layout; returns the weights as transformers
    itself reads that file (Mxfp4Config(dequantize=True): its own
    convert_moe_packed_tensors), in float64."""
    torch.manual_seed(seed)
    cfg = transformers.GptOssConfig(architectures=["GptOssForCausalLM"], **GPT_OSS_MXFP4)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    fc._randomize(model, torch, seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("experts.gate_up_proj"):
                p.mul_(GPT_OSS_GATE_UP_SCALE)
    model.to(torch.bfloat16).save_pretrained(d)
    path = os.path.join(d, "model.safetensors")
    t = load_file(path)
    for k in list(t):
        if k.endswith(("experts.gate_up_proj", "experts.down_proj")):
            t[k + "_blocks"], t[k + "_scales"] = mxfp4_pack(t.pop(k).float().transpose(1, 2))
    save_file(t, path, metadata={"format": "pt"})
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    c["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": MXFP4_NOT_CONVERTED}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    read = transformers.AutoModelForCausalLM.from_pretrained(
        d, quantization_config=transformers.Mxfp4Config(dequantize=True), dtype=torch.float32)
    return {k: v.detach().double() for k, v in read.state_dict().items()}


def test_gpt_oss_mxfp4_openai_layout_matches_hf_transformers(tmp_path):
    torch.set_num_threads(1)
    model = str(tmp_path / "model")
    state = write_gpt_oss_mxfp4(model)
    assert any(k.endswith("gate_up_proj_blocks") for k in checkpoint_tensors(model))
    check_gpt_oss_batch("gpt_oss/mxfp4", model, state, tmp_path)


def check_gpt_oss_batch(name, model, state, tmp_path):
    """GPT_OSS_PROMPTS as one batch through the engine, each request through
    float64 transformers holding `state`: greedy tokens equal, every logit
    within the tolerance, the window outgrown and the SwiGLU clamp reached."""
    got, got_tokens, session, notes = run_batch(model, GPT_OSS_PROMPTS, fc.STEPS, tmp_path)
    assert notes == [], f"unexpected notes {notes}"
    engine = engine_cache_values(session, fc.STEPS, str(tmp_path / "kernels"))
    ref_model = fc.load_reference(model, state, torch, transformers, dtype=torch.float64,
                                  attn_implementation="eager", experts_implementation="eager")
    ref_model.to(torch.float64)
    clamped = {"gate": 0, "up": 0}

    def count_clamps(module, args, output):
        # The routed (token, expert) pairs' gate and up values beyond the limit.
        x, idx = args[0], args[1]
        for k in range(idx.shape[1]):
            e = idx[:, k]
            gu = torch.einsum("th,thn->tn", x, module.gate_up_proj[e]) + module.gate_up_proj_bias[e]
            clamped["gate"] += int((gu[..., ::2] > module.limit).sum())
            clamped["up"] += int((gu[..., 1::2].abs() > module.limit).sum())

    hooks = [layer.mlp.experts.register_forward_hook(count_clamps) for layer in ref_model.model.layers]
    worst = 0.0
    try:
        for i, prompt in enumerate(GPT_OSS_PROMPTS):
            mine = request_cache_values(engine, GPT_OSS_PROMPTS, i)
            stats = {"midpoints": 0, "flipped": 0, "kv_ulps": 0.0, "unmatched": 0}

            def store(kind, layer, step, t):
                ref = _rows(t)
                eng = _align(ref, mine.get((kind, layer, step)))
                if eng is None:
                    stats["unmatched"] += 1
                return _unrows(round_bf16_like_engine(ref, eng, stats), t)

            with float64_forward():
                tokens, want = fc.reference_logits(ref_model, torch, store=store, forced=got_tokens[i], prompt=prompt)
            want = want.double()
            d = (got[i] - want).abs()
            excess = float((d - (ATOL + RTOL * want.abs())).max())
            worst = max(worst, float((d / (1 + want.abs())).max()))
            print(f"{name} request {i} ({len(prompt)} tokens): max |engine - float64 transformers| ="
                  f" {float(d.max()):.3g}; {stats['midpoints']} midpoint elements ({stats['flipped']} rounded the"
                  f" other way), stored K/V within {stats['kv_ulps']:.2g} float32 ulps")
            kept = f" (the engine's session and dumps: {tmp_path})"
            assert stats["unmatched"] == 0, f"request {i}: {stats['unmatched']} cache writes unmatched{kept}"
            assert stats["kv_ulps"] <= KV_ULPS, f"request {i}: stored K/V {stats['kv_ulps']:.3g} ulps off{kept}"
            assert tokens == got_tokens[i], f"request {i}: tokens {got_tokens[i]} vs transformers' {tokens}{kept}"
            assert excess <= 0, f"request {i}: max |engine - float64 transformers| = {float(d.max()):.3g}{kept}"
    finally:
        for h in hooks:
            h.remove()
    print(f"{name}: max |engine - ref| / (1 + |ref|) = {worst:.2g}; routed gate values past the limit:"
          f" {clamped['gate']}, up values: {clamped['up']}")
    # The features this case is for are exercised: positions past the window
    # (20 > 6) and the SwiGLU clamp on both sides.
    assert clamped["gate"] > 0 and clamped["up"] > 0, clamped


@pytest.mark.parametrize("defect", ["no_sinks", "no_window"])
def test_oracle_catches_gpt_oss_defects(tmp_path, defect):
    # The engine reads a copy without the feature: every attention sink at
    # -inf (a plain softmax), or every layer full_attention (no window); the
    # reference keeps the original.
    torch.set_num_threads(1)
    model = str(tmp_path / "model")
    state = {k: v.double() for k, v in write_gpt_oss(model).items()}
    broken = tmp_path / "broken"
    shutil.copytree(model, broken)
    if defect == "no_window":
        with open(broken / "config.json") as f:
            c = json.load(f)
        c["layer_types"] = ["full_attention"] * len(c["layer_types"])
        with open(broken / "config.json", "w") as f:
            json.dump(c, f)
    for f in os.listdir(broken):
        if f.endswith(".safetensors") and defect == "no_sinks":
            t = load_file(str(broken / f))
            for k in t:
                if k.endswith("self_attn.sinks"):
                    t[k] = torch.full_like(t[k], float("-inf"))
            save_file(t, str(broken / f), metadata={"format": "pt"})
    _far_beyond_tolerance(f"gpt_oss {defect}", model, state, [], tmp_path, str(broken))
