// recorder_bench: the recorder's cost on the serving thread and its
// background throughput, next to the reference a plain copy would cost.
//
//   recorder_bench [--runs R] [--steps N] [--quick] [--no-snapshots] [--no-steps] [--no-context]
//                  [--only-context]
//
// 1. Step log of a 256-request decode batch (with and without page-table
//    rows). RecordStep() on the calling thread, R runs of N steps each after
//    a warm-up of 512 steps, under three pacings between steps:
//      busy   500 us of work that reads and writes a 4 MiB working set (a
//             serving thread is busy between steps: scheduling, launching
//             kernels; this also evicts the step's data from L1/L2);
//      sleep  usleep(500) (the core may run something else meanwhile);
//      none   back to back (the writer is then the bound: back-pressure).
//    Each RecordStep figure is printed beside the reference: a plain memcpy
//    of the same spans into one flat, pre-faulted buffer under the same
//    pacing (the least any copy of the step can cost), and beside the same
//    memcpy handed to a reader thread (HandoffCopy: the least a copy costs
//    whose bytes another core then reads, as the writer reads a step). Per run: min, p50,
//    p99 per call and minor page faults per step on the calling thread.
//    File bytes per step. The writer's sustained rate (back-to-back run,
//    until Flush) in MB/s of step records (each encoded whole and
//    uncompressed: the bytes the writer compresses) and its ratio (those
//    bytes over the file's), beside the `zstd -1` CLI's rate and ratio on a
//    file of those same records uncompressed, and memcpy. Twice: the
//    constant batch (only step, RNG offset and timestamp change) and an
//    evolving one (Batch::Evolve: tokens, positions, lengths, cache slots
//    and outputs change every step, as in a real decode).
// 2. Snapshots of 1, 16 and 256 MiB of bf16-like data: SubmitSnapshot()
//    per call (min and p50 over reps) beside memcpy of the same bytes under
//    the same conditions (interleaved: a reused buffer that another thread
//    reads after each copy, as the encoder reads the ring, then the same
//    wait), into a reused buffer in this core's cache (best case), and into
//    a fresh mapping (page faults included),
//    the encoder thread's throughput as the recorder sees it (submit to
//    encoded, its idle polling included), and the encoder's work alone
//    (FrameEncoder::EncodeBlob on this thread: XXH3-128 + byte planes +
//    zstd; into the buffer of the blob encoded before it, as the ring
//    reuses an evicted snapshot's, and into fresh memory, as the ring's
//    first snapshots) beside in-process ZSTD_compress level 1 (best of reps
//    each, alternating), with the ratio of the two speeds and of the two
//    compression ratios, and the `zstd -1` CLI (process start and file
//    read included) on the same bytes.
// 3. Page-table rows at 512, 4k and 16k slots a request (ContextSweep).
// The machine's load average is printed first: on a shared machine the
// figures move with it. Figures only; nothing here is asserted.
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "crashreplay/capture/recorder.h"
#include "crashreplay/formats/capture_encoder.h"
#include "step_queue.h"  // capture/src: the copy RecordStep makes, measured alone

namespace {

using namespace crashreplay;
using Clock = std::chrono::steady_clock;

double Ns(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::nano>(b - a).count(); }

long MinorFaults() {
  struct rusage r;
  getrusage(RUSAGE_THREAD, &r);
  return r.ru_minflt;
}

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

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
  // A decode step as a real one follows the one before: each request's
  // last output becomes its token, positions, lengths and cache slots
  // advance by one, new outputs are drawn (a fixed generator: the same
  // sequence every run). The constant batch (no Evolve) repeats all but
  // the step number, RNG offset and timestamp.
  void Evolve(uint64_t step) {
    auto draw = [](uint64_t st, size_t i) {
      uint64_t x = (st + 1) * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull;
      x ^= x >> 31;
      x *= 0x94d049bb133111ebull;
      return static_cast<int64_t>((x >> 17) % 151000);
    };
    const auto d = static_cast<int64_t>(step);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = step == 0 ? static_cast<int64_t>(i * 13 % 151000) : draw(step - 1, i);
      positions[i] = static_cast<int64_t>(500 + i) + d;
      seq_lens[i] = static_cast<int64_t>(501 + i) + d;
      out_loc[i] = static_cast<int64_t>(i * 2048 + 501) + d;
      outputs[i] = draw(step, i);
    }
  }
  // The bytes a step holds: the integer lists, sampling, request-id chars.
  size_t RawBytes() const {
    size_t n = (tokens.size() + positions.size() + seq_lens.size() + pool.size() + out_loc.size() + outputs.size() +
                offsets.size() + slots.size()) *
                   sizeof(int64_t) +
               sampling.size() * sizeof(SamplingParams);
    for (std::string_view id : ids) n += id.size();
    return n;
  }
};

// The reference: a plain memcpy of the view's spans into one flat buffer.
// The step's spans one after the other from d; returns their end.
char* CopySpans(const capture::StepView& v, char* d) {
  const std::span<const int64_t> fields[] = {v.token_ids,        v.positions,        v.seq_lens,
                                             v.extend_lens,      v.req_pool_indices, v.page_table_offsets,
                                             v.page_table_slots, v.out_cache_loc,    v.output_token_ids};
  for (const auto& f : fields) {
    std::memcpy(d, f.data(), f.size_bytes());
    d += f.size_bytes();
  }
  std::memcpy(d, v.sampling.data(), v.sampling.size_bytes());
  d += v.sampling.size_bytes();
  for (std::string_view id : v.request_ids) {
    std::memcpy(d, id.data(), id.size());
    d += id.size();
  }
  return d;
}

class FlatCopy {
 public:
  explicit FlatCopy(size_t bytes) : buf_(bytes + 4096, 1) {}
  void Copy(const capture::StepView& v) {
    const char* end = CopySpans(v, buf_.data());
    sink_ += static_cast<unsigned char>(end[-1]);
  }
  unsigned sink() const { return sink_; }

 private:
  std::vector<char> buf_;
  unsigned sink_ = 0;
};

// The same copy handed to another thread, as the recorder hands a step to
// its writer: into the next of 64 slots, published with a release store,
// and read whole by a reader thread that polls with the writer's backoff
// (50 us, growing to 1 ms). What any copy of a step costs once its bytes
// must reach another core: the destination lines were last read there.
class HandoffCopy {
 public:
  explicit HandoffCopy(size_t bytes) : stride_((bytes + 4096 + 63) / 64 * 64), buf_(kSlots * stride_, 1) {
    reader_ = std::thread([this] { Read(); });
  }
  ~HandoffCopy() {
    stop_.store(true);
    reader_.join();
  }
  void Copy(const capture::StepView& v) {
    const uint64_t h = head_.load(std::memory_order_relaxed);
    while (h - tail_.load(std::memory_order_acquire) >= kSlots) usleep(50);  // never under pacing
    char* const begin = buf_.data() + (h % kSlots) * stride_;
    sizes_[h % kSlots] = static_cast<size_t>(CopySpans(v, begin) - begin);
    head_.store(h + 1, std::memory_order_release);
  }
  uint64_t sink() const { return sink_.load(); }

 private:
  static constexpr size_t kSlots = 64;
  void Read() {
    int idle = 0;
    uint64_t t = 0, sum = 0;
    while (!stop_.load(std::memory_order_acquire)) {
      const uint64_t h = head_.load(std::memory_order_acquire);
      if (t == h) {
        idle = std::min(idle + 1, 20);
        usleep(static_cast<useconds_t>(idle * 50));
        continue;
      }
      idle = 0;
      for (; t < h; ++t) {
        const char* p = buf_.data() + (t % kSlots) * stride_;
        for (size_t i = 0; i + 8 <= sizes_[t % kSlots]; i += 8) {
          uint64_t w;
          std::memcpy(&w, p + i, 8);
          sum += w;
        }
        tail_.store(t + 1, std::memory_order_release);
      }
    }
    sink_.store(sum);
  }
  const size_t stride_;
  std::vector<char> buf_;
  size_t sizes_[kSlots] = {};
  std::atomic<uint64_t> head_{0}, tail_{0}, sink_{0};
  std::atomic<bool> stop_{false};
  std::thread reader_;
};

enum class Pace { kBusy, kSleep, kNone };
const char* PaceName(Pace p) { return p == Pace::kBusy ? "busy" : p == Pace::kSleep ? "sleep" : "none"; }

constexpr int kPaceUs = 500;

// Between steps: see the header comment.
class Pacer {
 public:
  Pacer() : ws_(4 << 20, 1) {}
  void Wait(Pace p) {
    if (p == Pace::kNone) return;
    if (p == Pace::kSleep) {
      usleep(kPaceUs);
      return;
    }
    const auto end = Clock::now() + std::chrono::microseconds(kPaceUs);
    while (Clock::now() < end) {
      for (int k = 0; k < 512; ++k) {
        ws_[at_] = static_cast<unsigned char>(ws_[at_] + 1);
        acc_ += ws_[at_];
        at_ = (at_ + 64) % ws_.size();
      }
    }
  }
  unsigned sink() const { return acc_; }

 private:
  std::vector<unsigned char> ws_;
  size_t at_ = 0;
  unsigned acc_ = 0;
};

struct Dist {
  double min = 0, p50 = 0, p99 = 0;
  double faults = 0;  // per step
};

Dist Summarize(std::vector<double> t, long faults) {
  std::sort(t.begin(), t.end());
  return Dist{t[0] / 1e3, t[t.size() / 2] / 1e3, t[t.size() * 99 / 100] / 1e3,
              static_cast<double>(faults) / static_cast<double>(t.size())};
}

// min over runs of min, median over runs of p50 and of p99.
Dist Across(std::vector<Dist> runs) {
  Dist d;
  auto med = [&](auto get) {
    std::vector<double> v;
    for (const Dist& r : runs) v.push_back(get(r));
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  d.min = 1e30;
  for (const Dist& r : runs) d.min = std::min(d.min, r.min);
  d.p50 = med([](const Dist& r) { return r.p50; });
  d.p99 = med([](const Dist& r) { return r.p99; });
  d.faults = med([](const Dist& r) { return r.faults; });
  return d;
}

SessionManifest Manifest() {
  SessionManifest m;
  m.engine = "recorder_bench";
  return m;
}

std::string TempDir() {
  std::string t = (std::filesystem::temp_directory_path() / "recbench-XXXXXX").string();
  return ::mkdtemp(t.data());
}

std::unique_ptr<capture::Recorder> Begin(const std::string& dir, uint64_t ring_bytes) {
  capture::RecorderOptions o;
  o.session_dir = dir;
  o.snapshot_ring_bytes = ring_bytes;
  o.install_signal_handlers = false;
  auto rec = capture::Recorder::Begin(Manifest(), o);
  if (!rec.ok()) {
    std::fprintf(stderr, "%s\n", rec.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(rec);
}

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    std::exit(1);
  }
}

struct RunResult {
  Dist dist;
  double seconds = 0;      // first call to Flush done
  uint64_t file_bytes = 0;
  uint64_t spilled = 0;
  uint64_t written = 0;    // steps the writer wrote in `seconds`
};

// One run of `steps` RecordStep calls (after a warm-up) under `pace`;
// `memcpy_only` measures the FlatCopy reference instead.
RunResult StepRun(Batch& b, int steps, Pace pace, bool memcpy_only, Pacer& pacer, FlatCopy& flat, bool evolve = false,
                  HandoffCopy* handoff = nullptr) {
  const std::string dir = TempDir();
  std::unique_ptr<capture::Recorder> rec = Begin(dir, 1 << 20);
  constexpr int kWarmup = 512;
  for (int i = 0; i < kWarmup; ++i) {
    if (evolve) b.Evolve(static_cast<uint64_t>(i));
    const capture::StepView v = b.View(static_cast<uint64_t>(i));
    if (handoff != nullptr)
      handoff->Copy(v);
    else if (memcpy_only)
      flat.Copy(v);
    else
      Check(rec->RecordStep(v));
    pacer.Wait(pace);
  }
  std::vector<double> t(static_cast<size_t>(steps));
  const uint64_t written0 = rec->stats().steps_written;
  const long f0 = MinorFaults();
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) {
    if (evolve) b.Evolve(static_cast<uint64_t>(kWarmup + i));
    const capture::StepView v = b.View(static_cast<uint64_t>(kWarmup + i));
    const auto a = Clock::now();
    if (handoff != nullptr)
      handoff->Copy(v);
    else if (memcpy_only)
      flat.Copy(v);
    else
      Check(rec->RecordStep(v));
    t[static_cast<size_t>(i)] = Ns(a, Clock::now());
    pacer.Wait(pace);
  }
  const long faults = MinorFaults() - f0;
  Check(rec->Flush());
  RunResult r;
  r.seconds = Ns(start, Clock::now()) * 1e-9;
  r.written = rec->stats().steps_written - written0;
  r.spilled = rec->stats().steps_spilled;
  const uint64_t before = rec->stats().file_bytes;
  Check(rec->Close());
  r.file_bytes = before;
  r.dist = Summarize(std::move(t), faults);
  std::filesystem::remove_all(dir);
  return r;
}

void PrintDist(const char* what, const Dist& d) {
  std::printf("    %-11s min %6.2f  p50 %6.2f  p99 %7.2f us  faults/step %.2f\n", what, d.min, d.p50, d.p99, d.faults);
}

// zstd -1 CLI on a file: MB/s of input, process start included.
double ZstdCliMBs(const std::string& path, size_t bytes) {
  const auto a = Clock::now();
  const int rc = std::system(("zstd -1 -q -c '" + path + "' > /dev/null").c_str());
  const double s = Ns(a, Clock::now()) * 1e-9;
  return rc == 0 ? static_cast<double>(bytes) / s / 1e6 : 0.0;
}

double MemcpyMBs(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const auto t = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::min(best, Ns(t, Clock::now()));
  }
  return static_cast<double>(bytes) / best * 1e3;
}

// The step records of a run as the writer gets them, each encoded whole and
// uncompressed (Cap'n Proto, 24-byte frame header), into one file: the
// bytes the writer compresses, for the zstd CLI. Returns their size.
uint64_t WriteRawStepLog(Batch& b, int steps, bool evolve, const std::string& path) {
  capture::internal::StepQueue q(4, 8 << 20);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  StepRecord record;
  uint64_t bytes = 0;
  for (int i = 0; i < steps; ++i) {
    if (evolve) b.Evolve(static_cast<uint64_t>(i));
    q.Push(b.View(static_cast<uint64_t>(i)), 1700000000000000000ll + i * 1000000ll);
    q.Unpack(q.head() - 1, 0, &record);
    q.Release(q.head() - 1);
    absl::StatusOr<EncodedFrame> f = FrameEncoder::Encode(record, /*compress=*/false);
    Check(f.status());
    out.write(reinterpret_cast<const char*>(f->bytes.data()), static_cast<std::streamsize>(f->bytes.size()));
    bytes += f->bytes.size();
  }
  return bytes;
}

// zstd -1 CLI on a file: MB/s of input (process start included) and the
// compression ratio.
std::pair<double, double> ZstdCli(const std::string& path, size_t bytes) {
  const std::string z = path + ".zst";
  const auto a = Clock::now();
  const int rc = std::system(("zstd -1 -q -f -o '" + z + "' '" + path + "'").c_str());
  const double s = Ns(a, Clock::now()) * 1e-9;
  std::error_code ec;
  const uintmax_t zbytes = std::filesystem::file_size(z, ec);
  std::filesystem::remove(z, ec);
  if (rc != 0 || ec || zbytes == 0) return {0.0, 0.0};
  return {static_cast<double>(bytes) / s / 1e6, static_cast<double>(bytes) / static_cast<double>(zbytes)};
}

// The writer's sustained rate: back to back, until everything is written,
// in MB/s of step records (as encoded whole and uncompressed), beside the
// `zstd -1` CLI on those same records.
void WriterThroughput(Batch& b, int runs, int steps, bool evolve, Pacer& pacer, FlatCopy& flat) {
  std::vector<double> rates;
  RunResult last;
  for (int r = 0; r < runs; ++r) {
    last = StepRun(b, steps, Pace::kNone, false, pacer, flat, evolve);
    rates.push_back(static_cast<double>(last.written) / last.seconds);
  }
  std::sort(rates.begin(), rates.end());
  const int total = steps + 512;  // with the warm-up, as in the file
  const std::string raw_path = (std::filesystem::temp_directory_path() / "recbench-steplog.raw").string();
  const uint64_t raw_bytes = WriteRawStepLog(b, total, evolve, raw_path);
  const double raw_per_step = static_cast<double>(raw_bytes) / total;
  const double file_per_step = static_cast<double>(last.file_bytes) / total;
  const double mbs = rates[rates.size() / 2] * raw_per_step / 1e6;
  const double ratio = raw_per_step / file_per_step;
  const auto [cli_mbs, cli_ratio] = ZstdCli(raw_path, raw_bytes);
  std::filesystem::remove(raw_path);
  std::printf(
      "  writer, back to back, %s batch (load %s): %.0f steps/s (median of %d; min %.0f max %.0f) = %.1f MB/s "
      "of step records (%.0f B/step), %.1f B/step in the file (ratio %.1f; the index at close not counted)\n",
      evolve ? "evolving" : "constant", LoadAverage().c_str(), rates[rates.size() / 2], runs, rates.front(),
      rates.back(), mbs, raw_per_step, file_per_step, ratio);
  std::printf(
      "    beside: zstd -1 CLI %.0f MB/s, ratio %.1f on the same records uncompressed (%llu bytes) | "
      "writer/CLI: %.2fx speed, %.2fx ratio | memcpy %.0f MB/s\n",
      cli_mbs, cli_ratio, static_cast<unsigned long long>(raw_bytes), cli_mbs > 0 ? mbs / cli_mbs : 0.0,
      cli_ratio > 0 ? ratio / cli_ratio : 0.0, MemcpyMBs(raw_bytes));
}

void StepLog(const char* label, size_t slots_per_row, int runs, int steps, const std::vector<Pace>& paces) {
  Batch b(256, slots_per_row);
  Pacer pacer;
  FlatCopy flat(b.RawBytes());
  std::printf("\n%s: %zu bytes of spans per step, %d runs x %d steps (load %s)\n", label, b.RawBytes(), runs, steps,
              LoadAverage().c_str());
  // The copy RecordStep makes, alone: no threads, no pacing (tight loop).
  {
    capture::internal::StepQueue q(256, 8 << 20);
    const capture::StepView v = b.View(1);
    double best_push = 1e30, best_flat = 1e30;
    for (int rep = 0; rep < 20; ++rep) {
      auto a = Clock::now();
      for (int i = 0; i < 200; ++i) {
        q.Push(v, 1);
        q.Release(q.head() - 1);  // empty again: the next push rewinds
      }
      best_push = std::min(best_push, Ns(a, Clock::now()) / 200);
      a = Clock::now();
      for (int i = 0; i < 200; ++i) flat.Copy(v);
      best_flat = std::min(best_flat, Ns(a, Clock::now()) / 200);
    }
    std::printf("  tight loop, no threads:  queue push %.2f us   memcpy of the spans %.2f us (best of 20 x 200)\n",
                best_push / 1e3, best_flat / 1e3);
  }
  for (Pace pace : paces) {
    std::vector<Dist> rec_runs, ref_runs, hand_runs;
    std::vector<double> file_per_step;
    for (int r = 0; r < runs; ++r) {
      const RunResult rr = StepRun(b, steps, pace, false, pacer, flat);
      rec_runs.push_back(rr.dist);
      file_per_step.push_back(static_cast<double>(rr.file_bytes) / (steps + 512));
      ref_runs.push_back(StepRun(b, steps, pace, true, pacer, flat).dist);
      HandoffCopy handoff(b.RawBytes());
      hand_runs.push_back(StepRun(b, steps, pace, true, pacer, flat, false, &handoff).dist);
    }
    std::printf("  pace %-5s (load %s)\n", PaceName(pace), LoadAverage().c_str());
    for (int r = 0; r < runs; ++r) {
      std::printf(
          "    run %d: RecordStep p50 %6.2f p99 %7.2f | memcpy p50 %6.2f p99 %7.2f | handed off p50 %6.2f p99 %7.2f "
          "us | file %6.0f B/step\n",
          r, rec_runs[r].p50, rec_runs[r].p99, ref_runs[r].p50, ref_runs[r].p99, hand_runs[r].p50, hand_runs[r].p99,
          file_per_step[r]);
    }
    const Dist rec = Across(rec_runs), ref = Across(ref_runs), hand = Across(hand_runs);
    PrintDist("RecordStep", rec);
    PrintDist("memcpy", ref);
    PrintDist("handed off", hand);
    std::printf("    RecordStep p50 / memcpy %.2fx, / memcpy handed off %.2fx (issue 29's target: <= 1.1x memcpy)\n",
                rec.p50 / ref.p50, rec.p50 / hand.p50);
  }
  for (bool evolve : {false, true}) WriterThroughput(b, runs, steps, evolve, pacer, flat);
  if (flat.sink() == 1 && pacer.sink() == 1) std::printf(" ");
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

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Snapshot(size_t mib, int reps) {
  const size_t bytes = mib << 20;
  const std::vector<std::byte> data = Bf16Like(bytes);
  // The references: memcpy into a reused buffer already in this core's
  // cache (the best case); into a fresh mapping each time (page faults
  // included); and, interleaved with the SubmitSnapshot calls below, into a
  // reused buffer under the ring's own conditions: another thread reads it
  // after the copy (as the encoder reads the ring), then the calling thread
  // waits as long as the encoder took.
  std::vector<double> warm, fresh, same;
  {
    std::vector<std::byte> dst(bytes);
    std::memcpy(dst.data(), data.data(), bytes);
    for (int i = 0; i < reps; ++i) {
      const auto a = Clock::now();
      std::memcpy(dst.data(), data.data(), bytes);
      warm.push_back(Ns(a, Clock::now()));
    }
    for (int i = 0; i < reps; ++i) {
      void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) std::exit(2);
      const auto a = Clock::now();
      std::memcpy(p, data.data(), bytes);
      fresh.push_back(Ns(a, Clock::now()));
      ::munmap(p, bytes);
    }
  }
  std::vector<std::byte> ref(bytes);
  std::memcpy(ref.data(), data.data(), bytes);
  std::atomic<int> go{0};
  std::atomic<uint64_t> sum{0};
  std::thread reader([&] {  // reads `ref` after each reference copy
    for (int i = 0; i < reps; ++i) {
      while (go.load() != 1) usleep(20);
      uint64_t x = 0;
      for (size_t k = 0; k < bytes; k += 64) x += static_cast<uint8_t>(ref[k]);
      sum += x;
      go.store(0);
    }
  });
  const std::string dir = TempDir();
  std::unique_ptr<capture::Recorder> rec = Begin(dir, bytes + (1 << 20));
  const int64_t shape[] = {static_cast<int64_t>(bytes / 2)};
  const capture::TensorView view{"hidden_states", DType::kBF16, shape, data.data(), bytes};
  std::vector<double> submit;
  double encode_ns = 0, ratio = 0;
  long faults = 0;
  for (int i = 0; i < reps; ++i) {
    const uint64_t before = rec->stats().snapshots_encoded;
    const long f0 = MinorFaults();
    const auto a = Clock::now();
    Check(rec->SubmitSnapshot(static_cast<uint64_t>(i), {&view, 1}));
    const auto b = Clock::now();
    faults += MinorFaults() - f0;
    submit.push_back(Ns(a, b));
    while (rec->stats().snapshots_encoded == before) usleep(100);
    const double took = Ns(b, Clock::now());
    encode_ns += took;
    if (i == 0) ratio = static_cast<double>(bytes) / std::max<uint64_t>(1, rec->stats().ring_encoded_bytes);
    const auto c = Clock::now();
    std::memcpy(ref.data(), data.data(), bytes);
    same.push_back(Ns(c, Clock::now()));
    go.store(1);
    const auto wait_until = Clock::now() + std::chrono::nanoseconds(static_cast<int64_t>(took));
    while (go.load() != 0 || Clock::now() < wait_until) usleep(100);
  }
  reader.join();
  const uint64_t dropped = rec->stats().snapshots_dropped;
  Check(rec->Close());
  std::filesystem::remove_all(dir);
  // The encoder's work alone, on this thread (FrameEncoder::EncodeBlob, as
  // the ring's encoder calls it: hash + shuffle + compress), into the
  // buffer of the blob encoded before it (the ring's steady state: an
  // evicted snapshot's buffer) and into fresh memory, and zstd -1 in
  // process (no hash, no shuffle, output buffer allocated beforehand),
  // alternating; best of `reps` each.
  double enc_best = 1e30, fresh_best = 1e30, z_best = 1e30, enc_ratio = 0;
  size_t zn = 0;
  std::vector<char> out(ZSTD_compressBound(bytes));
  std::vector<unsigned char> spare = FrameEncoder::EncodeBlob(data, 2, BlobEncodeOptions{}).bytes;
  for (int i = 0; i < reps; ++i) {
    const auto e = Clock::now();
    EncodedFrame f = FrameEncoder::EncodeBlob(data, 2, BlobEncodeOptions{}, std::move(spare));
    enc_best = std::min(enc_best, Ns(e, Clock::now()));
    enc_ratio = static_cast<double>(bytes) / static_cast<double>(f.bytes.size());
    spare = std::move(f.bytes);
    const auto e2 = Clock::now();
    const EncodedFrame g = FrameEncoder::EncodeBlob(data, 2, BlobEncodeOptions{});
    fresh_best = std::min(fresh_best, Ns(e2, Clock::now()));
    const auto z = Clock::now();
    zn = ZSTD_compress(out.data(), out.size(), data.data(), bytes, 1);
    z_best = std::min(z_best, Ns(z, Clock::now()));
  }
  const double z_s = z_best * 1e-9;
  const std::string path = (std::filesystem::temp_directory_path() / "recbench-zstd.bin").string();
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(bytes));
  const double cli = ZstdCliMBs(path, bytes);
  std::filesystem::remove(path);
  auto min_us = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()) / 1e3; };
  std::printf("  %4zu MiB (%d reps, load %s)\n", mib, reps, LoadAverage().c_str());
  std::printf(
      "    SubmitSnapshot     min %9.1f  p50 %9.1f us  (%.1f faults/call; %llu older snapshots evicted by the "
      "ring's budget)\n",
      min_us(submit), Median(submit) / 1e3, static_cast<double>(faults) / reps,
      static_cast<unsigned long long>(dropped));
  std::printf(
      "    memcpy, same conditions min %9.1f  p50 %9.1f us | reused hot buffer min %9.1f  p50 %9.1f us | "
      "fresh mapping p50 %9.1f us\n",
      min_us(same), Median(same) / 1e3, min_us(warm), Median(warm) / 1e3, Median(fresh) / 1e3);
  const double z_mbs = static_cast<double>(bytes) / z_s / 1e6;
  const double z_ratio = ZSTD_isError(zn) ? 0.0 : static_cast<double>(bytes) / static_cast<double>(zn);
  const double enc_mbs = static_cast<double>(bytes) / enc_best * 1e3;
  const double fresh_mbs = static_cast<double>(bytes) / fresh_best * 1e3;
  std::printf("    encoder thread, submit to encoded %5.0f MB/s (ratio %.2f; its polling included)\n",
              static_cast<double>(bytes) * reps / encode_ns * 1e3, ratio);
  std::printf(
      "    encoder alone %5.0f MB/s into a reused buffer, %5.0f into fresh memory, ratio %.3f (hash + byte planes + "
      "zstd) | zstd -1 in process %5.0f MB/s ratio %.3f | encoder/zstd: %.2fx speed (fresh memory %.2fx), %.2fx "
      "ratio | zstd -1 CLI %5.0f MB/s\n",
      enc_mbs, fresh_mbs, enc_ratio, z_mbs, z_ratio, enc_mbs / z_mbs, fresh_mbs / z_mbs, enc_ratio / z_ratio, cli);
}

}  // namespace

// 3. Page-table rows as context grows (docs/capture.md, "Page-table
// deltas"): a decode batch of B requests whose rows hold C slots each and
// gain one a step, recorded three ways: whole rows into a file of whole
// rows (page_table_deltas off: the recorder before deltas), whole rows
// into a file of deltas (the recorder compares each row with the one it
// holds), and rows given as deltas (one new slot a request from column
// seq_len - 1, as the sglang adapter now gives a decode step). RecordStep
// per call on the calling thread (p50 and mean; the mean includes waits
// for a writer that fell a whole queue behind, as whole rows at 16k slots
// make it), the writer's time to the last step (Flush) per step, and file
// bytes per step, both after the warm-up (its first step writes the rows
// whole; the writer writes them whole again once the deltas outweigh them
// 8 times, about 1/8 more on a long run); beside them a memcpy of the
// step's whole rows.
void ContextSweep(int steps) {
  std::printf("\npage-table rows as context grows: %d decode steps per case after 16 warm-up steps (load %s)\n", steps,
              LoadAverage().c_str());
  std::printf("  %5s %6s  %-24s %10s %10s %12s %12s %14s\n", "batch", "slots", "rows", "p50 us", "mean us", "writer us",
              "file B/step", "memcpy rows us");
  for (size_t batch : {size_t{64}, size_t{256}}) {
    for (size_t ctx : {size_t{512}, size_t{4096}, size_t{16384}}) {
      for (int how = 0; how < 3; ++how) {
        const bool deltas_in_file = how > 0, given_deltas = how == 2;
        std::vector<std::vector<int64_t>> rows(batch);
        for (size_t i = 0; i < batch; ++i) {
          rows[i].reserve(ctx + static_cast<size_t>(steps) + 32);
          for (size_t j = 0; j < ctx; ++j) rows[i].push_back(static_cast<int64_t>(i << 20 | j));
        }
        std::vector<int64_t> pool(batch), lens(batch), offsets, slots, starts, out_loc(batch), tokens(batch, 7);
        for (size_t i = 0; i < batch; ++i) pool[i] = static_cast<int64_t>(i);
        const std::string path = (std::filesystem::temp_directory_path() / "recbench-ctx.crcap").string();
        capture::RecorderOptions o;
        o.path = path;
        o.overwrite = true;
        o.install_signal_handlers = false;
        o.page_table_deltas = deltas_in_file;
        o.step_queue_wait_s = 600;  // wait for the writer rather than drop: every case writes every step
        auto rec = capture::Recorder::Begin(SessionManifest{}, o);
        if (!rec.ok()) {
          std::printf("  cannot record: %s\n", std::string(rec.status().message()).c_str());
          return;
        }
        std::vector<double> calls;
        std::vector<char> flat;
        double memcpy_ns = 0;
        const int warm = 16;
        Clock::time_point t0;
        uint64_t bytes0 = 0;
        for (int st = 0; st < warm + steps; ++st) {
          if (st == warm) {  // the first step's whole rows are written: time what follows
            (void)(*rec)->Flush();
            bytes0 = (*rec)->stats().file_bytes;
            t0 = Clock::now();
          }
          offsets.assign(1, 0);
          slots.clear();
          starts.clear();
          for (size_t i = 0; i < batch; ++i) {
            if (st > 0) rows[i].push_back(static_cast<int64_t>(i << 20 | rows[i].size()));
            lens[i] = static_cast<int64_t>(rows[i].size());
            out_loc[i] = rows[i].back();
            const bool delta = given_deltas && st > 0;
            const size_t from = delta ? rows[i].size() - 1 : 0;
            slots.insert(slots.end(), rows[i].begin() + static_cast<std::ptrdiff_t>(from), rows[i].end());
            offsets.push_back(static_cast<int64_t>(slots.size()));
            starts.push_back(static_cast<int64_t>(from));
          }
          capture::StepView v;
          v.step = static_cast<uint64_t>(st);
          v.mode = ForwardMode::kDecode;
          v.token_ids = tokens;
          v.seq_lens = lens;
          v.req_pool_indices = pool;
          v.out_cache_loc = out_loc;
          v.page_table_offsets = offsets;
          v.page_table_slots = slots;
          if (given_deltas) v.page_table_starts = starts;
          const auto a = Clock::now();
          (void)(*rec)->RecordStep(v);
          const auto b = Clock::now();
          if (st >= warm) calls.push_back(Ns(a, b));
          if (st >= warm && how == 0) {  // the reference: the whole rows copied once
            flat.resize(batch * (ctx + static_cast<size_t>(steps) + 32) * sizeof(int64_t));
            const auto c = Clock::now();
            char* d = flat.data();
            for (size_t i = 0; i < batch; ++i) {
              std::memcpy(d, rows[i].data(), rows[i].size() * sizeof(int64_t));
              d += rows[i].size() * sizeof(int64_t);
            }
            memcpy_ns += Ns(c, Clock::now());
            if (flat[1] == 42) std::printf(" ");
          }
        }
        (void)(*rec)->Flush();
        const double writer_ns = Ns(t0, Clock::now());
        const uint64_t bytes = (*rec)->stats().file_bytes - bytes0;
        (void)(*rec)->Close();
        std::filesystem::remove(path);
        double mean = 0;
        for (double c : calls) mean += c;
        mean /= static_cast<double>(calls.size());
        std::sort(calls.begin(), calls.end());
        static const char* kHow[] = {"whole, file whole", "whole, file deltas", "given as deltas"};
        char ref[32] = "";
        if (how == 0) std::snprintf(ref, sizeof ref, "%.1f", memcpy_ns / steps / 1e3);
        std::printf("  %5zu %6zu  %-24s %10.2f %10.2f %12.1f %12.0f %14s\n", batch, ctx, kHow[how],
                    calls[calls.size() / 2] / 1e3, mean / 1e3, writer_ns / steps / 1e3,
                    static_cast<double>(bytes) / steps, ref);
      }
    }
  }
}

int main(int argc, char** argv) {
  int runs = 5, steps = 4000;
  bool quick = false, snapshots = true, step_log = true, context = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
      runs = std::max(1, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
      steps = std::max(100, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--quick") == 0)
      quick = true;
    else if (std::strcmp(argv[i], "--no-snapshots") == 0)
      snapshots = false;
    else if (std::strcmp(argv[i], "--no-steps") == 0)
      step_log = false;
    else if (std::strcmp(argv[i], "--no-context") == 0)
      context = false;
    else if (std::strcmp(argv[i], "--only-context") == 0)
      step_log = snapshots = false;
    else {
      std::fprintf(stderr, "recorder_bench: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (quick) {
    runs = std::min(runs, 3);
    steps = std::min(steps, 2000);
  }
  std::printf("recorder_bench: %ld cores online, load average %s; times are the calling thread unless marked\n",
              sysconf(_SC_NPROCESSORS_ONLN), LoadAverage().c_str());
  if (step_log) {
    StepLog("step log, decode batch of 256 requests", 0, runs, steps, {Pace::kBusy, Pace::kSleep, Pace::kNone});
    StepLog("step log + page-table rows (256 x 64 slots)", 64, runs, steps, {Pace::kBusy, Pace::kNone});
  }
  if (context) ContextSweep(quick ? 100 : 300);
  if (snapshots) {
    std::printf("\nsnapshots of bf16-like data\n");
    Snapshot(1, quick ? 5 : 20);
    Snapshot(16, quick ? 3 : 8);
    Snapshot(256, quick ? 2 : 3);
  }
  return 0;
}
