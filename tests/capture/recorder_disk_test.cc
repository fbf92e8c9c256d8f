// Disk full and slow disks (docs/capture.md, "Disk full and slow disks"):
// the recorder fills a real small file system or file-size limit while
// recording, and the tests read the file back with the real reader.
//
// Two ways to run out of space: RLIMIT_FSIZE (no privileges: a write past
// the limit fails EFBIG once SIGXFSZ is ignored; raising the limit again is
// "space freed"), and an 8 MiB tmpfs (root only, skipped otherwise; deleting
// a filler file frees the space). A stalled disk is a FIFO nobody reads:
// the writer thread blocks in write(2) exactly as on a disk that stalls.
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_format.h"
#include "crashreplay/capture/recorder_c.h"
#include "recorder_test_util.h"

namespace crashreplay::testing {
namespace {

using capture::Recorder;
using capture::RecorderOptions;

// Lowers this process's file-size limit (and ignores SIGXFSZ, so a write
// past it fails EFBIG instead of killing the process) until Raise() or the
// end of the scope. Only files written past `bytes` are affected.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(uint64_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = signal(SIGXFSZ, SIG_IGN);
    rlimit lim = saved_;
    lim.rlim_cur = bytes;
    ok_ = setrlimit(RLIMIT_FSIZE, &lim) == 0;
  }
  ~FileSizeLimit() {
    Raise();
    signal(SIGXFSZ, old_handler_);
  }
  bool ok() const { return ok_; }
  void Raise() { setrlimit(RLIMIT_FSIZE, &saved_); }

 private:
  rlimit saved_{};
  sighandler_t old_handler_ = SIG_DFL;
  bool ok_ = false;
};

RecorderOptions DiskOptions(const std::string& path) {
  RecorderOptions o;
  o.path = path;
  o.install_signal_handlers = false;
  o.disk_retry_interval_s = 3600;  // retried only when a test asks (Flush, OnFailure, Close)
  return o;
}

struct Recorded {
  uint64_t calls = 0, failed = 0;
  absl::Status first;
};

// Steps [from, to) of 16 requests each (about 1.7 KB a step in the file).
void RecordSteps(Recorder& rec, uint64_t from, uint64_t to, Recorded* out) {
  for (uint64_t i = from; i < to; ++i) {
    absl::Status s = rec.RecordStep(TestBatch(i, 16).view());
    ++out->calls;
    if (!s.ok()) {
      if (out->failed++ == 0) out->first = s;
    }
  }
}

// The file as it is now, read from a copy (the recorder may still cut it).
std::unique_ptr<CaptureReader> ReadCopy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  absl::StatusOr<std::unique_ptr<CaptureReader>> r = CaptureReader::FromBytes(bytes, {}, path);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : nullptr;
}

// Steps in order, 0..k-1 and then, if the disk took part of the hold at a
// retry, a later run; any gap is covered by the dropped-steps counter the
// recorder wrote before it.
void ExpectStepsWithCountedGap(const CaptureReader& r, uint64_t n) {
  ASSERT_EQ(r.steps().size(), n);
  uint64_t gap = 0;
  for (uint64_t i = 1; i < n; ++i) {
    ASSERT_LT(r.steps()[i - 1].step, r.steps()[i].step);
    gap += r.steps()[i].step - r.steps()[i - 1].step - 1;
  }
  if (gap > 0) {
    ASSERT_TRUE(r.dropped().has_value());
    EXPECT_GE(r.dropped()->steps_dropped, gap);
  }
}

// A capture cut back to whole frames: nothing torn, nothing corrupt.
void ExpectIntactPrefix(const CaptureReader& r) {
  EXPECT_TRUE(r.scan_status().ok()) << r.scan_status();
  EXPECT_FALSE(r.truncated());
  EXPECT_FALSE(r.end().has_value());
  EXPECT_TRUE(r.Verify().status.ok()) << r.Verify().status;
}

TEST(RecorderDisk, FileSizeLimitReportsOnceHoldsStepsAndWritesThemWhenSpaceReturns) {
  RecorderTempDir dir;
  const std::string path = dir.path() + "/limit.crcap";
  Recorded rec_calls;
  uint64_t prefix_steps = 0;
  {
    FileSizeLimit limit(256 << 10);
    ASSERT_TRUE(limit.ok());
    auto rec = Recorder::Begin(TestManifest(), DiskOptions(path));
    ASSERT_TRUE(rec.ok()) << rec.status();
    RecordSteps(**rec, 0, 1000, &rec_calls);
    // Flush retries now; the limit still holds, so it says what is held.
    absl::Status flushed = (*rec)->Flush();
    EXPECT_EQ(flushed.code(), absl::StatusCode::kResourceExhausted) << flushed;
    EXPECT_NE(flushed.message().find("held in memory"), std::string_view::npos) << flushed;
    // Serving calls: exactly one report (the first step after the error),
    // ResourceExhausted with errno's text; every other call OK.
    EXPECT_EQ(rec_calls.failed, 1u) << rec_calls.first;
    EXPECT_EQ(rec_calls.first.code(), absl::StatusCode::kResourceExhausted) << rec_calls.first;
    EXPECT_NE(rec_calls.first.message().find("File too large"), std::string_view::npos) << rec_calls.first;
    const capture::RecorderStats held = (*rec)->stats();
    EXPECT_GE(held.write_errors, 2u);  // the first error and Flush's retry
    EXPECT_GT(held.steps_held, 0u);
    EXPECT_EQ(held.steps_dropped, 0u);
    EXPECT_EQ(held.steps_written + held.steps_held, 1000u);
    EXPECT_LE(held.file_bytes, 256u << 10);

    // The intact prefix reads back: steps 0..k-1, whole, nothing torn.
    std::unique_ptr<CaptureReader> prefix = ReadCopy(path);
    ASSERT_NE(prefix, nullptr);
    ExpectIntactPrefix(*prefix);
    ExpectSteps(*prefix, held.steps_written);
    prefix_steps = held.steps_written;
    EXPECT_GT(prefix_steps, 50u);

    // Space returns: the held steps follow the prefix.
    limit.Raise();
    EXPECT_TRUE((*rec)->Flush().ok());
    EXPECT_EQ((*rec)->stats().steps_held, 0u);
    EXPECT_EQ((*rec)->stats().steps_written, 1000u);
    RecordSteps(**rec, 1000, 1100, &rec_calls);
    EXPECT_EQ(rec_calls.failed, 1u);
    EXPECT_TRUE((*rec)->Close().ok());
  }
  std::unique_ptr<CaptureReader> r = ReadCapture(path);
  ASSERT_NE(r, nullptr);
  ASSERT_TRUE(r->end().has_value());
  EXPECT_TRUE(r->end()->ok);
  EXPECT_TRUE(r->Verify().status.ok()) << r->Verify().status;
  ExpectSteps(*r, 1100);
  const CaptureSummary sum = r->Summary();
  EXPECT_GE(sum.write_errors, 2u);
  EXPECT_EQ(sum.steps_dropped, 0u);
  std::printf(
      "file-size limit 256 KiB: %llu steps in the intact prefix, %llu held and written when space "
      "returned, 1100 read back, %llu failed writes, 1 report in 1100 calls\n",
      static_cast<unsigned long long>(prefix_steps), static_cast<unsigned long long>(1000 - prefix_steps),
      static_cast<unsigned long long>(sum.write_errors));
}

// Steps [from, to) ten at a time, 2 ms apart: paced as a server would be
// (a step every few hundred microseconds at most), so that the writer meets
// a limit while steps still come and the next call after it carries the
// one report.
void RecordPaced(Recorder& rec, uint64_t from, uint64_t to, Recorded* out) {
  for (uint64_t i = from; i < to; i += 10) {
    RecordSteps(rec, i, std::min(i + 10, to), out);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// Steps [0, n) paced into a file under `limit`; once the writer has taken
// them all (into the file or held), the limit is raised and the writer's
// own rate-limited retry (no Flush) writes what it held.
void FillThenFree(Recorder& rec, FileSizeLimit& limit, uint64_t n, Recorded* calls) {
  RecordPaced(rec, 0, n, calls);
  for (int i = 0; i < 2000 && rec.stats().steps_written + rec.stats().steps_held < n; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GT(rec.stats().steps_held, 0u);
  limit.Raise();
  for (int i = 0; i < 5000 && rec.stats().steps_held > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(rec.stats().steps_held, 0u);
}

TEST(RecorderDisk, WriterRetriesOnItsOwnWhenSpaceReturns) {
  RecorderTempDir dir;
  const std::string path = dir.path() + "/retry.crcap";
  RecorderOptions o = DiskOptions(path);
  o.disk_retry_interval_s = 0.02;
  Recorded calls;
  FileSizeLimit limit(32 << 10);
  ASSERT_TRUE(limit.ok());
  auto rec = Recorder::Begin(TestManifest(), o);
  ASSERT_TRUE(rec.ok()) << rec.status();
  FillThenFree(**rec, limit, 300, &calls);
  RecordPaced(**rec, 300, 350, &calls);  // after the held steps: the step stream again
  EXPECT_EQ(calls.failed, 1u);
  EXPECT_TRUE((*rec)->Close().ok());
  std::unique_ptr<CaptureReader> r = ReadCapture(path);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->end().has_value() && r->end()->ok);
  ExpectSteps(*r, 350);
  // The step log is one zstd stream (format 2.2) while the disk takes
  // writes; the steps it refused were held as frames of their own, and the
  // stream started a new zstd frame after them: no part follows one that
  // is not in the file.
  int starts = 0, alone = 0;
  bool last_was_part = false;
  for (const RecordInfo& info : r->records()) {
    if (info.type != static_cast<uint16_t>(RecordType::kStep)) continue;
    if ((info.flags & kFrameFlagZstdStream) == 0) {
      ++alone;
      last_was_part = false;
      continue;
    }
    const bool start = r->Payload(info)[0] == kStreamPartStart;
    starts += start;
    EXPECT_TRUE(start || last_was_part) << "a stream part continues past a step frame of its own at " << info.offset;
    last_was_part = true;
  }
  EXPECT_GE(alone, 1);   // held while the disk refused them
  EXPECT_GE(starts, 2);  // the first step, and again after the held ones
}

TEST(RecorderDisk, SpaceNeverReturnsCloseNamesWhatWasNotWrittenAndTheFileStaysIntact) {
  RecorderTempDir dir;
  const std::string path = dir.path() + "/full.crcap";
  RecorderOptions o = DiskOptions(path);
  o.held_steps = 50;  // the newest 50 steps are kept, older ones dropped and counted
  Recorded calls;
  absl::Status closed;
  capture::RecorderStats st;
  {
    FileSizeLimit limit(64 << 10);
    ASSERT_TRUE(limit.ok());
    auto rec = Recorder::Begin(TestManifest(), o);
    ASSERT_TRUE(rec.ok()) << rec.status();
    RecordSteps(**rec, 0, 1000, &calls);
    closed = (*rec)->Close();
    EXPECT_EQ((*rec)->Close(), closed);  // idempotent: the same report, no new error
    st = (*rec)->stats();
  }
  EXPECT_EQ(calls.failed, 1u);
  EXPECT_EQ(closed.code(), absl::StatusCode::kResourceExhausted);
  // The newest steps, up to 50, are what Close() could not write.
  const std::string held =
      absl::StrFormat("steps %d-999 (%d steps, held in memory)", 1000 - st.steps_held, st.steps_held);
  EXPECT_NE(closed.message().find(held), std::string_view::npos) << closed;
  EXPECT_NE(closed.message().find("steps dropped"), std::string_view::npos) << closed;
  EXPECT_NE(closed.message().find("index and end record"), std::string_view::npos) << closed;
  EXPECT_GT(st.steps_held, 0u);
  EXPECT_LE(st.steps_held, 50u);
  EXPECT_EQ(st.steps_written + st.steps_held + st.steps_dropped, 1000u);

  std::unique_ptr<CaptureReader> r = ReadCapture(path);
  ASSERT_NE(r, nullptr);
  ExpectIntactPrefix(*r);
  ExpectStepsWithCountedGap(*r, st.steps_written);
  std::printf("space never returns: %llu steps in the file, %llu dropped, the last %llu named by Close(): %s\n",
              static_cast<unsigned long long>(st.steps_written), static_cast<unsigned long long>(st.steps_dropped),
              static_cast<unsigned long long>(st.steps_held), std::string(closed.message()).c_str());
}

TEST(RecorderDisk, OnFailureWhileFullKeepsRingAndFailureForClose) {
  RecorderTempDir dir;
  const std::string path = dir.path() + "/failure.crcap";
  Recorded calls;
  {
    FileSizeLimit limit(48 << 10);
    ASSERT_TRUE(limit.ok());
    auto rec = Recorder::Begin(TestManifest(), DiskOptions(path));
    ASSERT_TRUE(rec.ok()) << rec.status();
    RecordSteps(**rec, 0, 400, &calls);
    std::vector<std::byte> kv = RandomBytes(4096, 7);
    const int64_t shape[] = {4096};
    capture::TensorView t{"kv", DType::kU8, shape, kv.data(), kv.size()};
    ASSERT_TRUE((*rec)->SubmitSnapshot(399, {&t, 1}).ok());
    capture::FailureInfo f;
    f.reason = "device-side assert triggered";
    f.stage = "decode";
    f.step = 399;
    absl::Status failed = (*rec)->OnFailure(f);
    EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted) << failed;
    EXPECT_NE(failed.message().find("1 failure record"), std::string_view::npos) << failed;
    EXPECT_NE(failed.message().find("the snapshot ring (1 snapshots)"), std::string_view::npos) << failed;
    limit.Raise();  // space returns before the process closes
    EXPECT_TRUE((*rec)->Close().ok());
  }
  EXPECT_EQ(calls.failed, 1u);
  std::unique_ptr<CaptureReader> r = ReadCapture(path);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->end().has_value() && r->end()->ok);
  EXPECT_TRUE(r->Verify().status.ok()) << r->Verify().status;
  ExpectSteps(*r, 400);
  ASSERT_EQ(r->failures().size(), 1u);
  EXPECT_EQ(r->failures()[0].reason, "device-side assert triggered");
  ASSERT_EQ(r->snapshots().size(), 1u);
  EXPECT_EQ(r->snapshots()[0].step, 399u);
}

TEST(RecorderDisk, SmallTmpfsFillsAndFreedSpaceTakesTheHeldSteps) {
  RecorderTempDir dir;
  const std::string mnt = dir.path() + "/tmpfs";
  std::filesystem::create_directory(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=8m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << strerror(errno)
                 << "); the file-size-limit tests cover the same paths without privileges";
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
  } unmount{mnt};
  // A filler leaves about 96 KiB free (2000 steps need about 3.4 MB).
  const std::string filler = mnt + "/filler";
  {
    std::ofstream out(filler, std::ios::binary);
    std::vector<char> block(4096, 'x');
    for (int i = 0; i < (8192 - 96) / 4; ++i) out.write(block.data(), block.size());
  }
  const std::string path = mnt + "/rank-00000.crcap";
  Recorded calls;
  auto rec = Recorder::Begin(TestManifest(), DiskOptions(path));
  ASSERT_TRUE(rec.ok()) << rec.status();
  RecordSteps(**rec, 0, 2000, &calls);
  EXPECT_EQ((*rec)->Flush().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(calls.failed, 1u);
  EXPECT_NE(calls.first.message().find("No space left on device"), std::string_view::npos) << calls.first;
  const capture::RecorderStats held = (*rec)->stats();
  std::unique_ptr<CaptureReader> prefix = ReadCopy(path);
  ASSERT_NE(prefix, nullptr);
  ExpectIntactPrefix(*prefix);
  ExpectSteps(*prefix, held.steps_written);
  std::filesystem::remove(filler);  // space returns
  EXPECT_TRUE((*rec)->Flush().ok());
  EXPECT_TRUE((*rec)->Close().ok());
  std::unique_ptr<CaptureReader> r = ReadCapture(path);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->end().has_value() && r->end()->ok);
  ExpectSteps(*r, 2000);
  std::printf(
      "tmpfs of 8 MiB, 96 KiB free: %llu steps in the prefix, %llu held and written after the filler was deleted\n",
      static_cast<unsigned long long>(held.steps_written), static_cast<unsigned long long>(held.steps_held));
}

TEST(RecorderDisk, StalledDiskNeverStallsTheCallerDropsAreCounted) {
  RecorderTempDir dir;
  const std::string fifo = dir.path() + "/stalled.crcap";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // The read end is open (so the recorder's open succeeds) but nobody reads
  // until the test says so: the writer thread blocks in write(2) once the
  // pipe's buffer is full, as it would on a disk that stalls.
  const int rd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(rd, 0);
  RecorderOptions o = DiskOptions(fifo);
  o.overwrite = true;
  o.step_queue_slots = 32;
  o.step_queue_wait_s = 0.05;
  auto rec = Recorder::Begin(TestManifest(), o);
  ASSERT_TRUE(rec.ok()) << rec.status();
  Recorded calls;
  double slowest = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < 2000; ++i) {
    const auto a = std::chrono::steady_clock::now();
    absl::Status s = (*rec)->RecordStep(TestBatch(i, 64, 16).view());
    slowest = std::max(slowest, std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
    ++calls.calls;
    if (!s.ok() && calls.failed++ == 0) calls.first = s;
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const capture::RecorderStats stalled = (*rec)->stats();
  EXPECT_LT(slowest, 0.5);  // one bounded wait (0.05 s) at most, never the stall
  EXPECT_EQ(calls.failed, 1u);
  EXPECT_EQ(calls.first.code(), absl::StatusCode::kResourceExhausted) << calls.first;
  EXPECT_GT(stalled.steps_dropped, 0u);
  EXPECT_EQ(stalled.steps_accepted + stalled.steps_dropped, 2000u);

  // The disk comes back: read everything; Close drains and writes the end.
  std::vector<unsigned char> bytes;
  std::thread reader([&] {
    fcntl(rd, F_SETFL, 0);  // blocking reads, until the writer closes
    unsigned char buf[1 << 16];
    for (;;) {
      const ssize_t n = ::read(rd, buf, sizeof buf);
      if (n <= 0) break;
      bytes.insert(bytes.end(), buf, buf + n);
    }
  });
  absl::Status closed = (*rec)->Close();
  reader.join();
  ::close(rd);
  EXPECT_TRUE(closed.ok()) << closed;
  absl::StatusOr<std::unique_ptr<CaptureReader>> r = CaptureReader::FromBytes(bytes, {}, fifo);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE((*r)->end().has_value() && (*r)->end()->ok);
  EXPECT_TRUE((*r)->Verify().status.ok()) << (*r)->Verify().status;
  EXPECT_EQ((*r)->steps().size(), stalled.steps_accepted);
  for (size_t i = 1; i < (*r)->steps().size(); ++i) EXPECT_LT((*r)->steps()[i - 1].step, (*r)->steps()[i].step);
  EXPECT_EQ((*r)->Summary().steps_dropped, stalled.steps_dropped);
  std::printf(
      "stalled writer: 2000 calls in %.3f s (slowest %.3f s), %llu steps queued and written, %llu dropped "
      "and counted, 1 report\n",
      total, slowest, static_cast<unsigned long long>(stalled.steps_accepted),
      static_cast<unsigned long long>(stalled.steps_dropped));
}

// The same through the C ABI (version 2): the disk options are honoured and
// the counters read back through cr_recorder_stats.
TEST(RecorderDisk, CAbiTakesTheDiskOptionsAndReportsItsCounters) {
  ASSERT_EQ(cr_recorder_abi_version(), 4);
  RecorderTempDir dir;
  const std::string path = dir.path() + "/c.crcap";
  cr_recorder_options o;
  cr_recorder_options_init(&o);
  EXPECT_EQ(o.held_steps, capture::RecorderOptions().held_steps);
  EXPECT_EQ(o.disk_retry_interval_s, capture::RecorderOptions().disk_retry_interval_s);
  o.path = path.c_str();
  o.install_signal_handlers = 0;
  o.held_steps = 100;
  o.disk_retry_interval_s = 3600;
  constexpr uint64_t kSteps = 1000;
  int failed = 0;
  cr_recorder_stats full{};
  {
    FileSizeLimit limit(64 << 10);
    ASSERT_TRUE(limit.ok());
    cr_recorder* r = nullptr;
    ASSERT_EQ(cr_recorder_begin("{\"engine\": \"c-disk\"}", &o, &r), CR_OK) << cr_last_error();
    std::vector<int64_t> tokens(16), positions(16), seq_lens(16), pool(16);
    std::vector<std::string> id_text(16);
    std::vector<const char*> ids(16);
    for (uint64_t i = 0; i < kSteps; ++i) {
      for (int64_t k = 0; k < 16; ++k) {
        tokens[k] = static_cast<int64_t>(i * 31 + k);
        positions[k] = static_cast<int64_t>(i);
        seq_lens[k] = static_cast<int64_t>(i + 1);
        pool[k] = k;
        id_text[k] = absl::StrFormat("r%d", k);
        ids[k] = id_text[k].c_str();
      }
      cr_step s{};
      s.step = i;
      s.mode = CR_MODE_DECODE;
      s.request_ids = ids.data();
      s.num_requests = 16;
      s.token_ids = tokens.data();
      s.num_tokens = 16;
      s.positions = positions.data();
      s.num_positions = 16;
      s.seq_lens = seq_lens.data();
      s.num_seq_lens = 16;
      s.req_pool_indices = pool.data();
      s.num_req_pool_indices = 16;
      if (cr_recorder_record_step(r, &s) != CR_OK) ++failed;
    }
    cr_recorder_flush(r);  // retries; the limit holds
    ASSERT_EQ(cr_recorder_stats_get(r, &full), CR_OK);
    limit.Raise();
    EXPECT_EQ(cr_recorder_close(r), CR_OK) << cr_last_error();
    cr_recorder_free(r);
  }
  EXPECT_EQ(failed, 1);  // one report, then every call succeeds
  EXPECT_GE(full.write_errors, 2u);
  EXPECT_GT(full.steps_written, 0u);
  // held_steps from the C options (the default holds 4,096): 100 held, or
  // one or two fewer when flush's retry fit a smaller frame into the space
  // the failed write did not fit.
  EXPECT_LE(full.steps_held, 100u);
  EXPECT_GE(full.steps_held, 95u);
  EXPECT_GT(full.held_bytes, 0u);
  EXPECT_EQ(full.steps_written + full.steps_held + full.steps_dropped, kSteps);
  std::unique_ptr<CaptureReader> r = ReadCapture(path);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->Verify().status.ok()) << r->Verify().status;
  ExpectStepsWithCountedGap(*r, full.steps_written + full.steps_held);
  EXPECT_EQ(r->steps().back().step, kSteps - 1);  // the newest steps were the ones held
}

}  // namespace
}  // namespace crashreplay::testing
