"""Prefill and decode time on the CPU: crashreplay's engine beside PyTorch
eager (Hugging Face transformers' modeling code) on the same checkpoint and
thread count, and the MoE experts' weight-read rate beside the machine's
memory bandwidth. One run, side by side.

    python3 bench/decode_vs_torch.py [--build build] [--threads 1,2]
        [--layers 8 --hidden 1024 --heads 16 --kv-heads 4 --head-dim 64
         --intermediate 2816 --vocab 32000] [--batch 1] [--prompt-len 128]
        [--steps 32] [--reps 3] [--fp32] [--isa default|avx2] [--no-moe]
        [--model DIR]

Dense part: writes a random llama bf16 checkpoint with `crashreplay
make-model` (or uses --model) and runs, for each thread count,
bench/decode_bench on it --reps times (the engine through Engine::Run: one
prefill step, then decode steps, each timed from BeforeStep to AfterStep:
building the step's program, every kernel with its checks and digests,
sampling), then `AutoModelForCausalLM.from_pretrained(dtype=bfloat16)` on
the same prompt with a KV cache, torch.set_num_threads(N): one untimed
warm-up, then --reps prefills, each followed by the same number of greedy
decode steps, every forward call timed. Prefill: median of the --reps
prefills. Decode: median (and min) over every timed decode step. The ratio
columns: prefill torch / crashreplay (> 1: the engine is faster; issue 30's
target >= 1.0), decode crashreplay / torch (its share of torch's time;
target <= 0.4). The engine runs with activation_dtype=bf16 beside torch
bfloat16; --fp32 adds a row with fp32 activations beside torch float32.
--isa avx2 forces both sides' AVX2 code (CRASHREPLAY_CPU_KERNELS=avx2;
ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2,
MKL_ENABLE_INSTRUCTIONS=AVX2), the table of a host without AVX-512.

MoE part: bench/cpu_kernels_bench --only experts (one MoE layer's routed
experts at decode, top-8 of 64, hidden 2048, moe_intermediate 768, eight
other experts each step so the weights come from DRAM): the routed experts'
weight bytes read per second beside a read-only stream over 512 MiB on the
same threads, which bounds a step that reads each byte once.

Without torch/transformers installed (they are not part of CI) the PyTorch
columns read "n/a". Figures only; nothing is asserted. The machine's load
moves them: run it on an idle machine and compare columns of one run, not
runs.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
warnings.filterwarnings("ignore")


def sh(*args):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({r.returncode}):\n{r.stderr}")
    return r.stdout


def prompt_ids(batch, prompt_len, vocab):
    # The same prompts decode_bench builds.
    return [[(r * 131 + j * 17 + 1) % vocab for j in range(prompt_len)] for r in range(batch)]


def engine_times(bench, model, threads, act, a):
    prefill, decode, decode_min = [], [], []
    for _ in range(a.reps):
        r = json.loads(sh(bench, model, "--threads", str(threads), "--batch", str(a.batch), "--prompt-len",
                          str(a.prompt_len), "--steps", str(a.steps), "--set", f"activation_dtype={act}", "--json"))
        prefill.append(r["prefill_ms"])
        decode.append(r["decode_ms_p50"])
        decode_min.append(r["decode_ms_min"])
    return {"prefill_ms": statistics.median(prefill), "decode_ms_p50": statistics.median(decode),
            "decode_ms_min": min(decode_min), "sgemv_ms": r.get("openblas_sgemv_ms_p50")}


def torch_times(model_dir, dtype_name, threads, a, vocab):
    try:
        import torch
        import transformers
    except ImportError:
        return None
    torch.set_num_threads(threads)
    try:  # transformers >= 5.2x: no loading progress bars on stderr
        transformers.utils.logging.disable_progress_bar()
    except AttributeError:
        pass
    m = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype_name))
    m.eval()
    ids = torch.tensor(prompt_ids(a.batch, a.prompt_len, vocab))
    prefill, decode = [], []
    with torch.inference_mode():
        for rep in range(a.reps + 1):  # rep 0: warm-up, not timed
            t0 = time.perf_counter()
            out = m(input_ids=ids, use_cache=True)
            if rep:
                prefill.append((time.perf_counter() - t0) * 1e3)
            past = out.past_key_values
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(a.steps if rep else 2):
                t0 = time.perf_counter()
                out = m(input_ids=nxt, past_key_values=past, use_cache=True)
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                if rep:
                    decode.append((time.perf_counter() - t0) * 1e3)
                past = out.past_key_values
    return {"prefill_ms": statistics.median(prefill), "decode_ms_p50": statistics.median(decode),
            "decode_ms_min": min(decode)}


def dense(a, cli, bench, tmp):
    model = a.model
    if model is None:
        model = os.path.join(tmp, "model")
        sh(cli, "make-model", model, "--arch", "llama", "--quant", "bf16", "--layers", str(a.layers),
           "--hidden", str(a.hidden), "--heads", str(a.heads), "--kv-heads", str(a.kv_heads),
           "--head-dim", str(a.head_dim), "--intermediate", str(a.intermediate), "--vocab", str(a.vocab))
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    vocab = cfg["vocab_size"]
    print(f"dense: {cfg.get('model_type')} bf16, {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
          f"heads {cfg['num_attention_heads']}/{cfg.get('num_key_value_heads')}, intermediate "
          f"{cfg['intermediate_size']}, vocab {vocab}; batch {a.batch}, prompt {a.prompt_len}, {a.steps} decode "
          f"steps, {a.reps} reps")
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
        print("torch/transformers not installed: the PyTorch columns are n/a (pip install torch transformers)")

    def num(v, fmt="{:.1f}"):
        return "n/a" if v is None else fmt.format(v)

    def ratio(t, o):
        return "n/a" if t is None or o is None or o == 0 else f"{t / o:.2f}x"

    print()
    hdr = (f"{'threads':>7} {'activations':>11} | {'prefill ms: engine':>18} {'torch':>8} {'torch/engine':>12} | "
           f"{'decode ms: engine':>22} {'torch':>16} {'engine/torch':>12} | {'sgemv':>6}")
    print(hdr)
    rows = []
    acts = ["bf16"] + (["fp32"] if a.fp32 else [])
    for t in [int(x) for x in a.threads.split(",")]:
        for act in acts:
            # The engine with activation_dtype = act beside torch running the
            # model in the same dtype.
            ours = engine_times(bench, model, t, act, a)
            theirs = torch_times(model, "bfloat16" if act == "bf16" else "float32", t, a, vocab) if have_torch else None
            tb = theirs or {}
            line = (f"{t:>7} {act:>11} | {ours['prefill_ms']:>18.1f} {num(tb.get('prefill_ms')):>8} "
                    f"{ratio(tb.get('prefill_ms'), ours['prefill_ms']):>12} | "
                    f"{ours['decode_ms_p50']:>10.2f} ({ours['decode_ms_min']:.2f} min) "
                    f"{num(tb.get('decode_ms_p50'), '{:.2f}'):>7} ({num(tb.get('decode_ms_min'), '{:.2f}')}) "
                    f"{ratio(ours['decode_ms_p50'], tb.get('decode_ms_p50')):>12} | "
                    f"{num(ours['sgemv_ms'], '{:.2f}'):>6}")
            print(line, flush=True)
            rows.append({"threads": t, "activations": act, "engine": ours, "torch": theirs})
    print("engine: Engine::Run with --set activation_dtype=<activations>, every kernel checked and digested, fixed")
    print("summation order (same bits at any thread count). torch: HF eager forward with a KV cache, the model in")
    print("the same dtype. Prefill: torch/engine (> 1: the engine is faster); decode: engine/torch (the share of")
    print("torch's time). sgemv: OpenBLAS over float32 copies of the decode step's projections and LM head alone")
    print("(median ms). Decode: median (min) step.")
    return rows


def moe(a, kbench):
    print()
    print("MoE decode step, routed experts (1 token, top-8 of 64, hidden 2048, moe_intermediate 768):")
    print(f"{'threads':>7} {'format':>12} {'MB/step':>8} {'ms':>8} {'GB/s':>7} {'M params/s':>11} "
          f"{'stream GB/s':>12} {'of stream':>10}")
    rows = []
    for t in [int(x) for x in a.threads.split(",")]:
        r = json.loads(sh(kbench, "--only", "experts", "--no-reference", "--threads", str(t), "--json"))
        for e in r["experts"]:
            gbs = e["bytes"] / e["fast_ms"] * 1e-6
            print(f"{t:>7} {e['format']:>12} {e['bytes'] * 1e-6:>8.2f} {e['fast_ms']:>8.3f} {gbs:>7.2f} "
                  f"{e['params'] / e['fast_ms'] * 1e-3:>11.0f} {r['read_gbs']:>12.2f} "
                  f"{gbs / r['read_gbs'] * 100:>9.0f}%", flush=True)
        rows.append(r)
    print("stream: a read-only pass over 512 MiB on the same threads; a decode step reads each routed weight byte")
    print("once, so that rate is its bound. isa: " + rows[-1]["isa"])
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", help="an existing llama-family checkpoint directory")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=2816)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3, help="prefills (and decode runs) timed per column")
    ap.add_argument("--fp32", action="store_true",
                    help="add rows with fp32 activations beside torch float32")
    ap.add_argument("--isa", choices=["default", "avx2"], default="default",
                    help="avx2: the engine's AVX2 kernels and torch's AVX2 code (oneDNN, MKL, ATen), "
                    "as on a host without AVX-512")
    ap.add_argument("--no-moe", action="store_true", help="skip the MoE experts part")
    a = ap.parse_args()
    if a.isa == "avx2":  # before torch is imported: it reads the variable once
        os.environ["CRASHREPLAY_CPU_KERNELS"] = "avx2"
        os.environ["ATEN_CPU_CAPABILITY"] = "avx2"
        os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX2"  # torch's bf16 and fp32 matmuls
        os.environ["MKL_ENABLE_INSTRUCTIONS"] = "AVX2"
    cli = os.path.join(a.build, "tools", "crashreplay")
    bench = os.path.join(a.build, "bench", "decode_bench")
    kbench = os.path.join(a.build, "bench", "cpu_kernels_bench")
    for p in (cli, bench, kbench):
        if not os.path.exists(p):
            sys.exit(f"{p} not found: build first (bash scripts/build.sh)")
    print(f"cpus: {os.cpu_count()}, load average {os.getloadavg()[0]:.2f}, isa: {a.isa}")
    with tempfile.TemporaryDirectory() as tmp:
        dense(a, cli, bench, tmp)
    if not a.no_moe:
        moe(a, kbench)


if __name__ == "__main__":
    main()
