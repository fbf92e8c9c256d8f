"""An independent numpy transcription of the HF transformers forward pass
(LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM) for bf16
checkpoints, in float32, used to check crashreplay's engine.

It follows the HF modeling code, not crashreplay's: it reads safetensors with
its own parser, dequantizes nothing (bf16 only), and recomputes the whole
sequence for every position. The one deliberate deviation from HF: K and V are
rounded to bf16 after RoPE, because the engine's KV cache stores bf16 (HF
computing in bf16 rounds them too).
"""
import json
import math
import os
import struct

import numpy as np


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
        elif dt == "F32":
            arr = np.frombuffer(raw, dtype="<f4").copy()
        elif dt == "I32":
            arr = np.frombuffer(raw, dtype="<i4").copy()
        else:
            raise ValueError(f"{name}: dtype {dt} not handled by the reference")
        out[name] = arr.reshape(info["shape"])
    return out


def load_checkpoint(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    tensors = {}
    for fn in sorted(os.listdir(model_dir)):
        if fn.endswith(".safetensors"):
            tensors.update(read_safetensors(os.path.join(model_dir, fn)))
    return config, tensors


def round_bf16(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32)


def rms_norm(x, w, eps):
    var = np.mean(x.astype(np.float32) ** 2, axis=-1, keepdims=True)
    return (x / np.sqrt(var + np.float32(eps))).astype(np.float32) * w


def inv_freq(config, head_dim):
    dim = int(head_dim * config.get("partial_rotary_factor", 1.0))
    dim -= dim % 2
    theta = config.get("rope_theta", 10000.0)
    scaling = config.get("rope_scaling") or {}
    f = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        f = f / scaling["factor"]
    elif kind == "llama3":
        factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        orig = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / f
        smooth = (orig / wavelen - lo) / (hi - lo)
        scaled = np.where(wavelen > orig / lo, f / factor, f)
        mid = (wavelen >= orig / hi) & (wavelen <= orig / lo)
        f = np.where(mid, (1 - smooth) * f / factor + smooth * f, scaled)
    elif kind != "default":
        raise ValueError(f"rope type {kind} not in the reference")
    return f.astype(np.float32), dim


def apply_rope(x, positions, freqs, dim):
    # x: [T, heads, head_dim]; rotate-half over the first `dim` dims.
    ang = positions[:, None].astype(np.float32) * freqs[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    half = dim // 2
    a, b = x[..., :half].copy(), x[..., half:dim].copy()
    out = x.copy()
    out[..., :half] = a * cos - b * sin
    out[..., half:dim] = b * cos + a * sin
    return out


def silu(x):
    return x / (1.0 + np.exp(-x))


def moe(config, t, p, x):
    logits = x @ t[p + "mlp.gate.weight"].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    k = config["num_experts_per_tok"]
    out = np.zeros_like(x)
    for i in range(x.shape[0]):
        order = sorted(range(probs.shape[1]), key=lambda e: (-probs[i, e], e))[:k]
        w = probs[i, order]
        if config.get("norm_topk_prob", False):
            w = w / w.sum()
        for e, we in zip(order, w):
            q = p + f"mlp.experts.{e}."
            h = silu(x[i] @ t[q + "gate_proj.weight"].T) * (x[i] @ t[q + "up_proj.weight"].T)
            out[i] += we * (h @ t[q + "down_proj.weight"].T)
    return out


def forward(config, t, tokens):
    """Logits [len(tokens), vocab] of a causal forward over `tokens`."""
    H = config["hidden_size"]
    nh, nkv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim", H // nh)
    eps = config["rms_norm_eps"]
    qk_norm = config["model_type"] in ("qwen3", "qwen3_moe")
    freqs, rdim = inv_freq(config, hd)
    T = len(tokens)
    pos = np.arange(T)
    h = t["model.embed_tokens.weight"][np.array(tokens)].astype(np.float32)
    mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
    for l in range(config["num_hidden_layers"]):
        p = f"model.layers.{l}."
        x = rms_norm(h, t[p + "input_layernorm.weight"], eps)
        q = (x @ t[p + "self_attn.q_proj.weight"].T).reshape(T, nh, hd)
        k = (x @ t[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, hd)
        v = (x @ t[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, hd)
        if qk_norm:
            q = rms_norm(q, t[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, t[p + "self_attn.k_norm.weight"], eps)
        q = apply_rope(q, pos, freqs, rdim)
        k = round_bf16(apply_rope(k, pos, freqs, rdim))
        v = round_bf16(v)
        rep = nh // nkv
        att = np.zeros((T, nh, hd), dtype=np.float32)
        for i in range(nh):
            s = (q[:, i, :] @ k[:, i // rep, :].T) / np.float32(math.sqrt(hd)) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            att[:, i, :] = s @ v[:, i // rep, :]
        h = h + att.reshape(T, nh * hd) @ t[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, t[p + "post_attention_layernorm.weight"], eps)
        if p + "mlp.gate.weight" in t:
            h = h + moe(config, t, p, x)
        else:
            g = x @ t[p + "mlp.gate_proj.weight"].T
            u = x @ t[p + "mlp.up_proj.weight"].T
            h = h + (silu(g) * u) @ t[p + "mlp.down_proj.weight"].T
    h = rms_norm(h, t["model.norm.weight"], eps)
    head = t.get("lm_head.weight", t["model.embed_tokens.weight"])
    return h @ head.T
