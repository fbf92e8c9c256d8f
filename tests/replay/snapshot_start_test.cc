// Starting a replay from a state snapshot: the built-in engine's recorder
// snapshots each step's KV pages before the step; replay restores them and
// runs only the target step. Both starts give bitwise-identical step and
// kernel outputs, for a clean and for a failing capture; a snapshot that
// does not fit the step or the engine is refused naming the step; a corrupt
// snapshot blob is a DataLoss naming the file, the step and the tensor.
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "crashreplay/replay/captures/capture_io.h"
#include "crashreplay/replay/session/backends.h"
#include "crashreplay/replay/session/step_state.h"
#include "engine_test_util.h"
#include "exec_replay_test_util.h"
#include "snapshot_test_util.h"

namespace crashreplay::replay {
namespace {

using testing::MakeEngine;
using testing::TwoRequests;

MakeModelOptions Glm() {
  MakeModelOptions o;
  o.arch = "glm4_moe";
  o.quant = "nvfp4";
  return o;
}

class SnapshotStart : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() / ("snapshot_start_" + std::to_string(::getpid()) + "_" +
                                                      ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs two requests under `sets` with the capture recorder (keeping
  // `keep` snapshots) and loads the capture back.
  LoadedCapture RecordCapture(const std::vector<std::string>& sets, uint32_t keep, int64_t max_new = 4) {
    auto e = MakeEngine(model_, sets);
    Config c = Config::Defaults();
    for (const std::string& s : sets) EXPECT_TRUE(c.ApplySetFlag(s).ok());
    SnapshotOptions so;
    so.steps = keep;
    auto rec = CaptureRecorder::Begin(dir_, dir_ + "/no-checkpoint", c, e->model(), so);
    EXPECT_TRUE(rec.ok()) << rec.status();
    const RunResult r = e->Run(TwoRequests(max_new), rec->get());
    EXPECT_TRUE((*rec)->Finish(r.fault).ok());
    auto cap = LoadCapture(dir_);
    EXPECT_TRUE(cap.ok()) << cap.status();
    return std::move(*cap);
  }

  // Replays `step` both ways on fresh engines and demands the same bits.
  void ExpectBothStartsAgree(const LoadedCapture& cap, const std::vector<std::string>& sets, int64_t step) {
    auto full = MakeEngine(model_, sets);
    const ReplayReport a = ReplayStep(*full, cap.steps, step);
    EXPECT_EQ(a.start, "re-executed");

    auto fresh = MakeEngine(model_, sets);
    auto state = LoadStepState(cap, step);
    ASSERT_TRUE(state.ok()) << state.status();
    ASSERT_TRUE(fresh->RestoreState(*state, cap.steps[step].input).ok());
    ReplayOptions o;
    o.state_restored = true;
    const ReplayReport b = ReplayStep(*fresh, cap.steps, step, o);
    EXPECT_EQ(b.start, "snapshot");
    EXPECT_EQ(b.snapshot_step, step);

    EXPECT_EQ(a.outcome, b.outcome) << "step " << step << ": " << a.detail << " / " << b.detail;
    EXPECT_EQ(a.digest, b.digest) << "step " << step;
    ASSERT_EQ(a.kernels.size(), b.kernels.size()) << "step " << step;
    for (size_t k = 0; k < a.kernels.size(); ++k) {
      EXPECT_EQ(a.kernels[k].label, b.kernels[k].label);
      EXPECT_EQ(a.kernels[k].digest, b.kernels[k].digest) << "step " << step << " " << a.kernels[k].label;
      EXPECT_EQ(a.kernels[k].failed, b.kernels[k].failed);
    }
    EXPECT_EQ(a.fault.has_value(), b.fault.has_value());
    if (a.fault && b.fault) {
      EXPECT_EQ(a.fault->Signature(), b.fault->Signature());
    }
  }

  std::string dir_;
  MakeModelOptions model_ = Glm();
};

TEST_F(SnapshotStart, EveryKeptStepReplaysTheSameBitsFromItsSnapshot) {
  const LoadedCapture cap = RecordCapture({}, 16);
  ASSERT_EQ(cap.steps.size(), 4u);
  ASSERT_EQ(cap.snapshots.size(), 4u);  // written at the clean close
  for (int64_t step = 0; step < 4; ++step) {
    ExpectBothStartsAgree(cap, {}, step);
    auto e = MakeEngine(Glm(), {});
    auto state = LoadStepState(cap, step);
    ASSERT_TRUE(state.ok());
    // Decode steps read earlier tokens' pages; the prefill reads none.
    EXPECT_EQ(state->pages.empty(), step == 0) << "step " << step;
  }
}

// GLM-5's layout: the snapshot holds the latent pages (FlashMLA's fp8
// layout here) and the index-key pages of the layers that run an indexer.
TEST_F(SnapshotStart, MlaLatentAndIndexKeyPagesReplayTheSameBits) {
  model_.arch = "glm_moe_dsa";
  model_.layers = 3;
  model_.index_pattern = "FSF";
  model_.index_topk = 64;
  const std::vector<std::string> sets = {"kv_cache_dtype=fp8_e4m3", "index_cache_dtype=fp8_e4m3", "page_size=64",
                                         "dsa_decode=tiled64"};
  const LoadedCapture cap = RecordCapture(sets, 16);
  ASSERT_EQ(cap.steps.size(), 4u);
  auto state = LoadStepState(cap, 2);
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->pools.size(), 2u);
  EXPECT_EQ(state->pools[0].name, "latent");
  EXPECT_EQ(state->pools[0].dtype, DType::kU8);
  const std::vector<int64_t> latent = {3, static_cast<int64_t>(state->pages.size()), 64, 656};
  EXPECT_EQ(state->pools[0].shape, latent);  // 3 layers x tp 1, 656 bytes a token
  EXPECT_EQ(state->pools[1].name, "index_k");
  const std::vector<int64_t> index = {2, static_cast<int64_t>(state->pages.size()), 64 * (64 + 4)};
  EXPECT_EQ(state->pools[1].shape, index);  // the two 'F' layers: e4m3 keys then fp32 scales
  for (int64_t step = 0; step < 4; ++step) ExpectBothStartsAgree(cap, sets, step);
  // A GQA engine's cache does not take it.
  model_ = Glm();
  auto gqa = MakeEngine(model_, {});
  const absl::Status s = gqa->RestoreState(*state, cap.steps[2].input);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("kv.latent, kv.index_k"), std::string::npos) << s;
}

// Every rank holds the whole latent and index keys, so at tp 2 a snapshot
// keeps one plane per layer (rank 0's) when the ranks agree: half the bytes,
// the same bits from either start. The full form (every plane, as captures
// before this were written) restores as well.
TEST_F(SnapshotStart, ReplicatedMlaPlanesAreKeptOncePerLayerAtTp2) {
  model_.arch = "glm_moe_dsa";
  model_.layers = 2;
  model_.index_topk = 64;
  const std::vector<std::string> sets = {"tp_size=2", "page_size=64"};
  const LoadedCapture cap = RecordCapture(sets, 16);
  ASSERT_EQ(cap.steps.size(), 4u);
  auto state = LoadStepState(cap, 3);
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->pools.size(), 2u);
  const int64_t n = static_cast<int64_t>(state->pages.size());
  EXPECT_EQ(state->pools[0].shape[0], 2);  // 2 layers, not 2 x tp 2 planes
  EXPECT_EQ(state->pools[0].shape[1], n);
  EXPECT_EQ(state->pools[1].shape[0], 2);
  for (int64_t step = 0; step < 4; ++step) ExpectBothStartsAgree(cap, sets, step);

  // The full form: each plane twice.
  StepState full = *state;
  for (StatePool& p : full.pools) {
    const size_t plane = p.bytes.size() / static_cast<size_t>(p.shape[0]);
    std::vector<uint8_t> bytes;
    for (int64_t g = 0; g < p.shape[0]; ++g) {
      for (int r = 0; r < 2; ++r)
        bytes.insert(bytes.end(), p.bytes.begin() + g * plane, p.bytes.begin() + (g + 1) * plane);
    }
    p.bytes = std::move(bytes);
    p.shape[0] *= 2;
  }
  auto a = MakeEngine(model_, sets);
  ASSERT_TRUE(a->RestoreState(full, cap.steps[3].input).ok());
  ReplayOptions o;
  o.state_restored = true;
  const ReplayReport from_full = ReplayStep(*a, cap.steps, 3, o);
  auto b = MakeEngine(model_, sets);
  ASSERT_TRUE(b->RestoreState(*state, cap.steps[3].input).ok());
  const ReplayReport from_grouped = ReplayStep(*b, cap.steps, 3, o);
  EXPECT_EQ(from_full.outcome, "reproduced");
  EXPECT_EQ(from_full.digest, from_grouped.digest);

  // Ranks that disagree keep every plane, so the snapshot shows it.
  auto exec = MakeExecutor("cpu", ExecMode::kKernelByKernel, 1);
  ASSERT_TRUE(exec.ok());
  auto kv = KvCache::Create(a->model(), a->config(), testing::EnginePages(*a), exec->get());
  ASSERT_TRUE(kv.ok()) << kv.status();
  StepState diverged = full;
  const size_t plane = diverged.pools[0].bytes.size() / 4;
  diverged.pools[0].bytes[plane + 7] ^= 0x40;  // layer 0, rank 1
  std::vector<std::vector<uint8_t>> pools;
  for (const StatePool& p : diverged.pools) pools.push_back(p.bytes);
  ASSERT_TRUE((*kv)->WritePages(diverged.pages, pools).ok());
  auto again = CaptureState(cap.steps[3].input, **kv);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->pools[0].shape[0], 4);  // every plane
  EXPECT_EQ(again->pools[0].bytes, diverged.pools[0].bytes);
  EXPECT_EQ(again->pools[1].shape[0], 2);  // the index keys still agree
}

TEST_F(SnapshotStart, TheRingKeepsTheLastSteps) {
  const LoadedCapture cap = RecordCapture({}, 2, 6);
  ASSERT_EQ(cap.steps.size(), 6u);
  // The ring is bounded and never makes a step wait: while the encoder is
  // busy with one snapshot, a new one evicts the staged one before it, so
  // which earlier step is held depends on timing (4 or 3). What holds: at
  // most 2, the last step always, a step not held is NotFound, and a held
  // step replays from its snapshot to the re-executed bits.
  ASSERT_GE(cap.snapshots.size(), 1u);
  ASSERT_LE(cap.snapshots.size(), 2u);
  ASSERT_TRUE(cap.snapshots.contains(5));
  for (int64_t step = 0; step < 6; ++step) {
    if (!cap.snapshots.contains(step)) {
      EXPECT_EQ(LoadStepState(cap, step).status().code(), absl::StatusCode::kNotFound) << step;
    }
  }
  ExpectBothStartsAgree(cap, {}, cap.snapshots.rbegin()->first);
}

TEST_F(SnapshotStart, AFailingCaptureReplaysItsFailingStepTheSameFromTheSnapshot) {
  const std::vector<std::string> bad = {"attention_backend=paged64"};
  const LoadedCapture cap = RecordCapture(bad, 4);
  ASSERT_EQ(cap.steps.size(), 2u);
  ASSERT_EQ(cap.failure_step, 1);
  ASSERT_TRUE(cap.snapshots.contains(1));  // written by the failure path
  ExpectBothStartsAgree(cap, bad, 1);
  auto e = MakeEngine(Glm(), bad);
  auto state = LoadStepState(cap, 1);
  ASSERT_TRUE(state.ok());
  ASSERT_TRUE(e->RestoreState(*state, cap.steps[1].input).ok());
  ReplayOptions o;
  o.state_restored = true;
  const ReplayReport r = ReplayStep(*e, cap.steps, 1, o);
  EXPECT_EQ(r.outcome, "failed");
  EXPECT_TRUE(r.matches_recorded_failure);
}

TEST_F(SnapshotStart, ASnapshotThatDoesNotFitIsRefusedNamingTheStep) {
  const LoadedCapture cap = RecordCapture({}, 16);
  auto state = LoadStepState(cap, 2);
  ASSERT_TRUE(state.ok());
  // Another step's batch.
  auto e1 = MakeEngine(Glm(), {});
  absl::Status s = e1->RestoreState(*state, cap.steps[3].input);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("snapshot of step 2"), std::string::npos) << s;
  // A cache of another layout (fp8 KV).
  auto e2 = MakeEngine(Glm(), {"kv_cache_dtype=fp8_e4m3"});
  s = e2->RestoreState(*state, cap.steps[2].input);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("F8_E4M3"), std::string::npos) << s;
  // Pages that are not the ones the step reads.
  StepState other = *state;
  other.pages.back() += 1;
  auto e3 = MakeEngine(Glm(), {});
  EXPECT_EQ(e3->RestoreState(other, cap.steps[2].input).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SnapshotStart, ACorruptSnapshotBlobIsDataLossNamingFileStepAndTensor) {
  RecordCapture({}, 16);
  const std::string file = dir_ + "/rank-00000.crcap";
  ASSERT_TRUE(crashreplay::testing::CorruptSnapshotBlob(file, 2, "kv.k"));
  auto cap = LoadCapture(dir_);
  ASSERT_TRUE(cap.ok()) << cap.status();  // the frame checksum still holds
  auto state = LoadStepState(*cap, 2);
  ASSERT_EQ(state.status().code(), absl::StatusCode::kDataLoss) << state.status();
  const std::string m(state.status().message());
  EXPECT_NE(m.find(file), std::string::npos) << m;
  EXPECT_NE(m.find("snapshot of step 2"), std::string::npos) << m;
  EXPECT_NE(m.find("'kv.k'"), std::string::npos) << m;
  EXPECT_TRUE(LoadStepState(*cap, 3).ok());  // other steps are intact
}

TEST(StatePages, ThePagesHoldingEachRowsEarlierPositions) {
  StepInput in;
  StepRow a, b;
  a.start_pos = 17;  // positions 0..16: pages 0 and 1 of its table
  a.page_table = {5, 2, 9};
  b.start_pos = 16;  // positions 0..15: page 0 only
  b.page_table = {7, 3};
  in.rows = {a, b};
  EXPECT_EQ(StatePages(in, 16), (std::vector<int32_t>{2, 5, 7}));
  in.rows[0].start_pos = 0;
  in.rows[1].start_pos = 0;
  EXPECT_TRUE(StatePages(in, 16).empty());
}

}  // namespace
}  // namespace crashreplay::replay
