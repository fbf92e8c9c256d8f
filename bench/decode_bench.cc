// decode_bench: the built-in engine's decode-step time on the CPU, with the
// least the step's weight reads could cost beside it.
//
//   decode_bench MODEL_DIR [--threads N] [--batch B] [--prompt-len P]
//                [--steps S] [--set k=v]... [--json]
//
// Runs B requests of P prompt tokens each through Engine::Run (one prefill
// step, then S decode steps of B rows) and times each step from BeforeStep
// to AfterStep: building the step's program, every kernel, sampling. Prints
// the prefill time and min / median / p90 of the decode steps.
//
// Reference: OpenBLAS (cblas) over every matrix a dense decode step
// multiplies by (the q/k/v/o, gate/up/down projections of each layer and the
// LM head), B vectors per step, same thread count (openblas_set_num_threads):
// sgemv over float32 copies (Debian's OpenBLAS 0.3.21 is built without the
// bf16 sbgemv, so the reference reads twice the bytes the engine does). That
// is the GEMV part of the step alone, with the machine's tuned BLAS kernel. The engine does not call OpenBLAS because
// its summation order is chosen at run time per CPU model (and thread split), so a capture's digests would not
// reproduce on another machine (docs/replay.md, "Performance"). MoE checkpoints: the reference counts every layer's
// experts, which a decode step does not read; it is printed for dense models only.
//
// bench/decode_vs_torch.py runs this beside PyTorch eager on the same
// checkpoint. Figures only; nothing here is asserted.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "crashreplay/formats/numeric.h"
#include "crashreplay/replay/config/toggles.h"
#include "crashreplay/replay/model/checkpoint_io.h"
#include "crashreplay/replay/session/engine.h"

extern "C" void openblas_set_num_threads(int);

namespace {

using namespace crashreplay;
using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

struct StepTimer : replay::StepObserver {
  Clock::time_point t0;
  replay::ForwardMode mode = replay::ForwardMode::kPrefill;
  std::vector<double> prefill_ms, decode_ms;
  void BeforeStep(const replay::StepInput& in) override {
    mode = in.mode;
    t0 = Clock::now();
  }
  void AfterStep(const replay::StepProgram&) override {
    const double ms = Ms(t0, Clock::now());
    (mode == replay::ForwardMode::kDecode ? decode_ms : prefill_ms).push_back(ms);
  }
};

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

// float32 copy of a bf16/fp32 matrix; empty for other dtypes.
std::vector<float> AsFloat(const replay::HostTensor& t) {
  const size_t n = t.bytes.size() * 8 / static_cast<size_t>(DTypeBits(t.dtype));
  std::vector<float> out(n);
  if (t.dtype == DType::kBF16) {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, t.bytes.data() + 2 * i, 2);
      out[i] = Bf16ToFloat(h);
    }
  } else if (t.dtype == DType::kF32) {
    std::memcpy(out.data(), t.bytes.data(), n * 4);
  } else {
    out.clear();
  }
  return out;
}

int Usage(const char* msg) {
  std::fprintf(stderr,
               "decode_bench: %s\nusage: decode_bench MODEL_DIR [--threads N] [--batch B] [--prompt-len P] "
               "[--steps S] [--set k=v]... [--json]\n",
               msg);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  int threads = 1;
  int64_t batch = 1, prompt_len = 128, steps = 32;
  std::vector<std::string> sets;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--json") {
      json = true;
    } else if (a == "--threads" || a == "--batch" || a == "--prompt-len" || a == "--steps" || a == "--set") {
      if ((v = next()) == nullptr) return Usage((a + " needs a value").c_str());
      if (a == "--set") {
        sets.push_back(v);
        continue;
      }
      char* end = nullptr;
      const long long n = std::strtoll(v, &end, 10);
      if (*end != '\0' || n < 1) return Usage((a + " '" + v + "': expected a positive integer").c_str());
      if (a == "--threads") threads = static_cast<int>(n);
      if (a == "--batch") batch = n;
      if (a == "--prompt-len") prompt_len = n;
      if (a == "--steps") steps = n;
    } else if (!a.empty() && a[0] == '-') {
      return Usage(("unknown option " + a).c_str());
    } else if (dir.empty()) {
      dir = a;
    } else {
      return Usage("one MODEL_DIR");
    }
  }
  if (dir.empty()) return Usage("give a MODEL_DIR");

  replay::Config config = replay::Config::Defaults();
  for (const std::string& s : sets) {
    if (absl::Status st = config.ApplySetFlag(s); !st.ok()) return Usage(std::string(st.message()).c_str());
  }
  auto ckpt = replay::LoadCheckpointDir(dir);
  if (!ckpt.ok()) {
    std::fprintf(stderr, "decode_bench: %s\n", std::string(ckpt.status().message()).c_str());
    return 3;
  }
  const replay::ModelSpec spec = ckpt->spec;
  std::vector<replay::Request> requests(static_cast<size_t>(batch));
  for (int64_t r = 0; r < batch; ++r) {
    auto& q = requests[static_cast<size_t>(r)];
    q.id = r;
    for (int64_t j = 0; j < prompt_len; ++j)
      q.prompt.push_back(static_cast<int32_t>((r * 131 + j * 17 + 1) % spec.vocab));
    q.max_new_tokens = steps + 1;  // the prefill samples the first token
  }

  // Reference matrices (dense models): every linear a decode step reads.
  struct Mat {
    std::vector<float> f32;
    int rows = 0, cols = 0;
  };
  std::vector<Mat> mats;
  if (spec.num_experts == 0) {
    for (const auto& [name, t] : ckpt->tensors) {
      const bool linear = name.find("_proj.weight") != std::string::npos || name == "lm_head.weight" ||
                          (spec.tie_embeddings && name == "model.embed_tokens.weight");
      if (!linear || t.shape.size() != 2) continue;
      std::vector<float> f = AsFloat(t);
      if (f.empty()) {
        mats.clear();
        break;  // quantized: no float reference
      }
      Mat m;
      m.rows = static_cast<int>(t.shape[0]);
      m.cols = static_cast<int>(t.shape[1]);
      m.f32 = std::move(f);
      mats.push_back(std::move(m));
    }
  }

  const replay::EngineConfig ec = replay::ResolveConfig(config);
  auto model = replay::BuildModel(ckpt->spec, ckpt->tensors, ec);
  if (!model.ok()) {
    std::fprintf(stderr, "decode_bench: %s\n", std::string(model.status().message()).c_str());
    return 3;
  }
  ckpt->tensors.clear();
  auto made = replay::Engine::Create(std::move(*model), ec, threads, replay::PagesNeeded(requests, ec.page_size));
  if (!made.ok()) {
    std::fprintf(stderr, "decode_bench: %s\n", std::string(made.status().message()).c_str());
    return 1;
  }
  replay::Engine& engine = **made;
  StepTimer timer;
  const replay::RunResult r = engine.Run(requests, &timer);
  if (r.fault) {
    std::fprintf(stderr, "decode_bench: the run failed: %s\n", r.fault->message.c_str());
    return 1;
  }

  // OpenBLAS sgemv over float32 copies of the same matrices, `batch`
  // vectors per step.
  std::vector<double> sgemv_ms;
  if (!mats.empty()) {
    openblas_set_num_threads(threads);
    int max_in = 0, max_out = 0;
    for (const Mat& m : mats) {
      max_out = std::max(max_out, m.rows);
      max_in = std::max(max_in, m.cols);
    }
    std::vector<float> x(static_cast<size_t>(max_in)), y(static_cast<size_t>(max_out));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
    for (int64_t s = 0; s < steps + 2; ++s) {
      const auto t0 = Clock::now();
      for (int64_t b = 0; b < batch; ++b) {
        for (const Mat& m : mats) {
          cblas_sgemv(CblasRowMajor, CblasNoTrans, m.rows, m.cols, 1.0f, m.f32.data(), m.cols, x.data(), 1, 0.0f,
                      y.data(), 1);
        }
      }
      if (s >= 2) sgemv_ms.push_back(Ms(t0, Clock::now()));  // two warm-up steps
    }
  }

  const double prefill = timer.prefill_ms.empty() ? 0 : timer.prefill_ms.front();
  const double d50 = Quantile(timer.decode_ms, 0.5);
  if (json) {
    std::printf(
        "{\"model\":\"%s\",\"threads\":%d,\"batch\":%lld,\"prompt_len\":%lld,\"decode_steps\":%zu,"
        "\"prefill_ms\":%.3f,\"decode_ms_min\":%.3f,\"decode_ms_p50\":%.3f,\"decode_ms_p90\":%.3f,"
        "\"openblas_sgemv_ms_p50\":%s}\n",
        spec.model_type.c_str(), threads, static_cast<long long>(batch), static_cast<long long>(prompt_len),
        timer.decode_ms.size(), prefill, Quantile(timer.decode_ms, 0), d50, Quantile(timer.decode_ms, 0.9),
        sgemv_ms.empty() ? "null" : std::to_string(Quantile(sgemv_ms, 0.5)).c_str());
    return 0;
  }
  std::printf("decode_bench: %s, %lld layers, hidden %lld, vocab %lld; %d thread(s), batch %lld, prompt %lld\n",
              spec.model_type.c_str(), static_cast<long long>(spec.layers), static_cast<long long>(spec.hidden),
              static_cast<long long>(spec.vocab), threads, static_cast<long long>(batch),
              static_cast<long long>(prompt_len));
  std::printf("  prefill step                      %9.2f ms  (%lld tokens)\n", prefill,
              static_cast<long long>(batch * prompt_len));
  std::printf("  decode step  min / p50 / p90      %9.2f / %.2f / %.2f ms  (%zu steps, %.1f tokens/s)\n",
              Quantile(timer.decode_ms, 0), d50, Quantile(timer.decode_ms, 0.9), timer.decode_ms.size(),
              d50 > 0 ? 1000.0 * static_cast<double>(batch) / d50 : 0.0);
  if (!sgemv_ms.empty()) {
    std::printf("  OpenBLAS sgemv, same linears      %9.2f ms p50  (reference: the step's GEMVs only, fp32 copies)\n",
                Quantile(sgemv_ms, 0.5));
  }
  return 0;
}
