"""Cost of engine fingerprints on the CPU, beside the step they watch.

A transformers llama (hidden 1024, 8 layers, float32 and bfloat16) decodes
with and without crashreplay.transformers' fingerprint hooks; prints the
decode step time of each, the difference per step and per boundary, and its
share of the step. Needs torch and transformers (scripts/test-engines.sh's
venv):  ENGINES_VENV/bin/python bench/fingerprint_bench.py
Figures, not a test: timings are medians of repeated generate() calls."""
import statistics
import tempfile
import time

import torch
import transformers

import crashreplay.transformers as crt


def model(dtype):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                   num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                                   max_position_embeddings=1024)
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


def main():
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, 1 thread; ms per generated token")
    print(f"{'dtype':<10}{'plain':>10}{'recorded':>10}{'+fp/step':>10}{'boundaries':>11}{'us/boundary':>12}{'share':>8}")
    for dtype in (torch.float32, torch.bfloat16):
        m = model(dtype)
        decode_ms(m, reps=1)  # warm up
        plain = decode_ms(m)
        with tempfile.TemporaryDirectory() as d:
            with crt.record(m, d, install_signal_handlers=False, fingerprints=False) as rec_off:
                steps_only = decode_ms(m)
        with tempfile.TemporaryDirectory() as d:
            with crt.record(m, d, install_signal_handlers=False) as rec:
                recorded = decode_ms(m)
        n = 3 + 5 * m.config.num_hidden_layers  # embedding, 5 a layer, final_norm, lm_head
        extra = recorded - steps_only
        print(f"{str(dtype).replace('torch.', ''):<10}{plain:>10.2f}{recorded:>10.2f}{extra:>10.3f}{n:>11}"
              f"{extra * 1e3 / n:>12.1f}{extra / plain:>8.1%}")
        print(f"{'':<10}(step log alone: {steps_only:.2f} ms, {steps_only - plain:+.3f} ms a step)")


if __name__ == "__main__":
    main()
