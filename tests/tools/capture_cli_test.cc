// The built `crashreplay` binary on good, truncated and bit-flipped
// captures: never killed by a signal, and the documented exit codes
// (0 ok, 2 usage, 3 data error).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../replay/snapshot_test_util.h"
#include "crashreplay/formats/capture_format.h"
#include "crashreplay/formats/capture_reader.h"

namespace crashreplay {
namespace {

struct Result {
  int exit_code = -1;
  int signal = 0;
  std::string out, err;
};

class CaptureCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* bin = std::getenv("CRASHREPLAY_BINARY_DIR");
    ASSERT_NE(bin, nullptr) << "run under ctest (CRASHREPLAY_BINARY_DIR names the build directory)";
    binary_ = std::string(bin) + "/tools/crashreplay";
    ASSERT_TRUE(std::filesystem::exists(binary_)) << binary_;
    std::string tmpl = (std::filesystem::temp_directory_path() / "crcli-XXXXXX").string();
    dir_ = ::mkdtemp(tmpl.data());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static std::string Slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  Result Run(const std::string& args) { return Run_(binary_ + " " + args); }

  // Runs a whole command line (the binary named in it).
  Result Run_(const std::string& command) {
    const std::string out = dir_ + "/stdout", err = dir_ + "/stderr";
    const int status = std::system((command + " >" + out + " 2>" + err).c_str());
    Result r;
    // std::system runs /bin/sh, which reports a child killed by signal N as
    // exit status 128+N.
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
    if (WIFEXITED(status)) {
      r.exit_code = WEXITSTATUS(status);
      if (r.exit_code > 128) r.signal = r.exit_code - 128;
    }
    r.out = Slurp(out);
    r.err = Slurp(err);
    return r;
  }

  std::string Sample() {
    const std::string session = dir_ + "/session";
    const Result r = Run("sample-capture " + session);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return session;
  }

  static std::vector<char> ReadBytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  }
  static void WriteBytes(const std::string& path, const std::vector<char>& bytes, size_t n) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(n));
  }

  std::string binary_, dir_;
};

TEST_F(CaptureCli, SampleSessionSummarisesAsTwoRanksAndVerifies) {
  const std::string session = Sample();
  const Result info = Run("info --json " + session);
  ASSERT_EQ(info.exit_code, 0) << info.err;
  const nlohmann::json j = nlohmann::json::parse(info.out);
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["truncated"], false);
  EXPECT_EQ(j["steps"], 4);
  EXPECT_EQ(j["ranks"], 2);
  EXPECT_EQ(j["files"].size(), 2u);
  // Each rank: 4 steps share one KV blob and add one hidden-state blob.
  EXPECT_EQ(j["blobs"], 10);
  EXPECT_EQ(j["records"], j["files"][0]["records"].get<int>() + j["files"][1]["records"].get<int>());
  EXPECT_EQ(j["bytes"], std::filesystem::file_size(session + "/rank-00000.crcap") +
                            std::filesystem::file_size(session + "/rank-00001.crcap"));
  // The step log: its bytes in the file, and decoded (at least as many).
  const nlohmann::json& f0 = j["files"][0];
  EXPECT_GT(f0["step_stored_bytes"].get<uint64_t>(), 0u);
  EXPECT_GE(f0["step_raw_bytes"].get<uint64_t>(), f0["step_stored_bytes"].get<uint64_t>());
  EXPECT_LT(f0["step_stored_bytes"].get<uint64_t>(), f0["bytes"].get<uint64_t>());
  const Result verify = Run("verify " + session);
  EXPECT_EQ(verify.exit_code, 0) << verify.err;
  const Result text = Run("info " + session + "/rank-00001.crcap");
  EXPECT_EQ(text.exit_code, 0);
  EXPECT_NE(text.out.find("closed cleanly (ok)"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("step log "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("x compressed)"), std::string::npos) << text.out;
}

TEST_F(CaptureCli, SampleCaptureIsDeterministic) {
  const std::string a = Sample();
  const Result r = Run("sample-capture " + dir_ + "/again");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(ReadBytes(a + "/rank-00000.crcap"), ReadBytes(dir_ + "/again/rank-00000.crcap"));
  EXPECT_EQ(Run("sample-capture " + a).exit_code, 2);  // refuses to overwrite without --force
}

TEST_F(CaptureCli, ReplayOfAnotherEnginesCaptureNamesSettingsItCannotTakeAndAsksForTheModel) {
  // sample-capture's manifest is sglang-like: attention_backend=flashinfer,
  // kv_cache_dtype=auto, no checkpoint path.
  const std::string session = Sample();
  const Result r = Run("replay " + session);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("note: crashreplay-sample recorded attention_backend = flashinfer"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("replaying with attention_backend = reference; choose with --set attention_backend="),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("kv_cache_dtype = auto"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("records no checkpoint path (engine crashreplay-sample); give the checkpoint with --model"),
            std::string::npos)
      << r.err;
  // Recorded values our table has are taken without a note.
  EXPECT_EQ(r.err.find("mem_fraction_static"), std::string::npos) << r.err;
}

TEST_F(CaptureCli, TruncatedCapturesNeverCrashAndGetTheRightExitCodes) {
  const std::string file = Sample() + "/rank-00000.crcap";
  const std::vector<char> bytes = ReadBytes(file);
  auto full = CaptureReader::Open(file);
  ASSERT_TRUE(full.ok());
  std::set<size_t> boundaries = {kFileHeaderSize};
  std::set<size_t> cuts;
  for (const RecordInfo& r : (*full)->records()) {
    const size_t end = r.offset + kFrameHeaderSize + r.payload_size;
    boundaries.insert(end);
    for (size_t c : {end - 1, end, end + 1, static_cast<size_t>(r.offset + 7)}) cuts.insert(c);
  }
  for (size_t c = 0; c < bytes.size(); c += 211) cuts.insert(c);
  const std::string cut_path = dir_ + "/cut.crcap";
  for (size_t cut : cuts) {
    if (cut > bytes.size()) continue;
    SCOPED_TRACE("cut at " + std::to_string(cut));
    WriteBytes(cut_path, bytes, cut);
    const Result info = Run("info --json " + cut_path);
    const Result verify = Run("verify " + cut_path);
    ASSERT_EQ(info.signal, 0);
    ASSERT_EQ(verify.signal, 0);
    if (cut < kFileHeaderSize) {
      EXPECT_EQ(info.exit_code, 3) << info.err;
      EXPECT_EQ(verify.exit_code, 3);
      continue;
    }
    ASSERT_EQ(info.exit_code, 0) << info.err;
    const bool boundary = boundaries.contains(cut);
    const nlohmann::json j = nlohmann::json::parse(info.out);
    EXPECT_EQ(j["truncated"], !boundary);
    EXPECT_EQ(j["ok"], cut == bytes.size());
    EXPECT_EQ(verify.exit_code, boundary ? 0 : 3) << verify.err;
    if (!boundary) {
      EXPECT_NE(verify.err.find("first bad record is #"), std::string::npos) << verify.err;
    }
  }
}

TEST_F(CaptureCli, BitFlippedCapturesNeverCrashAndFailVerify) {
  const std::string file = Sample() + "/rank-00001.crcap";
  const std::vector<char> bytes = ReadBytes(file);
  const std::string bad = dir_ + "/flip.crcap";
  for (size_t i = 0; i < bytes.size(); i += 53) {
    SCOPED_TRACE("flip at byte " + std::to_string(i));
    std::vector<char> m = bytes;
    m[i] = static_cast<char>(m[i] ^ (1 << (i % 8)));
    WriteBytes(bad, m, m.size());
    const Result info = Run("info " + bad);
    const Result verify = Run("verify " + bad);
    ASSERT_EQ(info.signal, 0);
    ASSERT_EQ(verify.signal, 0);
    EXPECT_TRUE(info.exit_code == 0 || info.exit_code == 3) << info.exit_code;
    EXPECT_EQ(verify.exit_code, 3) << verify.out;
    EXPECT_NE(verify.err.find("byte offset"), std::string::npos) << verify.err;
  }
}

TEST_F(CaptureCli, WhatIsNotARegularFileIsRefusedAtOnceWithExitThree) {
  const std::string fifo = dir_ + "/rank-00000.crcap";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string folder = dir_ + "/folder.crcap";
  std::filesystem::create_directories(folder + "/empty");
  for (const std::string& path : {fifo, std::string("/dev/zero"), std::string("/dev/null")}) {
    SCOPED_TRACE(path);
    // `timeout` ends a reader that waits on the FIFO (exit 124): a failure here.
    for (const std::string cmd : {"info ", "verify ", "replay "}) {
      const Result r = Run_("timeout 20 " + binary_ + " " + cmd + path);
      EXPECT_EQ(r.exit_code, 3) << cmd << r.err;
      EXPECT_NE(r.err.find("not a regular file"), std::string::npos) << cmd << r.err;
    }
  }
  // A session directory whose rank file is a FIFO.
  const Result session = Run_("timeout 20 " + binary_ + " info " + dir_);
  EXPECT_EQ(session.exit_code, 3) << session.err;
}

TEST_F(CaptureCli, ReplayOfACaptureCutInsideItsFirstStepNamesTheCut) {
  const std::string file = Sample() + "/rank-00000.crcap";
  const std::vector<char> bytes = ReadBytes(file);
  auto full = CaptureReader::Open(file);
  ASSERT_TRUE(full.ok());
  size_t cut = 0;
  for (const RecordInfo& r : (*full)->records()) {
    if (r.type == static_cast<uint16_t>(RecordType::kStep)) {
      cut = r.offset + kFrameHeaderSize + r.payload_size / 2;
      break;
    }
  }
  ASSERT_GT(cut, 0u);
  const std::string cut_path = dir_ + "/cut.crcap";
  WriteBytes(cut_path, bytes, cut);
  const Result r = Run("replay " + cut_path);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("holds no complete step"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("stops at byte"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("--step -1"), std::string::npos) << r.err;
}

TEST_F(CaptureCli, UsageErrorsExitTwoAndMissingFilesExitThree) {
  EXPECT_EQ(Run("verify").exit_code, 2);
  EXPECT_EQ(Run("info --no-such-flag x").exit_code, 2);
  EXPECT_EQ(Run("sample-capture").exit_code, 2);
  const Result help = Run("info --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--json"), std::string::npos);
  const Result missing = Run("verify " + dir_ + "/nope.crcap");
  EXPECT_EQ(missing.exit_code, 3);
  EXPECT_NE(missing.err.find("does not exist"), std::string::npos) << missing.err;
}

TEST_F(CaptureCli, NewerMajorVersionExitsThreeSayingSo) {
  const std::string session = Sample();
  const std::string file = session + "/rank-00000.crcap";
  std::vector<char> bytes = ReadBytes(file);
  std::vector<unsigned char> header(bytes.begin(), bytes.begin() + kFileHeaderSize);
  StoreLE16(header.data() + 8, kCaptureMajorVersion + 1);
  StoreLE64(header.data() + 24, XXH64Of(header.data(), 24));
  std::copy(header.begin(), header.end(), bytes.begin());
  WriteBytes(file, bytes, bytes.size());
  for (const char* cmd : {"info ", "verify "}) {
    const Result r = Run(cmd + file);
    EXPECT_EQ(r.exit_code, 3) << cmd;
    EXPECT_NE(r.err.find("newer than this crashreplay reads"), std::string::npos) << r.err;
  }
}

// A snapshot whose blob is damaged (the frame checksum still holds, so only
// decoding finds it) is not used: replay warns naming the snapshot, its step
// and the tensor, re-executes from step 0 and still reproduces the step.
TEST_F(CaptureCli, ACorruptSnapshotFallsBackToReExecutionWithAWarning) {
  ASSERT_EQ(Run("make-model " + dir_ + "/m --arch llama --quant bf16").exit_code, 0);
  ASSERT_EQ(Run("run " + dir_ + "/m --prompt 'Say hello' --max-new-tokens 4 --record " + dir_ + "/cap").exit_code, 0);
  Result good = Run("replay " + dir_ + "/cap --step 3 --json");
  ASSERT_EQ(good.exit_code, 0) << good.err;
  const nlohmann::json g = nlohmann::json::parse(good.out);
  EXPECT_EQ(g["start"], "snapshot");

  const std::string file = dir_ + "/cap/rank-00000.crcap";
  ASSERT_TRUE(testing::CorruptSnapshotBlob(file, 3, "kv.v"));
  Result r = Run("replay " + dir_ + "/cap --step 3 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["outcome"], "reproduced");
  EXPECT_EQ(j["start"], "re-executed");
  EXPECT_EQ(j["digest"], g["digest"]);
  const std::string note = j["start_note"];
  EXPECT_NE(note.find("snapshot of step 3"), std::string::npos) << note;
  EXPECT_NE(note.find("'kv.v'"), std::string::npos) << note;
  EXPECT_NE(r.err.find("warning"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(file), std::string::npos) << r.err;
  // Other steps' snapshots are intact.
  EXPECT_EQ(nlohmann::json::parse(Run("replay " + dir_ + "/cap --step 2 --json").out)["start"], "snapshot");
}

// A capture whose page-table rows are deltas (the default) replays every
// step to the digests of one written with whole rows (--page-table-deltas
// off), and both reproduce.
TEST_F(CaptureCli, PageTableDeltasReplayToTheDigestsOfWholeRows) {
  ASSERT_EQ(Run("make-model " + dir_ + "/m --arch llama --quant bf16").exit_code, 0);
  const std::string run = "run " + dir_ + "/m --prompt 'Say hello to the recorder' --max-new-tokens 6 --record ";
  ASSERT_EQ(Run(run + dir_ + "/deltas").exit_code, 0);
  ASSERT_EQ(Run(run + dir_ + "/whole --page-table-deltas off").exit_code, 0);
  auto read = [&](const std::string& d) { return CaptureReader::Open(d + "/rank-00000.crcap"); };
  auto deltas = read(dir_ + "/deltas");
  auto whole = read(dir_ + "/whole");
  ASSERT_TRUE(deltas.ok() && whole.ok());
  int delta_frames = 0, whole_frames = 0;
  for (const RecordInfo& r : (*deltas)->records()) delta_frames += (r.flags & kFrameFlagPageDeltas) != 0;
  for (const RecordInfo& r : (*whole)->records()) whole_frames += (r.flags & kFrameFlagPageDeltas) != 0;
  EXPECT_GT(delta_frames, 0);  // decode steps (a one-page row is whole again every few steps)
  EXPECT_EQ(whole_frames, 0);
  ASSERT_EQ((*deltas)->steps().size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ((*deltas)->steps()[i].page_table, (*whole)->steps()[i].page_table);
  for (int step = 0; step < 6; ++step) {
    for (const char* start : {"", " --from-start"}) {
      Result a = Run("replay " + dir_ + "/deltas --step " + std::to_string(step) + start + " --json");
      Result b = Run("replay " + dir_ + "/whole --step " + std::to_string(step) + start + " --json");
      ASSERT_EQ(a.exit_code, 0) << a.err;
      ASSERT_EQ(b.exit_code, 0) << b.err;
      const nlohmann::json ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
      EXPECT_EQ(ja["outcome"], "reproduced") << "step " << step << start;
      EXPECT_EQ(ja["digest"], jb["digest"]) << "step " << step << start;
    }
  }
  Result bad = Run(run + dir_ + "/x --page-table-deltas maybe");
  EXPECT_NE(bad.exit_code, 0);
}

TEST_F(CaptureCli, RunSaysWhenTheLastStepsStateIsOverTheSnapshotBudgetAndWhatBudgetKeepsIt) {
  // A 1 KB budget cannot hold the last decode step's KV pages: run says so,
  // names a budget that would keep them, and the replay of that step then
  // re-executes the steps before it. With the budget named, run says
  // nothing and the step replays from its snapshot.
  ASSERT_EQ(Run("make-model " + dir_ + "/m --arch llama --quant bf16").exit_code, 0);
  const std::string run = "run " + dir_ + "/m --prompt 'Say hello to the recorder' --max-new-tokens 4 --record ";
  Result small = Run(run + dir_ + "/small --snapshot-budget 1K");
  ASSERT_EQ(small.exit_code, 0) << small.err;
  const size_t at = small.err.find("step 3's state (");
  ASSERT_NE(at, std::string::npos) << small.err;
  EXPECT_NE(small.err.find("is over --snapshot-budget", at), std::string::npos) << small.err;
  const size_t end = small.err.find(" keeps it", at);
  const size_t flag = small.err.rfind("--snapshot-budget ", end);
  ASSERT_TRUE(end != std::string::npos && flag != std::string::npos && flag > at) << small.err;
  const std::string budget = small.err.substr(flag + 18, end - flag - 18);
  ASSERT_FALSE(budget.empty());
  ASSERT_EQ(budget.back(), 'M') << budget;

  Result kept = Run(run + dir_ + "/kept --snapshot-budget " + budget);
  ASSERT_EQ(kept.exit_code, 0) << kept.err;
  EXPECT_EQ(kept.err.find("is over --snapshot-budget"), std::string::npos) << kept.err;
  for (const std::string d : {"/small", "/kept"}) {
    Result r = Run("replay " + dir_ + d + " --step 3 --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["outcome"], "reproduced") << d;
    EXPECT_EQ(j.contains("re_executed"), d == "/small") << d;
  }
}

}  // namespace
}  // namespace crashreplay
