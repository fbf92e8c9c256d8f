"""Tiny checkpoints written by transformers' own `save_pretrained` (and
nvidia-modelopt's `export_hf_checkpoint`), with transformers' float32 logits
as the reference: the data behind tests/data/fidelity/ and the fidelity run.

    python3 python/tests/fidelity_cases.py write OUT_DIR [CASE...]
    python3 python/tests/fidelity_cases.py compare DIR [--bin CRASHREPLAY]

`write` (needs torch, transformers, and nvidia-modelopt for the quantized
cases) writes OUT_DIR/<case>/ with config.json, *.safetensors (as the writer
left them) and golden.safetensors:

  prompt          I32 [P]      the prompt's token ids
  tokens          I32 [9]      greedy tokens: prefill, then 8 decode steps
  logits          F32 [9, V]   transformers' float32 logits at each of those
                               9 positions, with K and V rounded to bf16 as
                               they enter the cache (the engine's bf16 KV
                               cache); teacher-forced on `tokens`
  logits_fp32kv   F32 [9, V]   the same without the rounding (HF as shipped)

Quantized cases are exported by ModelOpt from a bf16 model; their reference
runs transformers in float32 on the checkpoint dequantized by ModelOpt's own
qtensor classes (NVFP4QTensor / FP8QTensor .dequantize in float32), i.e. with
the weights exactly as the quantizer defines them and the activations
unquantized.

`compare` (numpy only) runs the engine on every case under DIR with default
toggles and prints, per case, whether its greedy tokens equal transformers',
max |engine - transformers| against both logits, and max |numpy transcription
- transformers| (float32 K/V); it exits 1 if a case is outside ATOL + RTOL *
|transformers| or its tokens differ.
"""
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy_reference as ref  # noqa: E402

PROMPT = [3, 17, 42, 99, 5, 61, 7, 120, 33, 8, 100, 11]
STEPS = 9  # the prefill's token, then 8 decode steps
# |engine - transformers (bf16 K/V)| and |numpy - transformers (fp32 K/V)|
# must be within ATOL + RTOL * |transformers| on every logit.
ATOL = 2e-4
RTOL = 2e-4


@dataclasses.dataclass
class Case:
    name: str
    config_class: str
    arch: str
    config: dict
    dtype: str = "bfloat16"       # dtype the checkpoint is saved in
    edit: str = ""                # "legacy": config.json rewritten as transformers 4.x writes it;
                                  # "both_forms": a rope_scaling and rope_theta added beside rope_parameters
    quant: str = ""               # ModelOpt config name, e.g. NVFP4_DEFAULT_CFG
    quant_exclude: tuple = ()     # module globs ModelOpt leaves unquantized (its exclude_modules)
    engine_sets: tuple = ()       # --set the engine needs to compute what the reference does
    note: str = ""


SMALL = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
             intermediate_size=48, vocab_size=128, max_position_embeddings=256)

# MLA (DeepSeek-V3 / V3.2, GLM-5) at odd widths: 3 heads, nope 16 + rope 8,
# v 12, q latent 24, KV latent 32; DeepSeek routing over 4 experts.
MLA = dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=3, num_hidden_layers=2, intermediate_size=40,
           vocab_size=128, max_position_embeddings=256, n_routed_experts=4, num_experts_per_tok=2,
           moe_intermediate_size=16, n_group=2, topk_group=1, first_k_dense_replace=1, q_lora_rank=24,
           kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, routed_scaling_factor=1.5)
# The DSA indexer: 16 heads of 32, top-8 (the sequences here reach 20 tokens).
# With few heads, relu leaves many keys at exactly 0, and torch.topk breaks
# such ties in no specified order: 16 heads make an all-zero score rare.
DSA = dict(index_n_heads=16, index_head_dim=32, index_topk=8)
# DeepSeek-V3's YaRN (factor 40 over the original context), scaled down.
DEEPSEEK_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 64,
                 "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}

CASES = [
    Case("llama_llama3_rope", "LlamaConfig", "LlamaForCausalLM",
         dict(SMALL, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 64}),
         note="llama3 RoPE in rope_parameters only (transformers 5's form)"),
    Case("llama_tied_hd48", "LlamaConfig", "LlamaForCausalLM",
         dict(SMALL, head_dim=48, num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
              attention_bias=True, mlp_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 50000.0}),
         dtype="float32", note="tied embeddings, head_dim 48 != hidden/heads, q/k/v/o and MLP biases, fp32"),
    Case("llama_legacy_linear", "LlamaConfig", "LlamaForCausalLM",
         dict(SMALL, rope_parameters={"rope_type": "linear", "rope_theta": 20000.0, "factor": 2.0}),
         edit="legacy", note="config.json in the 4.x form: rope_theta + rope_scaling"),
    Case("llama_both_forms", "LlamaConfig", "LlamaForCausalLM",
         dict(SMALL, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 64}),
         edit="both_forms", note="rope_parameters (llama3) and rope_scaling (linear) + rope_theta disagree"),
    Case("qwen2_yarn", "Qwen2Config", "Qwen2ForCausalLM",
         dict(SMALL, rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                      "original_max_position_embeddings": 64}),
         note="q/k/v biases, YaRN"),
    Case("mistral", "MistralConfig", "MistralForCausalLM", dict(SMALL, head_dim=16),
         note="sliding_window 4096 (the class default) > every sequence here"),
    Case("qwen3", "Qwen3Config", "Qwen3ForCausalLM", dict(SMALL, head_dim=16, rope_parameters={
        "rope_type": "default", "rope_theta": 1000000.0}), note="q/k RMSNorm"),
    Case("qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
         dict(SMALL, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True,
              mlp_only_layers=[0]),
         note="num_local_experts (v5 spelling), no head_dim key, first layer dense (mlp_only_layers)"),
    Case("qwen3_moe_legacy", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
         dict(SMALL, num_hidden_layers=1, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16),
         dtype="float32", edit="legacy", note="num_experts (4.x spelling), rope_theta at the top, fp32"),
    Case("mixtral", "MixtralConfig", "MixtralForCausalLM",
         dict(SMALL, num_local_experts=4, num_experts_per_tok=2, intermediate_size=32),
         note="the class's default rope_theta 1e6"),
    Case("glm4_moe", "Glm4MoeConfig", "Glm4MoeForCausalLM",
         dict(SMALL, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, n_group=2,
              topk_group=1, routed_scaling_factor=1.5, first_k_dense_replace=1, attention_bias=True,
              use_qk_norm=True, n_shared_experts=1),
         note="no head_dim key (hidden/heads), partial rotary 0.5, sigmoid grouped routing with bias"),
    Case("deepseek_v3_yarn", "DeepseekV3Config", "DeepseekV3ForCausalLM",
         dict(MLA, max_position_embeddings=2560, rope_parameters=DEEPSEEK_YARN),
         note="MLA with q_lora, interleaved rope, DeepSeek's YaRN (mscale_all_dim scales the softmax)"),
    Case("deepseek_v3_qproj_fp32", "DeepseekV3Config", "DeepseekV3ForCausalLM",
         dict(MLA, q_lora_rank=None, rope_interleave=False, num_hidden_layers=1, first_k_dense_replace=0,
              rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                               "original_max_position_embeddings": 64, "mscale": 0.707, "mscale_all_dim": 1.0}),
         dtype="float32", edit="legacy",
         note="q_proj (q_lora_rank null), rotate-half rope, YaRN attention factor != 1, 4.x keys, fp32"),
    Case("deepseek_v32", "DeepseekV32Config", "DeepseekV32ForCausalLM",
         dict(MLA, **DSA, max_position_embeddings=2560, rope_parameters=DEEPSEEK_YARN),
         dtype="float32", note="DSA: indexer top-8 of up to 20 tokens, half-split indexer rope, YaRN, fp32"),
    Case("glm_moe_dsa", "GlmMoeDsaConfig", "GlmMoeDsaForCausalLM",
         dict(MLA, **DSA, num_hidden_layers=3, n_group=1, topk_group=1, indexer_types=["full", "shared", "full"],
              rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
         note="GLM-5: DSA with a layer reusing the previous top-k, interleaved indexer rope"),
    Case("glm_moe_dsa_nvfp4", "GlmMoeDsaConfig", "GlmMoeDsaForCausalLM",
         dict(MLA, **DSA, hidden_size=64, intermediate_size=48, n_group=1, topk_group=1,
              indexer_types=["full", "shared"], rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
         quant="NVFP4_DEFAULT_CFG", quant_exclude=("*self_attn*", "*shared_experts*"),
         engine_sets=("nvfp4_activation=w4a16",),
         note="GLM-5 NVFP4 as ModelOpt exports it with attention, indexer and shared experts excluded"),
    Case("llama_nvfp4", "LlamaConfig", "LlamaForCausalLM", dict(SMALL),
         quant="NVFP4_DEFAULT_CFG", engine_sets=("nvfp4_activation=w4a16",),
         note="ModelOpt NVFP4 (W4A4 checkpoint, compared as W4A16: the reference does not quantize activations)"),
    Case("qwen3_w4a16_nvfp4", "Qwen3Config", "Qwen3ForCausalLM", dict(SMALL, head_dim=16),
         quant="W4A16_NVFP4_CFG", note="ModelOpt W4A16_NVFP4 (weight-only)"),
    Case("llama_fp8", "LlamaConfig", "LlamaForCausalLM", dict(SMALL),
         quant="FP8_DEFAULT_CFG", note="ModelOpt FP8 per-tensor (activations left unquantized)"),
    Case("llama_fp8_pb_wo", "LlamaConfig", "LlamaForCausalLM",
         dict(SMALL, hidden_size=136, num_attention_heads=2, num_key_value_heads=1, head_dim=68,
              intermediate_size=40, num_hidden_layers=1, tie_word_embeddings=True),
         quant="FP8_2D_BLOCKWISE_WEIGHT_ONLY_CFG", note="ModelOpt FP8 2-D blockwise weight-only, partial blocks"),
]


def _randomize(model, torch, seed):
    """Weights with O(1) logits (HF's 0.02 init gives near-uniform ones, so
    greedy tokens would hinge on noise), non-trivial norms and biases."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if not p.is_floating_point() or "inv_freq" in name:
                continue
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"):
                v = 1.0 + 0.2 * r
            elif name.endswith("bias"):  # linear biases and e_score_correction_bias
                v = 0.1 * r
            elif "embed_tokens" in name:
                v = r
            else:
                v = r / (p.shape[-1] ** 0.5)
            p.copy_(v.to(p.dtype))


def _legacy_config(path, torch_dtype):
    """config.json as transformers 4.x writes it: rope_theta + rope_scaling at
    the top (partial_rotary_factor too), torch_dtype, qwen MoE's num_experts."""
    with open(path) as f:
        c = json.load(f)
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    if "partial_rotary_factor" in rp:
        c["partial_rotary_factor"] = rp.pop("partial_rotary_factor")
    if c.get("model_type") == "deepseek_v3" and rp.get("rope_type") != "default":
        rp["type"] = rp.pop("rope_type")  # DeepSeek-V3's own config.json names it "type"
    c["rope_scaling"] = None if rp.get("rope_type") == "default" else rp
    if c.get("model_type") in ("qwen3_moe", "qwen2_moe") and "num_local_experts" in c:
        c["num_experts"] = c.pop("num_local_experts")
    c.pop("dtype", None)
    c["torch_dtype"] = torch_dtype
    c["transformers_version"] = "4.57.1"
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)


def _both_forms(path):
    """A rope_scaling (and a top-level rope_theta) that disagree with the
    file's rope_parameters, as a hand edit following 4.x instructions leaves
    a transformers 5 config. transformers 5 reads rope_scaling."""
    with open(path) as f:
        c = json.load(f)
    c["rope_theta"] = 20000.0
    c["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)


def _dequantized_state_dict(case_dir, torch):
    """The exported checkpoint with every ModelOpt-quantized weight decoded by
    ModelOpt's own qtensor classes, in float32."""
    from modelopt.torch.quantization.qtensor import FP8QTensor, NVFP4QTensor
    from safetensors.torch import load_file

    t = {}
    for f in sorted(os.listdir(case_dir)):
        if f.endswith(".safetensors") and f != "golden.safetensors":
            t.update(load_file(os.path.join(case_dir, f)))
    out = {}
    for name, w in t.items():
        if not name.endswith(".weight"):
            if name.endswith((".weight_scale", ".weight_scale_2", ".input_scale")):
                continue
            out[name] = w.float()
            continue
        base = name[: -len(".weight")]
        if base + ".weight_scale_2" in t:  # NVFP4 / W4A16_NVFP4
            shape = (w.shape[0], w.shape[1] * 2)
            q = NVFP4QTensor(torch.Size(shape), torch.float32, w)
            out[name] = q.dequantize(dtype=torch.float32, scale=t[base + ".weight_scale"],
                                     double_scale=t[base + ".weight_scale_2"], block_sizes={-1: 16})
        elif w.dtype == torch.float8_e4m3fn:
            s = t[base + ".weight_scale"].float()
            q = FP8QTensor(w.shape, torch.float32, w)
            if s.numel() == 1 and base + ".input_scale" in t:  # per-tensor FP8
                out[name] = q.dequantize(dtype=torch.float32, scale=s)
            else:  # 2-D blockwise: ModelOpt stores [rows/128, 1, cols/128, 1] (or a scalar)
                rb, cb = -(-w.shape[0] // 128), -(-w.shape[1] // 128)
                out[name] = q.dequantize(dtype=torch.float32, scale=s.reshape(rb, cb),
                                         block_sizes={-1: 128, -2: 128})
        else:
            out[name] = w.float()
    return out


def load_reference(model_dir, state_dict, torch, transformers, dtype=None, **kwargs):
    """transformers' model for `model_dir`'s architecture (its config.json,
    without a quantization_config) holding `state_dict` (per-expert names as
    checkpoints have them; from_pretrained converts them), in `dtype`
    (default float32). `kwargs` go to from_pretrained (attn_implementation,
    experts_implementation)."""
    from safetensors.torch import save_file

    dtype = dtype or torch.float32
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    config.pop("quantization_config", None)
    with tempfile.TemporaryDirectory() as plain:
        with open(os.path.join(plain, "config.json"), "w") as f:
            json.dump(config, f)
        save_file({k: v.to(dtype).contiguous() for k, v in state_dict.items()},
                  os.path.join(plain, "model.safetensors"))
        model, info = transformers.AutoModelForCausalLM.from_pretrained(plain, dtype=dtype,
                                                                         output_loading_info=True, **kwargs)
    bad = [k for k in list(info["missing_keys"]) + list(info["unexpected_keys"]) + list(info["mismatched_keys"])
           if "rotary_emb" not in str(k)]
    assert not bad, f"transformers did not load every weight of {model_dir}: {bad}"
    model.eval()
    return model


def reference_logits(model, torch, store=None, forced=None, prompt=PROMPT, steps=STEPS):
    """(greedy tokens, logits [steps, V]) of `model` on `prompt`, one token a
    step through a DynamicCache (teacher-forced on `forced` when given; the
    returned tokens are the model's own argmax either way).

    store(kind, layer, step, tensor) -> tensor, when given, replaces every
    tensor as it enters the cache, as the engine stores it: kind "k"/"v"
    (GQA: [1, kv_heads, tokens, head_dim]; MLA: "k" the normalized latent
    and "v" the roped k_rot, [1, 1, tokens, width]) or "index_k" (the DSA
    indexer's keys, [1, tokens, index_head_dim]); step counts the model's
    forward calls (0 = prefill)."""
    import transformers.cache_utils as cu

    original = cu.Cache.update
    original_indexer = cu.Cache.update_indexer
    calls = {}

    def step_of(kind, layer):
        n = calls.get((kind, layer), 0)
        calls[(kind, layer)] = n + 1
        return n

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if store is not None:
            s = step_of("kv", layer_idx)
            key_states = store("k", layer_idx, s, key_states)
            value_states = store("v", layer_idx, s, value_states)
        return original(self, key_states, value_states, layer_idx, *args, **kwargs)

    def update_indexer(self, key_states, layer_idx, *args, **kwargs):
        if store is not None:
            key_states = store("index_k", layer_idx, step_of("index_k", layer_idx), key_states)
        return original_indexer(self, key_states, layer_idx, *args, **kwargs)

    cu.Cache.update = update
    cu.Cache.update_indexer = update_indexer
    try:
        cache = cu.DynamicCache(config=model.config)
        ids = torch.tensor([prompt])
        tokens, rows = [], []
        with torch.no_grad():
            for step in range(steps):
                out = model(input_ids=ids, past_key_values=cache, use_cache=True)
                row = out.logits[0, -1]
                rows.append(row)
                tokens.append(int(row.argmax()))
                nxt = tokens[-1] if forced is None else forced[step]
                ids = torch.tensor([[nxt]])
        return tokens, torch.stack(rows)
    finally:
        cu.Cache.update = original
        cu.Cache.update_indexer = original_indexer


def _reference(model_dir, state_dict, torch, transformers):
    """(tokens, logits with bf16 K/V, logits with float32 K/V) of transformers
    in float32 on `model_dir`'s architecture holding `state_dict`: the
    golden data's reference (CI's test_fidelity.py)."""
    model = load_reference(model_dir, state_dict, torch, transformers)

    def bf16(kind, layer, step, t):
        return t.to(torch.bfloat16).to(torch.float32)

    tokens, logits = reference_logits(model, torch, store=bf16)
    _, logits_fp32kv = reference_logits(model, torch, forced=tokens)
    return tokens, logits.float(), logits_fp32kv.float()


def write_case(case, out_dir, seed=1234):
    import torch
    import transformers
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    d = os.path.join(out_dir, case.name)
    shutil.rmtree(d, ignore_errors=True)
    cfg = getattr(transformers, case.config_class)(architectures=[case.arch], **case.config)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    _randomize(model, torch, seed)
    model.eval()
    if case.quant:
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import export_hf_checkpoint

        model = model.to(torch.bfloat16)
        calib = torch.randint(0, case.config["vocab_size"], (4, 32), generator=torch.Generator().manual_seed(seed))

        def loop(m):
            with torch.no_grad():
                for row in calib:
                    m(row[None])

        qcfg = getattr(mtq, case.quant)
        if case.quant_exclude:
            qcfg = dict(qcfg, quant_cfg=list(qcfg["quant_cfg"]) +
                        [{"quantizer_name": p, "enable": False} for p in case.quant_exclude])
        model = mtq.quantize(model, qcfg, loop)
        export_hf_checkpoint(model, export_dir=d)
        for extra in ("generation_config.json",):
            if os.path.exists(os.path.join(d, extra)):
                os.remove(os.path.join(d, extra))
        state = _dequantized_state_dict(d, torch)
    else:
        model = model.to(getattr(torch, case.dtype))
        model.save_pretrained(d)
        if os.path.exists(os.path.join(d, "generation_config.json")):
            os.remove(os.path.join(d, "generation_config.json"))
        from safetensors.torch import load_file

        state = {}
        for f in sorted(os.listdir(d)):
            if f.endswith(".safetensors"):
                state.update(load_file(os.path.join(d, f)))
    if case.edit == "legacy":
        _legacy_config(os.path.join(d, "config.json"), case.dtype)
    elif case.edit == "both_forms":
        _both_forms(os.path.join(d, "config.json"))
    tokens, logits, logits_fp32kv = _reference(d, state, torch, transformers)
    meta = {
        "case": case.name, "note": case.note, "engine_sets": json.dumps(list(case.engine_sets)),
        "torch": torch.__version__, "transformers": transformers.__version__,
    }
    if case.quant:
        import modelopt

        meta["modelopt"] = modelopt.__version__
        meta["modelopt_config"] = case.quant
    save_file({"prompt": torch.tensor(PROMPT, dtype=torch.int32), "tokens": torch.tensor(tokens, dtype=torch.int32),
               "logits": logits.contiguous(), "logits_fp32kv": logits_fp32kv.contiguous()},
              os.path.join(d, "golden.safetensors"), metadata=meta)
    return d


def golden(case_dir):
    path = os.path.join(case_dir, "golden.safetensors")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        meta = json.loads(f.read(n))["__metadata__"]
    return ref.read_safetensors(path), meta


def run_engine(binary, case_dir, dump_dir, sets=()):
    """(logits [9, V], tokens, notes, stderr) of `crashreplay run` on the case's prompt."""
    g, meta = golden(case_dir)
    sets = list(json.loads(meta.get("engine_sets", "[]"))) + list(sets)
    return run_engine_on(binary, case_dir, [int(x) for x in g["prompt"]], len(g["tokens"]), dump_dir, sets)


def run_engine_on(binary, model_dir, prompt, steps, dump_dir, sets=(), record=None):
    """`record`: a session directory for `run --record` (replay it for the
    per-kernel dumps)."""
    args = [binary, "run", model_dir, "--prompt-ids", ",".join(str(x) for x in prompt),
            "--max-new-tokens", str(steps), "--dump", dump_dir, "--json"]
    if record:
        args += ["--record", record]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {r.returncode}:\n{r.stderr}")
    dumps = [ref.read_safetensors(os.path.join(dump_dir, f)) for f in sorted(os.listdir(dump_dir))]
    logits = np.stack([d["logits"][0] for d in dumps])
    tokens = [int(d["next_tokens"][0]) for d in dumps]
    return logits, tokens, json.loads(r.stdout).get("notes", []), r.stderr


def excess(got, want):
    """(max over logits of |got - want| - tolerance, max |got - want|)."""
    d = np.abs(got.astype(np.float64) - want)
    return float((d - (ATOL + RTOL * np.abs(want))).max()), float(d.max())


def numpy_logits(case_dir, round_kv=False):
    g, _ = golden(case_dir)
    config, tensors = ref.load_checkpoint(case_dir)
    prompt = [int(x) for x in g["prompt"]]
    tokens = prompt + [int(x) for x in g["tokens"][:-1]]
    return ref.forward(config, tensors, tokens, round_kv=round_kv)[len(prompt) - 1:]


def compare(binary, root):
    print(f"{'case':22} {'tokens':7} {'engine-hf':>10} {'engine-hf':>10} {'numpy-hf':>10}  notes")
    print(f"{'':22} {'':7} {'(bf16 KV)':>10} {'(fp32 KV)':>10} {'(fp32 KV)':>10}")
    ok = True
    for case in sorted(os.listdir(root)):
        d = os.path.join(root, case)
        if not os.path.isfile(os.path.join(d, "golden.safetensors")):
            continue
        g, meta = golden(d)
        with tempfile.TemporaryDirectory() as tmp:
            logits, tokens, notes, _ = run_engine(binary, d, tmp)
        same = tokens == [int(t) for t in g["tokens"]]
        e1, d1 = excess(logits, g["logits"])
        _, d2 = excess(logits, g["logits_fp32kv"])
        e3, d3 = excess(numpy_logits(d), g["logits_fp32kv"])
        good = same and e1 <= 0 and e3 <= 0
        ok = ok and good
        sets = json.loads(meta.get("engine_sets", "[]"))
        print(f"{case:22} {'equal' if same else 'DIFFER':7} {d1:10.2e} {d2:10.2e} {d3:10.2e}  {len(notes)}"
              f"{'  --set ' + ' '.join(sets) if sets else ''}{'' if good else '  FAIL'}")
    print(f"tolerance: |diff| <= {ATOL} + {RTOL} * |transformers| (bf16-KV column and numpy column)")
    return 0 if ok else 1


def main(argv):
    if len(argv) < 3 or argv[1] not in ("write", "compare"):
        print(__doc__)
        return 2
    if argv[1] == "compare":
        root = argv[2]
        binary = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
        if "--bin" in argv:
            binary = argv[argv.index("--bin") + 1]
        return compare(binary, root)
    out = argv[2]
    names = argv[3:] or [c.name for c in CASES]
    unknown = set(names) - {c.name for c in CASES}
    if unknown:
        print(f"unknown case(s): {sorted(unknown)}", file=sys.stderr)
        return 2
    os.makedirs(out, exist_ok=True)
    for c in CASES:
        if c.name in names:
            d = write_case(c, out)
            size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
            print(f"wrote {d}: {size} bytes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
