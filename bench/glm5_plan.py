"""A paper plan for replaying GLM-5-NVFP4: per-kernel rates measured on
scaled glm_moe_dsa NVFP4 checkpoints, extrapolated to GLM-5's shapes.

    python3 bench/glm5_plan.py [--build build] [--sizes 512,1024,2048]
        [--prompt-len 128] [--reps 3] [--work DIR] [--json OUT]

For each hidden size H it writes, with `crashreplay make-model`, a 3-layer
glm_moe_dsa ModelOpt NVFP4 checkpoint with GLM-5's per-head shapes
(kv_lora_rank 512, qk_nope 192, qk_rope 64, v_head 256, index_head_dim 128,
index_topk 2048, top-8 routing, one shared expert) and its ratios scaled to H
(heads H/128, q_lora_rank and moe_intermediate ~H/3, dense intermediate 2H,
indexer heads = heads/2, 32 or 64 experts); layer 0 is dense, layers 1-2 MoE,
as make-model writes them. Then, at one thread:

  run --prompt-ids (prompt-len tokens) --max-new-tokens 2 --record S
      -> peak RSS (/usr/bin/time -v) beside the checkpoint's bytes
  replay S --step 0 --json  (prefill)  and  replay S --step 1 --json (decode)
      --reps times; per kernel, the minimum of its `micros`

Each kernel's work (multiply-adds) is computed from the configuration, the
step's tokens and the positions it attends (DSA: min(index_topk, pos+1)); the
kernel's rate is work / micros. GLM-5 per layer = its work / the rate
measured on the largest scaled model (the spread over sizes is printed, so a
rate that is not size-independent shows). The table in docs/replay.md is
built from this output plus the bandwidth assumptions stated there.
Figures only; nothing is asserted.
"""
import argparse
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

# GLM-5 (transformers 5.24 GlmMoeDsaConfig() defaults).
GLM5 = dict(hidden=6144, layers=78, dense_layers=3, heads=64, q_lora=2048,
            kv_lora=512, nope=192, rope=64, v=256, index_heads=32,
            index_dim=128, index_topk=2048, experts=256, topk=8, shared=1,
            moe_inter=2048, inter=12288, vocab=154880)


def scaled(h):
    heads = max(2, h // 128)
    third = (h // 3 + 15) // 16 * 16
    return dict(hidden=h, layers=3, dense_layers=1, heads=heads, q_lora=third,
                kv_lora=512, nope=192, rope=64, v=256,
                index_heads=max(1, heads // 2), index_dim=128, index_topk=2048,
                experts=32 if h < 1024 else 64, topk=8, shared=1,
                moe_inter=third, inter=2 * h, vocab=320)


def sh(args, timed=False):
    if timed:
        args = ["/usr/bin/time", "-v"] + args
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    rss = None
    if timed:
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr)
        rss = int(m.group(1)) * 1024
    return r.stdout, rss


def ckpt_bytes(model_dir):
    """Tensor bytes per layer index (-1: outside the layers), from the header."""
    per = {}
    for name in os.listdir(model_dir):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(model_dir, name), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        for k, v in header.items():
            if k == "__metadata__":
                continue
            m = re.match(r"model\.layers\.(\d+)\.", k)
            layer = int(m.group(1)) if m else -1
            b, e = v["data_offsets"]
            per[layer] = per.get(layer, 0) + (e - b)
    return per


def attended(positions, topk):
    return sum(min(topk, p + 1) for p in positions)


def work(kernel, c, tokens, positions):
    """Multiply-adds of one kernel of one layer (all ranks together)."""
    h, T = c["hidden"], tokens
    qk = c["nope"] + c["rope"]
    linear = {
        "q_a_proj": c["q_lora"] * h,
        "q_b_proj": c["heads"] * qk * c["q_lora"],
        "kv_a_proj": (c["kv_lora"] + c["rope"]) * h,
        "kv_b_proj": c["heads"] * (c["nope"] + c["v"]) * c["kv_lora"],
        "q_absorb": c["heads"] * c["nope"] * c["kv_lora"],
        "v_up": c["heads"] * c["v"] * c["kv_lora"],
        "o_proj": h * c["heads"] * c["v"],
        "indexer_q_proj": c["index_heads"] * c["index_dim"] * c["q_lora"],
        "indexer_k_proj": c["index_dim"] * h,
        "indexer_weights_proj": c["index_heads"] * h,
        "router": c["experts"] * h,
        "shared_expert": 3 * h * c["moe_inter"] * c["shared"],
        "gate_proj": c["inter"] * h,
        "up_proj": c["inter"] * h,
        "down_proj": c["inter"] * h,
        "experts": c["topk"] * 3 * h * c["moe_inter"],
        "lm_head": c["vocab"] * h,
    }
    if kernel in linear:
        return linear[kernel] * T, "linear"
    if kernel == "attention":
        a = attended(positions, c["index_topk"])
        if T == 1:  # absorbed: scores over kv_lora+rope, sum over kv_lora
            return c["heads"] * (c["kv_lora"] + c["rope"] + c["kv_lora"]) * a, "attention"
        return c["heads"] * (qk + c["v"]) * a, "attention"
    if kernel == "indexer":
        return c["index_heads"] * c["index_dim"] * sum(p + 1 for p in positions), "attention"
    return T * h, "elementwise"


def kernel_micros(session, step, reps, build):
    best = {}
    for _ in range(reps):
        out, _ = sh([f"{build}/tools/crashreplay", "replay", session, "--step",
                     str(step), "--threads", "1", "--json"])
        for k in json.loads(out)["kernels"]:
            key = (k["layer"], k["kernel"])
            best[key] = min(best.get(key, float("inf")), k["micros"])
    return best


def measure(h, args, work_dir):
    c = scaled(h)
    d = os.path.join(work_dir, f"glm_h{h}")
    if not os.path.exists(os.path.join(d, "config.json")):
        sh([f"{args.build}/tools/crashreplay", "make-model", d, "--arch",
            "glm_moe_dsa", "--quant", "nvfp4", "--layers", str(c["layers"]),
            "--hidden", str(h), "--heads", str(c["heads"]),
            "--q-lora-rank", str(c["q_lora"]), "--kv-lora-rank", str(c["kv_lora"]),
            "--qk-nope-head-dim", str(c["nope"]), "--qk-rope-head-dim", str(c["rope"]),
            "--v-head-dim", str(c["v"]), "--index-n-heads", str(c["index_heads"]),
            "--index-head-dim", str(c["index_dim"]), "--index-topk", str(c["index_topk"]),
            "--experts", str(c["experts"]), "--experts-per-tok", str(c["topk"]),
            "--shared-experts", str(c["shared"]), "--moe-intermediate", str(c["moe_inter"]),
            "--intermediate", str(c["inter"]), "--vocab", str(c["vocab"]),
            "--threads", "2"])
    per_layer = ckpt_bytes(d)
    total = sum(per_layer.values())
    session = os.path.join(work_dir, f"s_h{h}")
    subprocess.run(["rm", "-rf", session])
    ids = ",".join(str((j * 17 + 1) % c["vocab"]) for j in range(args.prompt_len))
    _, rss = sh([f"{args.build}/tools/crashreplay", "run", d, "--prompt-ids", ids,
                 "--max-new-tokens", "2", "--threads", "1", "--record", session,
                 "--json"], timed=True)
    _, rss_empty = sh([f"{args.build}/tools/crashreplay", "--help"], timed=True)
    steps = {}
    P = args.prompt_len
    for step, T, positions in ((0, P, list(range(P))), (1, 1, [P])):
        micros = kernel_micros(session, step, args.reps, args.build)
        rows = []
        for (layer, kernel), us in sorted(micros.items()):
            if layer < 1:  # layer 1 is the first MoE layer; 0 dense, -1 outside
                if not (layer == 0 and kernel in ("gate_proj", "up_proj", "down_proj")):
                    continue
            w, cls = work(kernel, c, T, positions)
            rows.append(dict(layer=layer, kernel=kernel, micros=us, work=w, cls=cls))
        steps["prefill" if step == 0 else "decode"] = rows
    return dict(hidden=h, config=c, ckpt_bytes=total, layer_bytes=per_layer,
                rss=rss, rss_baseline=rss_empty, steps=steps)


def glm5_layer(rates, mode, P):
    """Per kernel GLM-5 micros of one MoE layer (and the dense MLP kernels)."""
    c = GLM5
    T, positions = (P, list(range(P))) if mode == "prefill" else (1, [P])
    out = {}
    for kernel, rate in rates[mode].items():
        w, _ = work(kernel, c, T, positions)
        out[kernel] = w / rate
    return out


MLP_DENSE = ("gate_proj", "up_proj", "down_proj")
MOE_ONLY = ("experts", "shared_expert", "router", "topk", "experts_act_quant", "moe_all_reduce")


def glm5_split(k, rates):
    """(MoE layer, dense layer, whole step) micros from per-kernel micros."""
    moe = sum(v for kk, v in k.items() if kk not in MLP_DENSE)
    dense = moe - sum(k.get(x, 0) for x in MOE_ONLY) + sum(k.get(x, 0) for x in MLP_DENSE)
    step = (GLM5["layers"] - GLM5["dense_layers"]) * moe + GLM5["dense_layers"] * dense
    # lm_head runs on the last token only, at the bf16 GEMV rate of q_a_proj.
    step += GLM5["vocab"] * GLM5["hidden"] / rates["decode"]["q_a_proj"]
    return moe, dense, step


def glm5_step(rates, mode, P):
    return glm5_split(glm5_layer(rates, mode, P), rates)[2]


def glm5_bytes(c=GLM5):
    """GLM-5-NVFP4 tensor bytes under make-model's layout (experts and dense
    MLP NVFP4: 0.5 B/param + one e4m3 scale per 16; the rest bf16). Norms,
    biases and per-tensor scalars are left out (KBs a layer)."""
    h = c["hidden"]
    qk = c["nope"] + c["rope"]
    attn = (c["q_lora"] * h + c["heads"] * qk * c["q_lora"] + (c["kv_lora"] + c["rope"]) * h
            + c["heads"] * (c["nope"] + c["v"]) * c["kv_lora"] + h * c["heads"] * c["v"]
            + c["index_heads"] * c["index_dim"] * c["q_lora"] + c["index_dim"] * h
            + c["index_heads"] * h) * 2
    nv = 0.5 + 1 / 16
    expert = 3 * h * c["moe_inter"] * nv
    shared = 3 * h * c["moe_inter"] * 2
    router = c["experts"] * h * 2
    dense_mlp = 3 * h * c["inter"] * nv
    moe_layer = attn + c["experts"] * expert + shared + router
    dense_layer = attn + dense_mlp
    embed = c["vocab"] * h * 2
    total = c["dense_layers"] * dense_layer + (c["layers"] - c["dense_layers"]) * moe_layer + 2 * embed
    return dict(attn=attn, expert=expert, shared=shared, moe_layer=moe_layer,
                dense_layer=dense_layer, embed=embed, total=total,
                decode_touched_moe=attn + c["topk"] * expert + shared + router)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--sizes", default="512,1024,2048")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--work", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    work_dir = args.work or tempfile.mkdtemp(prefix="glm5_plan_")
    os.makedirs(work_dir, exist_ok=True)
    runs = [measure(int(h), args, work_dir) for h in args.sizes.split(",")]

    print("## measured (1 thread)")
    print("| hidden | checkpoint MB | peak RSS MB (run, tp 1) | RSS / checkpoint | "
          "MoE layer MB (header / formula) | prefill MoE layer ms | decode MoE layer ms |")
    print("|---|---|---|---|---|---|---|")
    for r in runs:
        pre = sum(x["micros"] for x in r["steps"]["prefill"] if x["layer"] == 1) / 1e3
        dec = sum(x["micros"] for x in r["steps"]["decode"] if x["layer"] == 1) / 1e3
        print(f"| {r['hidden']} | {r['ckpt_bytes']/1e6:.1f} | {r['rss']/1e6:.1f} | "
              f"{r['rss']/r['ckpt_bytes']:.2f} | {r['layer_bytes'][1]/1e6:.2f} / "
              f"{glm5_bytes(r['config'])['moe_layer']/1e6:.2f} | "
              f"{pre:.1f} | {dec:.2f} |")

    # Per-kernel rates (work per microsecond), by size; the layer 1 (MoE)
    # kernels and layer 0's dense MLP.
    rates = {"prefill": {}, "decode": {}}
    by_size = [{"prefill": {}, "decode": {}} for _ in runs]
    print("\n## per-kernel rate, M multiply-adds / s (elementwise: M elements / s)")
    for mode in ("prefill", "decode"):
        kernels = sorted({x["kernel"] for x in runs[-1]["steps"][mode]})
        print(f"\n{mode}: | kernel | " + " | ".join(f"h{r['hidden']}" for r in runs) + " |")
        for k in kernels:
            vals = []
            for r in runs:
                xs = [x for x in r["steps"][mode] if x["kernel"] == k]
                vals.append(sum(x["work"] for x in xs) / max(1e-3, sum(x["micros"] for x in xs)))
            rates[mode][k] = vals[-1]
            for i, v in enumerate(vals):
                by_size[i][mode][k] = v
            print(f"| {k} | " + " | ".join(f"{v:.0f}" for v in vals) + " |")

    b = glm5_bytes()
    P = args.prompt_len
    print("\n## GLM-5-NVFP4 extrapolated (make-model's layout)")
    print(f"checkpoint {b['total']/1e9:.1f} GB: MoE layer {b['moe_layer']/1e9:.2f} GB "
          f"(attention+indexer bf16 {b['attn']/1e6:.0f} MB, one routed expert "
          f"{b['expert']/1e6:.1f} MB, shared {b['shared']/1e6:.1f} MB), dense layer "
          f"{b['dense_layer']/1e9:.2f} GB, embed / lm_head {b['embed']/1e9:.2f} GB each; "
          f"decode touches {b['decode_touched_moe']/1e6:.0f} MB of a MoE layer")
    res = {}
    for mode in ("prefill", "decode"):
        k = glm5_layer(rates, mode, P)
        moe, dense, step = glm5_split(k, rates)
        res[mode] = dict(moe_layer_s=moe / 1e6, dense_layer_s=dense / 1e6, step_s=step / 1e6,
                         kernels={kk: v / 1e6 for kk, v in sorted(k.items(), key=lambda t: -t[1])[:6]})
        print(f"{mode} ({P if mode == 'prefill' else 1} tokens): MoE layer {moe/1e6:.3f} s, "
              f"dense layer {dense/1e6:.3f} s, step (78 layers + lm_head) {step/1e6:.1f} s at 1 thread; "
              f"largest kernels: " + ", ".join(f"{kk} {v/1e6:.3f}" for kk, v in
                                                 sorted(k.items(), key=lambda t: -t[1])[:4]))
    for mode in ("prefill", "decode"):
        steps = [glm5_step(r, mode, P) / 1e6 for r in by_size]
        print(f"{mode} step with each size's rates: " + ", ".join(
            f"h{r['hidden']} {t:.1f} s" for r, t in zip(runs, steps)))
        res[mode]["step_s_by_size"] = steps
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(runs=runs, rates=rates, glm5_bytes=b, glm5=res), f, indent=1,
                      default=str)


if __name__ == "__main__":
    main()
