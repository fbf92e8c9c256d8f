// GPU benchmark: (1) decode GEMV/GEMM throughput of the CUDA LinearOp for
// bf16, FP8-block, NVFP4 and MXFP4 weights, as a fraction of the device's
// memory bandwidth (the reference: a device-to-device cudaMemcpy of the same
// size, and the theoretical peak where the driver reports it); (2) one-step
// replay time, async vs kernel-by-kernel, on a random checkpoint; (3) the
// engine fingerprints' cost at GLM-5 decode shapes (FingerprintCost).
// Prints one line per figure; exits 0 with a note when there is no device.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "crashreplay/capture/device_fingerprints.h"
#include "crashreplay/formats/numeric.h"
#include "crashreplay/replay/cuda/cuda_executor.h"
#include "crashreplay/replay/make_model/random_checkpoint.h"
#include "crashreplay/replay/program/step.h"
#include "crashreplay/replay/session/engine.h"

namespace cr = crashreplay::replay;

namespace {

struct Weights {
  std::vector<uint8_t> data, scales;
  cr::QWeight w;
};

// A [rows, cols] weight of the given kind with deterministic contents.
Weights MakeWeights(const std::string& kind, int64_t rows, int64_t cols) {
  Weights m;
  m.w.rows = rows;
  m.w.cols = cols;
  uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint8_t>(state >> 56);
  };
  if (kind == "bf16") {
    m.w.format = cr::WFormat::kBF16;
    m.data.resize(rows * cols * 2);
    for (size_t i = 0; i < m.data.size(); i += 2) {
      const uint16_t b = crashreplay::FloatToBf16((static_cast<float>(next()) - 128.0f) / 1024.0f);
      m.data[i] = static_cast<uint8_t>(b);
      m.data[i + 1] = static_cast<uint8_t>(b >> 8);
    }
    return m;
  }
  if (kind == "fp8") {
    m.w.format = cr::WFormat::kE4m3;
    m.w.scale_format = cr::SFormat::kF32;
    m.w.block_rows = m.w.block_cols = 128;
    m.data.resize(rows * cols);
    for (auto& b : m.data) b = next() & 0x7e;  // finite e4m3
  } else {
    m.w.format = cr::WFormat::kE2m1;
    m.w.scale_format = kind == "nvfp4" ? cr::SFormat::kE4m3 : cr::SFormat::kE8m0;
    m.w.block_rows = 1;
    m.w.block_cols = kind == "nvfp4" ? 16 : 32;
    m.data.resize(rows * cols / 2);
    for (auto& b : m.data) b = next();
  }
  m.w.scale_cols = (cols + m.w.block_cols - 1) / m.w.block_cols;
  const int64_t srows = (rows + m.w.block_rows - 1) / m.w.block_rows;
  if (m.w.scale_format == cr::SFormat::kF32) {
    m.scales.resize(srows * m.w.scale_cols * 4);
    std::vector<float> s(srows * m.w.scale_cols, 1.0f / 448.0f);
    std::memcpy(m.scales.data(), s.data(), m.scales.size());
  } else {
    m.scales.assign(srows * m.w.scale_cols, kind == "nvfp4" ? 0x38 : 127);  // 1.0 in e4m3 / e8m0
  }
  return m;
}

double Peak(int device) {
  int clock_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess || clock_khz == 0) {
    cudaGetLastError();
    return 0;
  }
  return 2.0 * clock_khz * 1e3 * bus_bits / 8.0;  // DDR: two transfers per clock
}

double MemcpyBandwidth(size_t bytes) {
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e0);
  for (int i = 0; i < 10; ++i) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes * 10 / (ms / 1e3);  // read + write
}

// (3) Engine fingerprints at GLM-5 decode shapes: per decode step, the
// embedding, 78 layers x (attention, o_proj, topk, experts, mlp, layer) and
// final_norm as [tokens, 6144] bf16 (topk [tokens, 8] int32), and fp32
// logits [tokens, 154880 / 8] (one rank's vocabulary shard at tp 8): 472
// summary kernels captured in one CUDA graph, as an engine would. Prints
// the graph's time per step and per boundary, and its share of a 40 ms
// decode step (the GLM-5 decode step at batch 64; a real step of a
// longer batch takes longer).
int FingerprintCost() {
  namespace cap = crashreplay::capture;
  for (const int64_t tokens : {int64_t{1}, int64_t{64}, int64_t{256}}) {
    const int64_t hidden = 6144, topk = 8, vocab_shard = 154880 / 8;
    void *act = nullptr, *ids = nullptr, *logits = nullptr;
    if (cudaMalloc(&act, tokens * hidden * 2) != cudaSuccess || cudaMalloc(&ids, tokens * topk * 4) != cudaSuccess ||
        cudaMalloc(&logits, tokens * vocab_shard * 4) != cudaSuccess) {
      return 1;
    }
    cudaMemset(act, 0x3c, tokens * hidden * 2);
    cudaMemset(ids, 0, tokens * topk * 4);
    cudaMemset(logits, 0x3c, tokens * vocab_shard * 4);
    auto table = cap::DeviceFingerprints::Create(512);
    if (!table.ok()) {
      std::printf("fingerprints: %s\n", std::string(table.status().message()).c_str());
      return 1;
    }
    const int64_t act_shape[] = {tokens, hidden}, ids_shape[] = {tokens, topk}, logit_shape[] = {tokens, vocab_shard};
    std::vector<std::string> names;
    names.push_back("embedding");
    for (int l = 0; l < 78; ++l) {
      for (const char* b : {"attention", "o_proj", "topk", "experts", "mlp", "layer"}) {
        names.push_back("L" + std::to_string(l) + "." + b);
      }
    }
    names.push_back("final_norm");
    names.push_back("lm_head");
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    bool ok = (*table)->BeginStep(0, stream).ok();
    for (const std::string& n : names) {
      const bool is_topk = n.size() > 5 && n.compare(n.size() - 5, 5, ".topk") == 0;
      cap::TensorView v = n == "lm_head" ? cap::TensorView{n, crashreplay::DType::kF32, logit_shape, logits,
                                                           static_cast<uint64_t>(tokens * vocab_shard * 4)}
                          : is_topk      ? cap::TensorView{n, crashreplay::DType::kI32, ids_shape, ids,
                                                      static_cast<uint64_t>(tokens * topk * 4)}
                                         : cap::TensorView{n, crashreplay::DType::kBF16, act_shape, act,
                                                      static_cast<uint64_t>(tokens * hidden * 2)};
      ok = ok && (*table)->Enqueue(v, stream).ok();
    }
    if (!ok || cudaStreamEndCapture(stream, &graph) != cudaSuccess ||
        cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
      std::printf("fingerprints: capture failed\n");
      return 1;
    }
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int i = 0; i < 3; ++i) cudaGraphLaunch(exec, stream);  // warm up
    const int reps = 20;
    cudaEventRecord(e0, stream);
    for (int i = 0; i < reps; ++i) {
      (*table)->NoteGraphStep(static_cast<uint64_t>(i));
      cudaGraphLaunch(exec, stream);
    }
    cudaEventRecord(e1, stream);
    if (cudaEventSynchronize(e1) != cudaSuccess) return 1;
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    const double per_step_us = ms * 1e3 / reps;
    const size_t collected = (*table)->Collect(true).fingerprints.size();
    std::printf(
        "fingerprints (GLM-5 decode, %3lld tokens, %zu boundaries in a CUDA graph, %zu collected) "
        "%8.1f us a step, %5.2f us a boundary, %5.2f%% of a 40 ms step\n",
        static_cast<long long>(tokens), names.size(), collected, per_step_us, per_step_us / names.size(),
        per_step_us / 400.0);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    cudaFree(act);
    cudaFree(ids);
    cudaFree(logits);
  }
  return 0;
}

}  // namespace

int main() {
  // One line per figure as it is measured (stdout is a file or pipe on a
  // device machine: a run cut off by its time limit keeps what it printed).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  auto count = cr::cuda::DeviceCount();
  if (!count.ok()) {
    std::printf("gpu_bench: skipped: %s\n", std::string(count.status().message()).c_str());
    return 0;
  }
  auto info = cr::cuda::QueryDevice(0);
  auto exec = cr::cuda::CudaExecutor::Create(cr::ExecMode::kAsync, 0);
  if (!info.ok() || !exec.ok()) return 1;
  const double peak = Peak(0);
  std::printf("device: %s sm_%d%d, %.1f GB, peak bandwidth %.0f GB/s%s\n", info->name.c_str(), info->sm_major,
              info->sm_minor, info->total_bytes / 1e9, peak / 1e9, peak > 0 ? "" : " (not reported)");
  if (FingerprintCost() != 0) return 1;
  const int64_t rows = 8192, cols = 8192;
  for (const std::string kind : {"bf16", "fp8", "nvfp4", "mxfp4"}) {
    Weights wt = MakeWeights(kind, rows, cols);
    cr::ExecMemory mem(exec->get());
    auto d = mem.Copy(wt.data);
    cr::LinearShardView view{wt.w, nullptr};
    view.w.data = *d;
    if (!wt.scales.empty()) view.w.scales = *mem.Copy(wt.scales);
    auto shards = mem.Copy(std::vector<cr::LinearShardView>{view});
    const size_t wbytes = wt.data.size() + wt.scales.size();
    const double ref = MemcpyBandwidth(wbytes);
    // The same weights read as a w4a4 layer: NVFP4 activations.
    cr::LinearShardView qview = view;
    qview.w.act_fp4 = true;
    qview.w.act_scale = 1.0f;
    auto qshards = mem.Copy(std::vector<cr::LinearShardView>{qview});
    // Times `op`: a warm-up launch, timed, sets the repetitions (about 0.2 s).
    auto time_op = [&](const cr::LinearOp& op) -> double {
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      cudaEventRecord(e0, (*exec)->stream());
      (void)(*exec)->Launch(op, cr::LaunchTag{"bench", -1});
      cudaEventRecord(e1, (*exec)->stream());
      if (!(*exec)->Synchronize().ok()) return -1;
      float first_ms = 0;
      cudaEventElapsedTime(&first_ms, e0, e1);
      const int iters = std::max(1, std::min(10, static_cast<int>(200.0f / std::max(first_ms, 1e-3f))));
      cudaEventRecord(e0, (*exec)->stream());
      for (int i = 0; i < iters; ++i) (void)(*exec)->Launch(op, cr::LaunchTag{"bench", -1});
      cudaEventRecord(e1, (*exec)->stream());
      if (!(*exec)->Synchronize().ok()) return -1;
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      return ms / 1e3 / iters;
    };
    for (int64_t tokens : {1, 8, 32}) {
      std::vector<float> x(tokens * cols, 0.01f);
      auto xd = mem.Copy(x);
      auto yd = mem.Alloc(tokens * rows * 4);
      // Quantized rows for w4a4: e2m1 codes 0x2 (1.0) with e4m3 scales 1.0.
      std::vector<uint8_t> xq(tokens * cr::Nvfp4ActValueBytes(cols), 0x22);
      std::vector<uint8_t> xqs(tokens * cr::Nvfp4ActScaleBytes(cols), 0x38);
      auto xqd = mem.Copy(xq);
      auto xqsd = mem.Copy(xqs);
      for (int variant = 0; variant < (kind == "nvfp4" ? 3 : 2); ++variant) {
        const cr::DotKind dot = variant == 0 ? cr::DotKind::kDequant : cr::DotKind::kFused;
        cr::LinearOp op;
        op.shards = variant == 2 ? *qshards : *shards;
        op.weight_format = wt.w.format;
        op.dot = dot;
        op.x = *xd;
        if (variant == 2) {
          op.xq = *xqd;
          op.xq_scales = *xqsd;
        }
        op.y = static_cast<float*>(*yd);
        op.ranks = 1;
        op.tokens = tokens;
        op.rows = rows;
        op.cols = cols;
        const double s = time_op(op);
        if (s < 0) return 1;
        const double bytes = static_cast<double>(wbytes) + tokens * (cols + rows) * 4.0;
        std::printf(
            "linear %-5s %-7s tokens %2lld: %8.1f us  %7.1f GB/s  %5.1f%% of memcpy (%.0f GB/s)  %5.1f%% of peak\n",
            kind.c_str(),
            variant == 0   ? "dequant"
            : variant == 1 ? "fused"
                           : "w4a4",
            static_cast<long long>(tokens), s * 1e6, bytes / s / 1e9, 100.0 * bytes / s / ref, ref / 1e9,
            peak > 0 ? 100.0 * bytes / s / peak : 0.0);
      }
    }
  }
  // One decode step of a random checkpoint, async vs kernel by kernel.
  cr::MakeModelOptions o;
  o.arch = "qwen3_moe";
  o.quant = "nvfp4";
  o.layers = 8;
  o.hidden = 1024;
  o.heads = 16;
  o.kv_heads = 4;
  o.head_dim = 64;
  o.intermediate = 2048;
  o.moe_intermediate = 256;
  o.experts = 32;
  o.experts_per_tok = 4;
  o.vocab = 8192;
  auto ckpt = cr::GenerateRandomCheckpoint(o);
  if (!ckpt.ok()) return 1;
  const cr::EngineConfig ec = cr::ResolveConfig(cr::Config::Defaults());
  auto model = cr::BuildModel(ckpt->spec, ckpt->tensors, ec);
  if (!model.ok()) return 1;
  cr::StepInput in;
  in.mode = cr::ForwardMode::kDecode;
  for (int r = 0; r < 32; ++r) {
    cr::StepRow row;
    row.request_id = r;
    row.tokens = {r + 1};
    row.start_pos = 255;
    for (int p = 0; p < 256 / 16; ++p) row.page_table.push_back(r * 16 + p);
    in.rows.push_back(row);
  }
  for (cr::ExecMode mode : {cr::ExecMode::kAsync, cr::ExecMode::kKernelByKernel}) {
    auto ex = cr::cuda::CudaExecutor::Create(mode, 0);
    if (!ex.ok()) return 1;
    auto dm = cr::DeviceModel::Upload(**model, ex->get());
    auto kv = cr::KvCache::Create(**model, ec, 32 * 16, ex->get());
    if (!dm.ok() || !kv.ok()) return 1;
    double best = 1e30;
    size_t kernels = 0;
    for (int i = 0; i < 5; ++i) {
      auto step = cr::StepProgram::Lower(**dm, ec, kv->get(), in);
      if (step->fault()) return 1;
      step->set_watch(false);
      kernels = step->kernels().size();
      const auto t0 = std::chrono::steady_clock::now();
      if (step->RunAll()) return 1;
      const auto t1 = std::chrono::steady_clock::now();
      best = std::min(best, std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::printf("decode step (qwen3_moe nvfp4, 8 layers, 32 rows x 256 positions, %zu kernels) %-16s %8.2f ms\n",
                kernels, cr::ExecModeName(mode), best);
    if (mode != cr::ExecMode::kKernelByKernel) continue;
    // Where the step's time goes: each kernel runs to completion before the
    // next, so its record's time is its own (plus one synchronize).
    auto step = cr::StepProgram::Lower(**dm, ec, kv->get(), in);
    if (step->fault()) return 1;
    step->set_watch(false);
    if (step->RunAll()) return 1;
    std::map<std::string, std::pair<double, int>> by_name;
    for (const cr::KernelRecord& r : step->records()) {
      by_name[r.name].first += r.micros;
      by_name[r.name].second += 1;
    }
    std::vector<std::pair<double, std::string>> order;
    for (const auto& [name, t] : by_name) order.emplace_back(t.first, name);
    std::sort(order.rbegin(), order.rend());
    for (const auto& [us, name] : order) {
      std::printf("  %-22s %3d launches %9.2f ms\n", name.c_str(), by_name[name].second, us / 1e3);
    }
  }
  return 0;
}
