"""Cost of engine fingerprints on the CPU, beside the step they watch.

A transformers llama (--shape small: hidden 1024, 8 layers; --shape 1b:
Llama 3.2 1B's dimensions; float32 and bfloat16, random weights) decodes
with and without crashreplay.transformers' fingerprint hooks; prints the
decode step time of each, the difference per step, the time measured inside
the fingerprint code in a decode step (the step's one summarising call and
the hooks' slow path; a wrapped forward's own noting is one closure call,
counted only in the end-to-end difference), per boundary, and its share of
the step; the end-to-end
difference is each round's (on minus off, back to back), median and range:
on a 2-core VM the range spans 1-3 ms, so read it beside the median. The prefill's
fingerprints cost in proportion to its tokens (every row is summarised). Needs torch and transformers (scripts/test-engines.sh's
venv):  ENGINES_VENV/bin/python bench/fingerprint_bench.py
Figures, not a test: timings are medians of repeated generate() calls."""
import statistics
import tempfile
import time

import torch
import transformers

import crashreplay.transformers as crt


# The watched model's shape: "small" (the default: hidden 1024, 8 layers,
# 0.1B parameters, where a boundary's fixed cost weighs most) and "1b"
# (Llama 3.2 1B's dimensions, random weights: what a CPU transformers user
# runs).
SHAPES = {
    "small": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=4, vocab_size=32000),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
}


def model(dtype, shape="small"):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(max_position_embeddings=1024, **SHAPES[shape])
    return transformers.LlamaForCausalLM(cfg).to(dtype).eval()


def decode_ms(m, new=16, reps=5):
    ids = torch.randint(3, 32000, (1, 32))
    times = []
    with torch.no_grad():
        for _ in range(reps):
            t0 = time.perf_counter()
            m.generate(input_ids=ids, do_sample=False, max_new_tokens=new, min_new_tokens=new)
            times.append((time.perf_counter() - t0) * 1e3 / new)
    return statistics.median(times)


class Timed:
    """Wraps methods of the recorder's hooks, adding up the time spent inside them in decode steps."""

    def __init__(self, rec, names):
        self.seconds, self.steps = 0.0, set()
        for name in names:
            self._wrap(rec, name)

    def _wrap(self, rec, name):
        inner = getattr(rec.hooks, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                if rec.mode == "decode":
                    self.seconds += time.perf_counter() - t0
                    self.steps.add(rec.step)
        setattr(rec.hooks, name, timed)


def main(rounds=7, new=16, shape="small", dtypes=("float32", "bfloat16")):
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, 1 thread, shape {shape}"
          f" ({SHAPES[shape]}); ms per generated token,")
    print(f"medians of {rounds} rounds (plain, recorder, recorder + fingerprints in turn, rotated); 'in hooks': time measured in the step's summarising call (and in the hooks' slow path; the wrappers' noting is in 'diff' only) a decode step")
    print(f"{'dtype':<10}{'plain':>9}{'steps':>9}{'+fps':>9}{'diff':>9}{'diff range':>16}{'e2e share':>10}"
          f"{'in hooks':>10}{'bounds':>8}{'us/bound':>10}{'share':>8}")
    for dtype in (getattr(torch, d) for d in dtypes):
        m = model(dtype, shape)
        decode_ms(m, reps=1)  # warm up
        plain, steps, fps, inside = [], [], [], []

        def run_plain():
            plain.append(decode_ms(m, new=new))

        def run_steps():
            with tempfile.TemporaryDirectory() as d:
                with crt.record(m, d, install_signal_handlers=False, fingerprints=False):
                    steps.append(decode_ms(m, new=new))

        def run_fps():
            with tempfile.TemporaryDirectory() as d:
                with crt.record(m, d, install_signal_handlers=False) as rec:
                    # What the hooks do: note each output, and summarise the
                    # step in one call at lm_head (flush).
                    hooks = Timed(rec, ("_note", "flush"))
                    fps.append(decode_ms(m, new=new))
                    inside.append(hooks.seconds * 1e3 / len(hooks.steps))

        # The three in turn, the order rotated each round, so that whatever
        # drifts within a round weighs on each alike.
        order = [run_plain, run_steps, run_fps]
        for r in range(rounds):
            for run in order[r % 3:] + order[:r % 3]:
                run()
        p, s_, f, i = (statistics.median(x) for x in (plain, steps, fps, inside))
        # Each round's difference, fingerprints on minus off, measured back to back.
        diffs = [b - a for a, b in zip(steps, fps)]
        d = statistics.median(diffs)
        n = 3 + 5 * m.config.num_hidden_layers  # embedding, 5 a layer, final_norm, lm_head
        print(f"{str(dtype).replace('torch.', ''):<10}{p:>9.2f}{s_:>9.2f}{f:>9.2f}{d:>+9.2f}"
              f"{f'[{min(diffs):+.2f}, {max(diffs):+.2f}]':>16}{d / s_:>10.1%}{i:>10.3f}{n:>8}"
              f"{i * 1e3 / n:>10.1f}{i / p:>8.1%}")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--new", type=int, default=16, help="tokens generated per timed generate()")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated torch dtypes")
    o = ap.parse_args()
    main(o.rounds, o.new, o.shape, tuple(o.dtypes.split(",")))
