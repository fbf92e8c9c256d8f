// recorder_bench: the recorder's cost on the serving thread and its
// background throughput, next to the reference tools.
//
//   recorder_bench [--steps N] [--quick]
//
// 1. Step log of a 256-request decode batch: RecordStep() per-call time on
//    the calling thread (mean, p50, p99) and the writer thread's sustained
//    rate (steps/s, MB/s of file), with and without page-table rows.
// 2. Snapshots of 1, 16 and 256 MiB of bf16-like data: SubmitSnapshot()
//    per-call time next to a plain memcpy of the same bytes, and the encoder
//    thread's throughput (hash + shuffle + zstd -1) next to the `zstd -1`
//    CLI on the same bytes (process start included; it is noise at these
//    sizes).
// Figures only; nothing here is asserted.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "crashreplay/capture/recorder.h"

namespace {

using namespace crashreplay;
using Clock = std::chrono::steady_clock;

double Ns(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::nano>(b - a).count(); }

struct Batch {
  std::vector<std::string> id_storage;
  std::vector<std::string_view> ids;
  std::vector<int64_t> tokens, positions, seq_lens, pool, out_loc, outputs, offsets, slots;
  std::vector<SamplingParams> sampling;
  Batch(size_t n, size_t slots_per_row) {
    for (size_t i = 0; i < n; ++i) id_storage.push_back("chatcmpl-" + std::to_string(1000000 + i));
    for (auto& s : id_storage) ids.push_back(s);
    for (size_t i = 0; i < n; ++i) {
      tokens.push_back(static_cast<int64_t>(i * 13 % 151000));
      positions.push_back(static_cast<int64_t>(500 + i));
      seq_lens.push_back(static_cast<int64_t>(501 + i));
      pool.push_back(static_cast<int64_t>(i));
      out_loc.push_back(static_cast<int64_t>(i * 2048 + 501));
      outputs.push_back(static_cast<int64_t>(i * 7 % 151000));
      SamplingParams p;
      p.temperature = 0.6f;
      p.top_p = 0.95f;
      p.top_k = 20;
      sampling.push_back(p);
    }
    if (slots_per_row > 0) {
      offsets.push_back(0);
      for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < slots_per_row; ++j) slots.push_back(static_cast<int64_t>(i * 2048 + j));
        offsets.push_back(static_cast<int64_t>(slots.size()));
      }
    }
  }
  capture::StepView View(uint64_t step) const {
    capture::StepView v;
    v.step = step;
    v.mode = ForwardMode::kDecode;
    v.request_ids = ids;
    v.token_ids = tokens;
    v.positions = positions;
    v.seq_lens = seq_lens;
    v.req_pool_indices = pool;
    v.page_table_offsets = offsets;
    v.page_table_slots = slots;
    v.out_cache_loc = out_loc;
    v.sampling = sampling;
    v.rng_seed = 42;
    v.rng_offset = step * 4;
    v.output_token_ids = outputs;
    return v;
  }
};

SessionManifest Manifest() {
  SessionManifest m;
  m.engine = "recorder_bench";
  return m;
}

std::string TempDir() {
  std::string t = (std::filesystem::temp_directory_path() / "recbench-XXXXXX").string();
  return ::mkdtemp(t.data());
}

// Steps are paced (one every `pace_us`, faster than any real decode loop)
// so that the figure is the calling thread's own cost, not back-pressure
// from a writer a whole queue behind.
void StepLog(const char* label, size_t slots_per_row, int steps, int pace_us) {
  const std::string dir = TempDir();
  capture::RecorderOptions o;
  o.session_dir = dir;
  o.snapshot_ring_bytes = 1 << 20;
  o.install_signal_handlers = false;
  o.step_queue_slots = 4096;
  auto rec = capture::Recorder::Begin(Manifest(), o);
  if (!rec.ok()) {
    std::fprintf(stderr, "%s\n", rec.status().ToString().c_str());
    std::exit(1);
  }
  Batch b(256, slots_per_row);
  std::vector<double> t(static_cast<size_t>(steps));
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) {
    const capture::StepView v = b.View(static_cast<uint64_t>(i));
    const auto a = Clock::now();
    absl::Status s = (*rec)->RecordStep(v);
    t[i] = Ns(a, Clock::now());
    if (pace_us > 0) usleep(static_cast<useconds_t>(pace_us));  // frees the core for the writer
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      std::exit(1);
    }
  }
  (void)(*rec)->Flush();
  const double total_s = Ns(start, Clock::now()) * 1e-9;
  const uint64_t bytes = (*rec)->stats().file_bytes;
  (void)(*rec)->Close();
  std::sort(t.begin(), t.end());
  double sum = 0;
  for (double x : t) sum += x;
  std::printf("%-34s RecordStep min %6.2f us  p50 %7.2f us  mean %7.2f us  p99 %7.2f us | writer %8.0f steps/s %7.1f MB/s (%.0f B/step)\n",
              label, t[0] / 1e3, t[t.size() / 2] / 1e3, sum / steps / 1e3, t[t.size() * 99 / 100] / 1e3, steps / total_s,
              bytes / total_s / 1e6, static_cast<double>(bytes) / steps);
  std::filesystem::remove_all(dir);
}

std::vector<std::byte> Bf16Like(size_t bytes) {
  std::vector<std::byte> out(bytes);
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, 0.02f);
  for (size_t i = 0; i + 1 < bytes; i += 2) {
    const float f = d(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint16_t h = static_cast<uint16_t>(u >> 16);
    std::memcpy(&out[i], &h, 2);
  }
  return out;
}

double ZstdCliMBs(const std::vector<std::byte>& data) {
  const std::string path = (std::filesystem::temp_directory_path() / "recbench-zstd.bin").string();
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(data.data()), data.size());
  const auto a = Clock::now();
  const int rc = std::system(("zstd -1 -q -c " + path + " > /dev/null").c_str());
  const double s = Ns(a, Clock::now()) * 1e-9;
  std::filesystem::remove(path);
  return rc == 0 ? data.size() / s / 1e6 : 0.0;
}

void Snapshot(size_t mib, int reps) {
  const size_t bytes = mib << 20;
  const std::vector<std::byte> data = Bf16Like(bytes);
  std::vector<std::byte> dst(bytes);
  std::memcpy(dst.data(), data.data(), bytes);  // warm the destination
  double memcpy_ns = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto a = Clock::now();
    std::memcpy(dst.data(), data.data(), bytes);
    memcpy_ns = std::min(memcpy_ns, Ns(a, Clock::now()));
  }
  const std::string dir = TempDir();
  capture::RecorderOptions o;
  o.session_dir = dir;
  o.snapshot_ring_bytes = bytes + (1 << 20);
  o.install_signal_handlers = false;
  auto rec = capture::Recorder::Begin(Manifest(), o);
  if (!rec.ok()) std::exit(1);
  const int64_t shape[] = {static_cast<int64_t>(bytes / 2)};
  const capture::TensorView view{"hidden_states", DType::kBF16, shape, data.data(), bytes};
  double submit_ns = 1e30, encode_ns = 0, ratio = 0;
  for (int i = 0; i < reps; ++i) {
    const uint64_t before = (*rec)->stats().snapshots_encoded;
    const auto a = Clock::now();
    (void)(*rec)->SubmitSnapshot(static_cast<uint64_t>(i), {&view, 1});
    const auto b = Clock::now();
    submit_ns = std::min(submit_ns, Ns(a, b));
    while ((*rec)->stats().snapshots_encoded == before) usleep(100);
    encode_ns += Ns(b, Clock::now());
    if (i == 0) ratio = static_cast<double>(bytes) / std::max<uint64_t>(1, (*rec)->stats().ring_encoded_bytes);
  }
  (void)(*rec)->Close();
  std::filesystem::remove_all(dir);
  std::printf("snapshot %4zu MiB  SubmitSnapshot %9.1f us  memcpy %9.1f us | encoder %7.0f MB/s (ratio %.2f)  zstd -1 CLI %7.0f MB/s\n",
              mib, submit_ns / 1e3, memcpy_ns / 1e3, bytes * reps / encode_ns * 1e3, ratio, ZstdCliMBs(data));
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 4000;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
  }
  std::printf("recorder_bench: decode batch of 256 requests; figures are the calling thread unless marked\n");
  std::printf("(steps paced one per 500 us; writer figures: the whole run incl. pacing, and a burst below)\n");
  StepLog("step log (no page-table rows)", 0, steps, 500);
  StepLog("step log + 256 rows x 64 slots", 64, steps, 500);
  StepLog("burst, unpaced (writer bound)", 0, steps, 0);
  Snapshot(1, quick ? 3 : 10);
  Snapshot(16, quick ? 2 : 5);
  Snapshot(256, quick ? 1 : 2);
  return 0;
}
