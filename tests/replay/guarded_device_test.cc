// The device path of the one lowering, on a machine without a GPU: a recorded
// run replayed on GuardedDeviceExecutor (not host-visible, so weights are
// uploaded and every buffer is read back through copies, as on CUDA; its
// memory is inaccessible outside launches and copies) has the recorded bits
// after every kernel. Host code that reads device memory directly faults here
// instead of on the first GPU it meets (the DSA indexer's lowering did, on an
// H200). The configurations are the GPU parity test's.
#include <gtest/gtest.h>

#include "exec_replay_test_util.h"
#include "guarded_executor.h"

namespace crashreplay::replay {
namespace {

using testing::GuardedDeviceExecutor;
using testing::RecordRun;
using testing::ReplayOnExecutor;

using Case = testing::ConfigCase;

class GuardedDevice : public ::testing::TestWithParam<Case> {};

TEST_P(GuardedDevice, EveryKernelHasTheRecordedBits) {
  const Case& c = GetParam();
  MakeModelOptions o;
  o.arch = c.arch;
  o.quant = c.quant;
  auto run = RecordRun(o, c.sets, 3, c.temperature);
  ASSERT_TRUE(run.engine);
  ASSERT_FALSE(run.result.fault) << run.result.fault->message;
  GuardedDeviceExecutor dev(2);
  // The smallest pool the steps fit in: a launch opens all of the guarded
  // memory, which costs in proportion to its touched pages.
  const int64_t pages = testing::UsedPages(run);
  auto rep = ReplayOnExecutor(run, &dev, /*watch=*/true, pages);
  ASSERT_TRUE(rep.status.ok()) << rep.status;
  // The weights live in the executor's memory, not the host model's.
  ASSERT_TRUE(dev.Owns(rep.model->embed().data));
  testing::ExpectRecordedBits(run, rep);
  // Watcher off: nothing is read back between kernels; same step bits.
  GuardedDeviceExecutor quiet(1);
  auto q = ReplayOnExecutor(run, &quiet, /*watch=*/false, pages);
  ASSERT_TRUE(q.status.ok()) << q.status;
  EXPECT_EQ(q.step_digests, rep.step_digests);
}

INSTANTIATE_TEST_SUITE_P(Configs, GuardedDevice, ::testing::ValuesIn(testing::DeviceParityCases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace crashreplay::replay
