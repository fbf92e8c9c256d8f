// Helpers for the recorder tests: a manifest, a synthetic decode batch with
// owned storage, a child-process runner and capture reading. Tests only.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "crashreplay/capture/recorder.h"
#include "crashreplay/formats/capture_reader.h"

namespace crashreplay::testing {

class RecorderTempDir {
 public:
  RecorderTempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "crrec-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~RecorderTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline SessionManifest TestManifest(uint32_t rank = 0, uint32_t tp = 1) {
  SessionManifest m;
  m.session_id = "test-session";
  m.engine = "crashreplay-test";
  m.engine_version = "0";
  m.model.model_type = "llama";
  m.model.num_layers = 2;
  m.parallel.tp_size = tp;
  m.parallel.world_size = tp;
  m.parallel.rank = rank;
  m.parallel.tp_rank = rank;
  m.toggles.push_back(Toggle{"attention_backend", std::string("reference")});
  return m;
}

// A decode batch of `requests` requests with owned storage; view() borrows it.
struct TestBatch {
  uint64_t step = 0;
  std::vector<std::string> id_storage;
  std::vector<std::string_view> ids;
  std::vector<int64_t> tokens, positions, seq_lens, pool, offsets, slots, out_loc, outputs;
  std::vector<SamplingParams> sampling;

  TestBatch(uint64_t step_, size_t requests, size_t slots_per_row = 0) : step(step_) {
    for (size_t i = 0; i < requests; ++i) id_storage.push_back("req-" + std::to_string(i));
    for (const std::string& s : id_storage) ids.push_back(s);
    // Tokens, outputs and cache slots are drawn afresh each step (full
    // 63-bit values, nothing like the step before): the step log is a
    // stream of zstd parts (format 2.2) that would otherwise shrink a
    // repeating step to a few dozen bytes, and the disk tests need steps
    // that fill a small file (about 1 KB a step of 16 requests).
    auto draw = [](uint64_t x) {
      x = (x + 1) * 0x9e3779b97f4a7c15ull;
      x ^= x >> 31;
      x *= 0x94d049bb133111ebull;
      x ^= x >> 29;
      return static_cast<int64_t>(x >> 1);
    };
    for (size_t i = 0; i < requests; ++i) {
      tokens.push_back(draw(step * 3 * requests + i));
      positions.push_back(static_cast<int64_t>(100 + step));
      seq_lens.push_back(static_cast<int64_t>(101 + step));
      pool.push_back(static_cast<int64_t>(i));
      out_loc.push_back(draw((step * 3 + 1) * requests + i));
      outputs.push_back(draw((step * 3 + 2) * requests + i));
      SamplingParams p;
      p.temperature = 0.7f;
      p.top_k = 40;
      p.seed = i;
      p.has_seed = true;
      sampling.push_back(p);
    }
    if (slots_per_row > 0) {
      offsets.push_back(0);
      for (size_t i = 0; i < requests; ++i) {
        for (size_t j = 0; j < slots_per_row; ++j) slots.push_back(static_cast<int64_t>(i * 4096 + j));
        offsets.push_back(static_cast<int64_t>(slots.size()));
      }
    }
  }

  capture::StepView view() const {
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
    v.rng_seed = 1234;
    v.rng_offset = step * 4;
    v.output_token_ids = outputs;
    return v;
  }
};

inline std::vector<std::byte> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng();
    for (size_t k = 0; k < 8 && i + k < n; ++k) out[i + k] = static_cast<std::byte>(v >> (8 * k));
  }
  return out;
}

// Runs `body` in a forked child. The child exits 0 if body returns; a failed
// setup inside it should _exit with a distinct code. Returns the wait status.
inline int RunInChild(const std::function<void()>& body) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    body();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

// Under ASan a SIGSEGV/SIGBUS/SIGFPE is reported and turned into exit(1) by
// the sanitizer (its handler runs after ours, which is the chaining we want).
inline bool DiedBy(int status, int sig) {
#if defined(__SANITIZE_ADDRESS__)
  if ((sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE) && WIFEXITED(status) && WEXITSTATUS(status) != 0) return true;
#endif
  return WIFSIGNALED(status) && WTERMSIG(status) == sig;
}

inline std::unique_ptr<CaptureReader> ReadCapture(const std::string& path) {
  absl::StatusOr<std::unique_ptr<CaptureReader>> r = CaptureReader::Open(path);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : nullptr;
}

// Steps 0..n-1 in order, nothing else.
inline void ExpectSteps(const CaptureReader& r, uint64_t n) {
  ASSERT_EQ(r.steps().size(), n);
  for (uint64_t i = 0; i < n; ++i) {
    EXPECT_EQ(r.steps()[i].step, i);
    TestBatch b(i, r.steps()[i].token_ids.size());
    EXPECT_EQ(r.steps()[i].token_ids, b.tokens) << "step " << i;
    EXPECT_EQ(r.steps()[i].output_token_ids, b.outputs) << "step " << i;
  }
}

}  // namespace crashreplay::testing
