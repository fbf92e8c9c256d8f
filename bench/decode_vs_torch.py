"""Decode-step time on the CPU: crashreplay's engine beside PyTorch eager
(Hugging Face transformers' modeling code) on the same checkpoint and thread
count.

    python3 bench/decode_vs_torch.py [--build build] [--threads 1,2]
        [--layers 8 --hidden 1024 --heads 16 --kv-heads 4 --head-dim 64
         --intermediate 2816 --vocab 32000] [--batch 1] [--prompt-len 128]
        [--steps 32] [--model DIR]

Writes a random llama bf16 checkpoint with `crashreplay make-model` (or uses
--model), runs bench/decode_bench on it (the engine through Engine::Run:
one prefill, then decode steps; each step timed from BeforeStep to
AfterStep, program building and sampling included; and OpenBLAS sgemv over
the same linears), then the same prompt through
`AutoModelForCausalLM.from_pretrained` with a KV cache (use_cache), in
float32 and in bfloat16, torch.set_num_threads(N), greedy, timing each
forward call. Prints the median decode step (min in parentheses) side by
side. Without torch/transformers installed (they are not part of CI) the
PyTorch columns read "n/a".

Figures only; nothing is asserted. The machine's load moves them: run it on
an idle machine and compare columns of one run, not runs.
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


def torch_decode(model_dir, dtype_name, threads, batch, prompt_len, steps, vocab):
    try:
        import torch
        import transformers
    except ImportError:
        return None
    torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    try:  # transformers >= 5.2x: no loading progress bars on stderr
        transformers.utils.logging.disable_progress_bar()
    except AttributeError:
        pass
    m = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    m.eval()
    ids = torch.tensor(prompt_ids(batch, prompt_len, vocab))
    times = []
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = m(input_ids=ids, use_cache=True)
        prefill = (time.perf_counter() - t0) * 1e3
        past = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(steps):
            t0 = time.perf_counter()
            out = m(input_ids=nxt, past_key_values=past, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            times.append((time.perf_counter() - t0) * 1e3)
            past = out.past_key_values
    return {"prefill_ms": prefill, "decode_ms_p50": statistics.median(times), "decode_ms_min": min(times)}


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
    a = ap.parse_args()
    cli = os.path.join(a.build, "tools", "crashreplay")
    bench = os.path.join(a.build, "bench", "decode_bench")
    for p in (cli, bench):
        if not os.path.exists(p):
            sys.exit(f"{p} not found: build first (bash scripts/build.sh)")

    with tempfile.TemporaryDirectory() as tmp:
        model = a.model
        if model is None:
            model = os.path.join(tmp, "model")
            sh(cli, "make-model", model, "--arch", "llama", "--quant", "bf16", "--layers", str(a.layers),
               "--hidden", str(a.hidden), "--heads", str(a.heads), "--kv-heads", str(a.kv_heads),
               "--head-dim", str(a.head_dim), "--intermediate", str(a.intermediate), "--vocab", str(a.vocab))
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
        vocab = cfg["vocab_size"]
        print(f"model: {cfg.get('model_type')} {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
              f"intermediate {cfg['intermediate_size']}, vocab {vocab}; batch {a.batch}, prompt {a.prompt_len}, "
              f"{a.steps} decode steps; load average {os.getloadavg()[0]:.2f}")
        have_torch = True
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError:
            have_torch = False
            print("torch/transformers not installed: the PyTorch columns are n/a (pip install torch transformers)")

        def cell(r, key="decode_ms_p50", lo="decode_ms_min"):
            if r is None:
                return f"{'n/a':>18}"
            s = f"{r[key]:.2f}"
            if lo and r.get(lo) is not None:
                s += f" ({r[lo]:.2f})"
            return f"{s:>18}"

        print()
        print("decode step, ms: median (min)")
        print(f"{'threads':>7} {'crashreplay':>18} {'OpenBLAS sgemv':>18} {'torch fp32':>18} {'torch bf16':>18}"
              f"   prefill ms: crashreplay / torch fp32 / torch bf16")
        for t in [int(x) for x in a.threads.split(",")]:
            ours = json.loads(sh(bench, model, "--threads", str(t), "--batch", str(a.batch), "--prompt-len",
                                 str(a.prompt_len), "--steps", str(a.steps), "--json"))
            blas = None
            if ours.get("openblas_sgemv_ms_p50") is not None:
                blas = {"decode_ms_p50": ours["openblas_sgemv_ms_p50"]}
            f32 = bf16 = None
            if have_torch:
                f32 = torch_decode(model, "float32", t, a.batch, a.prompt_len, a.steps, vocab)
                bf16 = torch_decode(model, "bfloat16", t, a.batch, a.prompt_len, a.steps, vocab)

            def pf(r):
                return "n/a" if r is None else f"{r['prefill_ms']:.0f}"

            print(f"{t:>7} {cell(ours)} {cell(blas, lo=None)} {cell(f32)} {cell(bf16)}"
                  f"   {pf(ours)} / {pf(f32)} / {pf(bf16)}")
        print()
        print("crashreplay: Engine::Run, every kernel checked and digested, fixed summation order (same bits at any")
        print("thread count). OpenBLAS sgemv: the step's projections and LM head alone, on float32")
        print("copies of the weights. torch: HF eager forward with a KV cache.")


if __name__ == "__main__":
    main()
