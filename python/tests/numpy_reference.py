"""An independent numpy transcription of the HF transformers forward pass, in
float32, used to check crashreplay's engine where torch is not installed.

Architectures (transformers 5 modeling code): LlamaForCausalLM,
MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM,
MixtralForCausalLM, Glm4MoeForCausalLM, and the MLA models
DeepseekV3ForCausalLM, DeepseekV32ForCausalLM and GlmMoeDsaForCausalLM
(multi-head latent attention; DeepSeek Sparse Attention's indexer as
transformers computes it: bf16/fp32 scores, no Hadamard rotation or fp8). It follows transformers, not
crashreplay: config.json is read with transformers' rules (config class
defaults per model_type, attribute_map aliases, RoPE from a non-null
rope_scaling else rope_parameters else rope_theta), safetensors with its own
parser, and quantized weights are decoded with the formats' definitions
(ModelOpt NVFP4 / FP8 / fp8_pb_wo, block FP8, MXFP4) into float32. It
recomputes the whole sequence for every call. The one deliberate deviation
from HF: K and V are rounded to bf16 after RoPE (as they enter the engine's
bf16 KV cache; for MLA the normed latent and the rotated shared key, and the
indexer's keys); pass round_kv=False for HF as shipped.

Checked against transformers itself in CI: test_fidelity.py runs it on the
checkpoints transformers wrote (tests/data/fidelity) and compares with
transformers' logits stored beside them.
"""
import json
import math
import os
import struct

import numpy as np

# transformers' config class defaults for keys a file may leave out:
# (head_dim: 0 = hidden/heads, kv heads: 0 = heads, rope_theta, partial_rotary_factor)
FAMILY = {
    "llama": dict(head_dim=0, kv=0, theta=1e4, partial=1.0),
    "mistral": dict(head_dim=0, kv=8, theta=1e4, partial=1.0),
    "qwen2": dict(head_dim=0, kv=32, theta=1e4, partial=1.0),
    "qwen3": dict(head_dim=128, kv=32, theta=1e4, partial=1.0),
    "qwen3_moe": dict(head_dim=0, kv=4, theta=1e4, partial=1.0),
    "mixtral": dict(head_dim=0, kv=8, theta=1e6, partial=1.0),
    "glm4_moe": dict(head_dim=0, kv=8, theta=1e4, partial=0.5),
    "deepseek_v3": dict(head_dim=0, kv=0, theta=1e4, partial=1.0),
    "deepseek_v32": dict(head_dim=0, kv=0, theta=1e4, partial=1.0),
    "glm_moe_dsa": dict(head_dim=0, kv=0, theta=1e4, partial=1.0),
}
MLA_TYPES = ("deepseek_v3", "deepseek_v32", "glm_moe_dsa")
# The MLA classes' defaults (DeepseekV3Config, DeepseekV32Config, GlmMoeDsaConfig).
MLA_DEFAULTS = {
    "deepseek_v3": dict(q_lora_rank=1536, qk_nope_head_dim=128, v_head_dim=128, n_group=8, topk_group=4,
                        first_k_dense_replace=3),
    "deepseek_v32": dict(q_lora_rank=1536, qk_nope_head_dim=128, v_head_dim=128, n_group=8, topk_group=4,
                         first_k_dense_replace=3, index_n_heads=64, index_head_dim=128, index_topk=2048),
    "glm_moe_dsa": dict(q_lora_rank=2048, qk_nope_head_dim=192, v_head_dim=256, n_group=1, topk_group=1,
                        first_k_dense_replace=3, index_n_heads=32, index_head_dim=128, index_topk=2048),
}


def _e4m3_table():
    t = np.zeros(256, dtype=np.float32)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 0x7
        if e == 0xF and m == 0x7:
            t[b] = np.nan
        elif e == 0:
            t[b] = s * m / 8.0 * 2.0 ** -6
        else:
            t[b] = s * (1 + m / 8.0) * 2.0 ** (e - 7)
    return t


E4M3 = _e4m3_table()
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[base + a:base + b]
        dt = info["dtype"]
        if dt == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif dt == "F32":
            arr = np.frombuffer(raw, dtype="<f4").copy()
        elif dt == "I32":
            arr = np.frombuffer(raw, dtype="<i4").copy()
        elif dt == "F8_E4M3":
            arr = E4M3[np.frombuffer(raw, dtype=np.uint8)]
        elif dt in ("U8", "F8_E8M0"):
            arr = np.frombuffer(raw, dtype=np.uint8).copy()
        else:
            raise ValueError(f"{name}: dtype {dt} not handled by the reference")
        out[name] = arr.reshape(info["shape"])
    return out


def load_checkpoint(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    if "quantization_config" not in config and os.path.exists(os.path.join(model_dir, "hf_quant_config.json")):
        with open(os.path.join(model_dir, "hf_quant_config.json")) as f:
            q = json.load(f)["quantization"]
        config["quantization_config"] = {"quant_method": "modelopt", **q}
    tensors = {}
    for fn in sorted(os.listdir(model_dir)):
        if fn.endswith(".safetensors") and fn != "golden.safetensors":
            tensors.update(read_safetensors(os.path.join(model_dir, fn)))
    return config, dequantize(config, tensors)


def dequantize(config, t):
    """Every quantized weight decoded to float32 (exact products, as the
    formats define them); scale tensors dropped."""
    q = config.get("quantization_config") or {}
    algo = q.get("quant_algo", "")
    out = {}
    for name, w in t.items():
        if name.endswith((".weight_scale", ".weight_scale_inv", ".weight_scale_2", ".input_scale")):
            continue
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if base is None:
            out[name] = w
        elif base + ".weight_scale_2" in t:  # NVFP4: e2m1 x e4m3 scale per 16 x global
            v = _unpack_e2m1(w)
            s = t[base + ".weight_scale"].astype(np.float32) * np.float32(t[base + ".weight_scale_2"].reshape(()))
            out[name] = (v.reshape(v.shape[0], -1, 16) * s[:, :, None]).reshape(v.shape)
        elif base + ".weight_scale" in t and w.dtype == np.uint8:  # MXFP4: e8m0 scale per 32
            v = _unpack_e2m1(w)
            s = np.ldexp(np.float32(1), t[base + ".weight_scale"].astype(np.int32) - 127).astype(np.float32)
            out[name] = (v.reshape(v.shape[0], -1, 32) * s[:, :, None]).reshape(v.shape)
        elif base + ".weight_scale_inv" in t or (base + ".weight_scale" in t and algo == "fp8_pb_wo"):
            s = t.get(base + ".weight_scale_inv", t.get(base + ".weight_scale"))
            br, bc = (q.get("weight_block_size") or [128, 128])
            rows, cols = w.shape
            s = s.reshape(-(-rows // br), -(-cols // bc))
            full = np.repeat(np.repeat(s, br, 0), bc, 1)[:rows, :cols]
            out[name] = (w * full).astype(np.float32)
        elif base + ".weight_scale" in t:  # ModelOpt FP8: one scale per tensor
            out[name] = (w * np.float32(t[base + ".weight_scale"].reshape(()))).astype(np.float32)
        else:
            out[name] = w
    return out


def _unpack_e2m1(packed):
    """[R, C/2] uint8 -> [R, C] float32; element 2i is the low nibble."""
    lo, hi = E2M1[packed & 0x0F], E2M1[packed >> 4]
    return np.stack([lo, hi], axis=-1).reshape(packed.shape[0], -1)


def round_bf16(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32)


def rms_norm(x, w, eps):
    var = np.mean(x.astype(np.float32) ** 2, axis=-1, keepdims=True)
    return (x / np.sqrt(var + np.float32(eps))).astype(np.float32) * w


class Config:
    """The keys the forward pass reads, with transformers' defaults."""

    def __init__(self, c):
        self.raw = c
        self.model_type = c["model_type"]
        fam = FAMILY[self.model_type]
        self.hidden = c["hidden_size"]
        self.heads = c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads") or fam["kv"] or self.heads
        self.head_dim = c.get("head_dim") or fam["head_dim"] or self.hidden // self.heads
        self.eps = c.get("rms_norm_eps", 1e-5 if self.model_type in ("mixtral", "glm4_moe", "glm_moe_dsa") else 1e-6)
        self.mla = self.model_type in MLA_TYPES
        if self.mla:
            d = MLA_DEFAULTS[self.model_type]
            self.q_lora = c.get("q_lora_rank", d["q_lora_rank"]) or 0  # null: q_proj
            self.kv_lora = c.get("kv_lora_rank", 512)
            self.nope = c.get("qk_nope_head_dim", d["qk_nope_head_dim"])
            self.rope_dim = c.get("qk_rope_head_dim", 64)
            self.v_dim = c.get("v_head_dim", d["v_head_dim"])
            # deepseek_v3 reads rope_interleave; the DSA classes always interleave.
            self.interleave = c.get("rope_interleave", True) if self.model_type == "deepseek_v3" else True
            self.head_dim = self.rope_dim  # what RoPE's frequencies span (the config's head_dim)
            self.index_topk = c.get("index_topk", d.get("index_topk", 0))
            self.index_heads = c.get("index_n_heads", d.get("index_n_heads", 0))
            self.index_dim = c.get("index_head_dim", d.get("index_head_dim", 0))
            types = c.get("indexer_types") if self.model_type == "glm_moe_dsa" else None
            self.index_full = [t == "full" for t in types] if types else [True] * c["num_hidden_layers"]
        self.layers = c["num_hidden_layers"]
        self.max_pos = c["max_position_embeddings"]
        self.qk_norm = self.model_type in ("qwen3", "qwen3_moe") or c.get("use_qk_norm", False)
        mt = self.model_type
        self.qkv_bias = mt == "qwen2" or c.get("attention_bias", False)
        self.o_bias = mt in ("llama", "qwen3", "qwen3_moe") and c.get("attention_bias", False)
        self.mlp_bias = mt == "llama" and c.get("mlp_bias", False)
        self.rope = self._rope(c, fam)

    def _rope(self, c, fam):
        # transformers 5: rope_scaling (not null) replaces rope_parameters; a
        # dict without rope_theta / partial_rotary_factor takes the top level.
        d = c.get("rope_scaling") or c.get("rope_parameters") or {}
        d = dict(d)
        d.setdefault("rope_theta", c.get("rope_theta", fam["theta"]))
        d.setdefault("partial_rotary_factor", c.get("partial_rotary_factor", fam["partial"]))
        d["rope_type"] = d.get("rope_type", d.get("type", "default"))
        if d["rope_type"] in ("llama3", "yarn", "longrope"):
            if "original_max_position_embeddings" in c:
                d["original_max_position_embeddings"] = c["original_max_position_embeddings"]
            d.setdefault("original_max_position_embeddings", self.max_pos)
        return d

    def is_moe_layer(self, layer):
        c, mt = self.raw, self.model_type
        if mt == "mixtral":
            return True
        if mt == "qwen3_moe":
            if layer in (c.get("mlp_only_layers") or []):
                return False
            return (layer + 1) % c.get("decoder_sparse_step", 1) == 0
        if mt == "glm4_moe":
            return layer >= c.get("first_k_dense_replace", 1)
        if mt in MLA_TYPES:
            if mt != "deepseek_v3" and c.get("mlp_layer_types"):
                return c["mlp_layer_types"][layer] == "sparse"
            return layer >= c.get("first_k_dense_replace", MLA_DEFAULTS[mt]["first_k_dense_replace"])
        return False


def inv_freq(cfg):
    r = cfg.rope
    dim = int(cfg.head_dim * r["partial_rotary_factor"])
    base = r["rope_theta"]
    # transformers computes these in float32
    pos = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    f = (1.0 / (np.float32(base) ** pos)).astype(np.float32)
    kind, scale = r["rope_type"], 1.0
    if kind == "linear":
        f = f / np.float32(r["factor"])
    elif kind == "llama3":
        factor, lo, hi = r["factor"], r["low_freq_factor"], r["high_freq_factor"]
        orig = r["original_max_position_embeddings"]
        wavelen = 2 * math.pi / f
        scaled = np.where(wavelen > orig / lo, f / factor, f)
        smooth = (orig / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        mid = ~(wavelen < orig / hi) & ~(wavelen > orig / lo)
        f = np.where(mid, smoothed, scaled).astype(np.float32)
    elif kind == "yarn":
        factor = r.get("factor") or cfg.max_pos / r["original_max_position_embeddings"]
        orig = r["original_max_position_embeddings"]

        def mscale(s, m=1.0):
            return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

        scale = r.get("attention_factor")
        if scale is None:
            m, mad = r.get("mscale"), r.get("mscale_all_dim")
            scale = mscale(factor, m) / mscale(factor, mad) if m and mad else mscale(factor)
        bf, bs = r.get("beta_fast") or 32, r.get("beta_slow") or 1

        def corr(rot):
            return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

        low, high = corr(bf), corr(bs)
        if r.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
        extra = 1 - ramp
        f = (f / np.float32(factor) * (1 - extra) + f * extra).astype(np.float32)
    elif kind != "default":
        raise ValueError(f"rope type {kind} not in the reference")
    return f, dim, np.float32(scale)


def apply_rope(x, positions, freqs, dim, scale):
    # x: [T, heads, head_dim]; rotate-half over the first `dim` dims.
    ang = positions[:, None].astype(np.float32) * freqs[None, :]
    emb = np.concatenate([ang, ang], axis=-1)
    cos, sin = (np.cos(emb) * scale)[:, None, :], (np.sin(emb) * scale)[:, None, :]
    half = dim // 2
    rot = x[..., :dim]
    rotated = np.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    out = x.copy()
    out[..., :dim] = rot * cos + rotated * sin
    return out


def apply_rope_interleaved(x, positions, freqs, scale):
    """transformers' apply_rotary_pos_emb_interleave: pairs (2i, 2i+1) rotate by
    frequency i; the result is laid out [even outputs | odd outputs]."""
    ang = positions[:, None].astype(np.float32) * freqs[None, :]
    cos, sin = (np.cos(ang) * scale)[:, None, :], (np.sin(ang) * scale)[:, None, :]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(np.float32)


def _softmax_rows(s):
    s = np.exp(s - s.max(-1, keepdims=True))
    return s / s.sum(-1, keepdims=True)


def _indexer(cfg, t, x, q_latent, pos, freqs, scale, round_kv):
    """DeepseekV32Indexer / GlmMoeDsaIndexer: [T, T] boolean, True at the
    keys each query's top-k selects (causal positions only compete)."""
    a = "indexer."
    T, nh, d, r = x.shape[0], cfg.index_heads, cfg.index_dim, cfg.rope_dim
    q = (q_latent @ t[a + "wq_b.weight"].T).reshape(T, nh, d)
    k = x @ t[a + "wk.weight"].T
    mu = k.mean(-1, keepdims=True)
    var = ((k - mu) ** 2).mean(-1, keepdims=True)
    k = ((k - mu) / np.sqrt(var + np.float32(1e-6)) * t[a + "k_norm.weight"] + t[a + "k_norm.bias"])[:, None, :]
    if cfg.model_type == "glm_moe_dsa":  # interleaved; DeepSeek-V3.2's indexer rotates half-split
        q = np.concatenate([apply_rope_interleaved(q[..., :r], pos, freqs, scale), q[..., r:]], axis=-1)
        k = np.concatenate([apply_rope_interleaved(k[..., :r], pos, freqs, scale), k[..., r:]], axis=-1)
    else:
        q = apply_rope(q, pos, freqs, r, scale)
        k = apply_rope(k, pos, freqs, r, scale)
    k = k[:, 0, :]
    if round_kv:
        k = round_bf16(k)
    scores = np.maximum(np.einsum("shd,td->sht", q, k) * np.float32(d ** -0.5), 0)
    w = (x @ t[a + "weights_proj.weight"].T) * np.float32(nh ** -0.5)
    index = np.einsum("sh,sht->st", w, scores)
    index = np.where(np.tril(np.ones((T, T), dtype=bool)), index, -np.inf)
    keep = np.zeros((T, T), dtype=bool)
    for i in range(T):
        order = sorted(range(i + 1), key=lambda j: (-index[i, j], j))[: cfg.index_topk]
        keep[i, order] = True
    return keep


def _mla(cfg, t, a, x, pos, freqs, scale, round_kv, selected):
    """DeepseekV3Attention (+ the DSA mask `selected`); returns (output, the
    q latent for the indexer)."""
    T, nh, nope, r, vd = x.shape[0], cfg.heads, cfg.nope, cfg.rope_dim, cfg.v_dim
    q_latent = None
    if cfg.q_lora:
        q_latent = rms_norm(_linear(t, a + "q_a_proj", x), t[a + "q_a_layernorm.weight"], 1e-6)
        q = _linear(t, a + "q_b_proj", q_latent)
    else:
        q = _linear(t, a + "q_proj", x)
    q = q.reshape(T, nh, nope + r)
    kva = _linear(t, a + "kv_a_proj_with_mqa", x)
    latent = rms_norm(kva[:, :cfg.kv_lora], t[a + "kv_a_layernorm.weight"], 1e-6)
    k_rot = kva[:, None, cfg.kv_lora:]
    if cfg.interleave:
        q_rot, k_rot = apply_rope_interleaved(q[..., nope:], pos, freqs, scale), apply_rope_interleaved(
            k_rot, pos, freqs, scale)
    else:
        q_rot, k_rot = apply_rope(q[..., nope:], pos, freqs, r, scale), apply_rope(k_rot, pos, freqs, r, scale)
    if round_kv:
        latent, k_rot = round_bf16(latent), round_bf16(k_rot)
    kv = _linear(t, a + "kv_b_proj", latent).reshape(T, nh, nope + vd)
    q = np.concatenate([q[..., :nope], q_rot], axis=-1)
    k = np.concatenate([kv[..., :nope], np.broadcast_to(k_rot, (T, nh, r))], axis=-1)
    v = kv[..., nope:]
    rp = cfg.rope
    softmax_scale = (nope + r) ** -0.5
    if rp["rope_type"] != "default" and rp.get("mscale_all_dim"):
        m = 0.1 * rp["mscale_all_dim"] * math.log(rp["factor"]) + 1.0 if rp["factor"] > 1 else 1.0
        softmax_scale *= m * m
    mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
    if selected is not None:
        mask = np.where(selected, mask, -np.inf).astype(np.float32)
    att = np.zeros((T, nh, vd), dtype=np.float32)
    for i in range(nh):
        att[:, i, :] = _softmax_rows(q[:, i, :] @ k[:, i, :].T * np.float32(softmax_scale) + mask) @ v[:, i, :]
    return _linear(t, a + "o_proj", att.reshape(T, nh * vd)), q_latent


def silu(x):
    return x / (1.0 + np.exp(-x))


def _linear(t, name, x):
    y = x @ t[name + ".weight"].T
    if name + ".bias" in t:
        y = y + t[name + ".bias"]
    return y


def _mlp(t, p, x):
    return _linear(t, p + "down_proj", silu(_linear(t, p + "gate_proj", x)) * _linear(t, p + "up_proj", x))


def _moe(cfg, t, p, x):
    c, mt = cfg.raw, cfg.model_type
    k = c.get("num_experts_per_tok")
    pre = p + ("block_sparse_moe." if mt == "mixtral" else "mlp.")
    logits = x @ t[pre + "gate.weight"].T
    out = np.zeros_like(x)
    for i in range(x.shape[0]):
        if mt == "glm4_moe" or mt in MLA_TYPES:
            scores = 1.0 / (1.0 + np.exp(-logits[i].astype(np.float32)))
            choice = scores + t.get(pre + "gate.e_score_correction_bias", np.zeros_like(scores))
            groups = c.get("n_group", MLA_DEFAULTS.get(mt, {}).get("n_group", 1))
            per = len(scores) // groups
            gscore = [np.sort(choice[g * per:(g + 1) * per])[-2:].sum() for g in range(groups)]
            keep = sorted(range(groups), key=lambda g: (-gscore[g], g))[
                : c.get("topk_group", MLA_DEFAULTS.get(mt, {}).get("topk_group", 1))]
            masked = np.full_like(choice, -np.inf)
            for g in keep:
                masked[g * per:(g + 1) * per] = choice[g * per:(g + 1) * per]
            order = sorted(range(len(scores)), key=lambda e: (-masked[e], e))[:k]
            w = scores[order]
            if c.get("norm_topk_prob", True):
                w = w / (w.sum() + 1e-20)
            w = w * c.get("routed_scaling_factor", 2.5 if mt in MLA_TYPES else 1.0)
        else:
            probs = np.exp(logits[i] - logits[i].max())
            probs /= probs.sum()
            order = sorted(range(len(probs)), key=lambda e: (-probs[e], e))[:k]
            w = probs[order]
            if mt == "mixtral" or c.get("norm_topk_prob", False):
                w = w / w.sum()
        for e, we in zip(order, w):
            if mt == "mixtral":
                q = pre + f"experts.{e}."
                h = silu(x[i] @ t[q + "w1.weight"].T) * (x[i] @ t[q + "w3.weight"].T)
                out[i] += we * (h @ t[q + "w2.weight"].T)
            else:
                out[i] += we * _mlp(t, pre + f"experts.{e}.", x[i][None])[0]
    if (mt == "glm4_moe" or mt in MLA_TYPES) and c.get("n_shared_experts", 1) > 0:
        out = out + _mlp(t, pre + "shared_experts.", x)
    return out


def forward(config, t, tokens, round_kv=True):
    """Logits [len(tokens), vocab] of a causal forward over `tokens`."""
    cfg = config if isinstance(config, Config) else Config(config)
    nh, nkv, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
    freqs, rdim, rscale = inv_freq(cfg)
    T = len(tokens)
    pos = np.arange(T)
    h = t["model.embed_tokens.weight"][np.array(tokens)].astype(np.float32)
    mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
    selected = None
    for l in range(cfg.layers):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        x = rms_norm(h, t[p + "input_layernorm.weight"], cfg.eps)
        if cfg.mla:
            if cfg.index_topk and cfg.index_full[l]:
                q_latent = rms_norm(_linear(t, a + "q_a_proj", x), t[a + "q_a_layernorm.weight"], 1e-6)
                sub = {k[len(a):]: v for k, v in t.items() if k.startswith(a + "indexer.")}
                selected = _indexer(cfg, sub, x, q_latent, pos, freqs, rscale, round_kv)
            out, _ = _mla(cfg, t, a, x, pos, freqs, rscale, round_kv, selected if cfg.index_topk else None)
            h = h + out
            x = rms_norm(h, t[p + "post_attention_layernorm.weight"], cfg.eps)
            h = h + (_moe(cfg, t, p, x) if cfg.is_moe_layer(l) else _mlp(t, p + "mlp.", x))
            continue
        q = _linear(t, a + "q_proj", x).reshape(T, nh, hd)
        k = _linear(t, a + "k_proj", x).reshape(T, nkv, hd)
        v = _linear(t, a + "v_proj", x).reshape(T, nkv, hd)
        if cfg.qk_norm:
            q = rms_norm(q, t[a + "q_norm.weight"], cfg.eps)
            k = rms_norm(k, t[a + "k_norm.weight"], cfg.eps)
        q = apply_rope(q, pos, freqs, rdim, rscale)
        k = apply_rope(k, pos, freqs, rdim, rscale)
        if round_kv:
            k, v = round_bf16(k), round_bf16(v)
        rep = nh // nkv
        att = np.zeros((T, nh, hd), dtype=np.float32)
        for i in range(nh):
            s = (q[:, i, :] @ k[:, i // rep, :].T) / np.float32(math.sqrt(hd)) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            att[:, i, :] = s @ v[:, i // rep, :]
        h = h + _linear(t, a + "o_proj", att.reshape(T, nh * hd))
        x = rms_norm(h, t[p + "post_attention_layernorm.weight"], cfg.eps)
        h = h + (_moe(cfg, t, p, x) if cfg.is_moe_layer(l) else _mlp(t, p + "mlp.", x))
    h = rms_norm(h, t["model.norm.weight"], cfg.eps)
    head = t.get("lm_head.weight", t["model.embed_tokens.weight"])
    return h @ head.T
