// Failure signatures from what engines really print. The CUDA strings are
// the runtime's own (data/cuda_error_strings.txt, printed by
// cudaGetErrorString); the rest are the messages PyTorch, sglang, vLLM and
// NCCL print, as they appear in their sources and in bug reports.
#include "crashreplay/bisect/failure_text.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "crashreplay/bisect/trial.h"
#include "test_util.h"

namespace crashreplay::bisect {
namespace {

std::string DataFile(const std::string& name) { return testing::SourcePath(__FILE__, "data/" + name); }

FailureSignature Sig(std::string_view text) {
  auto s = SignatureFromOutput(text);
  EXPECT_TRUE(s.has_value()) << text;
  return s.value_or(FailureSignature{});
}

// A message and what it must be named: its class and its check.
struct Named {
  std::string text;
  FailureClass failure_class;
  std::string check;
};

void ExpectNamed(const std::vector<Named>& cases) {
  for (const Named& c : cases) {
    const FailureSignature s = Sig(c.text);
    EXPECT_EQ(s.failure_class, c.failure_class) << c.text;
    EXPECT_EQ(s.check, c.check) << c.text;
  }
}

TEST(FailureText, EveryCudaRuntimeErrorStringNamesItsError) {
  std::ifstream in(DataFile("cuda_error_strings.txt"));
  ASSERT_TRUE(in) << DataFile("cuda_error_strings.txt");
  int lines = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    ++lines;
    // "700 cudaErrorIllegalAddress | an illegal memory access was encountered"
    const size_t sp = line.find(' '), bar = line.find(" | ");
    const std::string name = line.substr(sp + 1, bar - sp - 1);
    const std::string text = line.substr(bar + 3);
    // PyTorch's form (c10/cuda/CUDAException) and Triton's.
    for (const std::string& msg :
         {"torch.AcceleratorError: CUDA error: " + text + "\n", "RuntimeError: Triton Error [CUDA]: " + text + "\n"}) {
      const FailureSignature s = Sig(msg);
      if (name == "cudaErrorAssert") {
        EXPECT_EQ(s.failure_class, FailureClass::kDeviceAssert) << msg;
      } else if (name == "cudaErrorNoKernelImageForDevice") {
        // No code for this GPU: the kernel's architecture support, its own class.
        EXPECT_EQ(s.failure_class, FailureClass::kUnsupportedArch) << msg;
        EXPECT_EQ(s.check, name) << msg;
      } else if (name == "cudaErrorMemoryAllocation") {
        EXPECT_EQ(s.failure_class, FailureClass::kOom) << msg;
        EXPECT_EQ(s.check, "cuda");
      } else {
        EXPECT_EQ(s.failure_class, FailureClass::kCudaError) << msg;
        EXPECT_EQ(s.check, name) << msg;
      }
    }
  }
  EXPECT_EQ(lines, 18);
}

TEST(FailureText, TorchDeviceAssertNamesTheKernelAndTheAssertion) {
  const FailureSignature s =
      Sig("/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:111: operator(): block: [0,0,0], thread: [0,0,0] "
          "Assertion `-sizes[i] <= index && index < sizes[i] && \"index out of bounds\"` failed.\n"
          "/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:111: operator(): block: [0,0,0], thread: [1,0,0] "
          "Assertion `-sizes[i] <= index && index < sizes[i] && \"index out of bounds\"` failed.\n"
          "Traceback (most recent call last):\n"
          "  File \"/srv/train.py\", line 173, in <module>\n"
          "    main()\n"
          "torch.AcceleratorError: CUDA error: device-side assert triggered\n"
          "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might "
          "be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n");
  EXPECT_EQ(s.failure_class, FailureClass::kDeviceAssert);
  EXPECT_EQ(s.kernel, "IndexKernel.cu:111");
  EXPECT_EQ(s.check, "-sizes[i] <= index && index < sizes[i] && \"index out of bounds\"");
  // A wrapped assert line (the loss kernel prints its name on its own line).
  const FailureSignature loss =
      Sig("torch.AcceleratorError: CUDA error: device-side assert triggered\n"
          "/pytorch/aten/src/ATen/native/cuda/Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: \n"
          "block: [0,0,0], thread: [0,0,0] Assertion `t >= 0 && t < n_classes` failed.\n");
  EXPECT_EQ(loss.kernel, "Loss.cu:245");
  EXPECT_EQ(loss.check, "t >= 0 && t < n_classes");
  EXPECT_FALSE(SameBug(s, loss));
  // Without the assert line, still a device assert.
  EXPECT_EQ(Sig("RuntimeError: CUDA error: device-side assert triggered\n").failure_class, FailureClass::kDeviceAssert);
}

TEST(FailureText, OutOfMemoryFormsAreOomAndTellDeviceKvPoolAndHostApart) {
  const FailureClass oom = FailureClass::kOom;
  ExpectNamed({
      {"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.22 GiB. GPU 0 has a total capacity of "
       "15.77 GiB of which 959.44 MiB is free. Process 12447 has 14.83 GiB memory in use.",
       oom, "cuda"},
      {"RuntimeError: CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total capacity; 130.35 MiB "
       "already allocated; 47.06 MiB free; 188.00 MiB reserved in total by PyTorch)",
       oom, "cuda"},
      {"torch.cuda.OutOfMemoryError: CUDA out of memory.", oom, "cuda"},
      {"RuntimeError: CUDA error: out of memory", oom, "cuda"},
      {"RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", oom, "cuda"},
      {"RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
       "Current value: mem_fraction_static=0.1",
       oom, "kv_cache"},
      {"ValueError: No available memory for the cache blocks. Try increasing "
       "`gpu_memory_utilization` when initializing the engine.",
       oom, "kv_cache"},
      {"terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc", oom, "host"},
      {"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nMemoryError", oom, "host"},
      {"OSError: [Errno 12] Cannot allocate memory", oom, "host"},
  });
}

TEST(FailureText, SglangGraphCaptureFailureIsInTheGraphCaptureStage) {
  const FailureSignature s =
      Sig("[2025-06-01 10:00:00 TP0] Capture cuda graph begin. This can take up to several minutes.\n"
          "[2025-06-01 10:00:03 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
          "  File \"/sgl-workspace/sglang/python/sglang/srt/model_executor/cuda_graph_runner.py\", line 380, in "
          "capture\n"
          "    ) = self.capture_one_batch_size(bs, forward)\n"
          "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
          "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
          "Possible solutions:\n1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n");
  EXPECT_EQ(s.failure_class, FailureClass::kOom);
  EXPECT_EQ(s.stage, FailureStage::kGraphCapture);
  // The same OOM at decode ("Capture cuda graph begin/end" are only logs).
  const FailureSignature decode =
      Sig("[TP0] Capture cuda graph begin. This can take up to several minutes.\n[TP0] Capture cuda graph end.\n"
          "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n");
  EXPECT_EQ(decode.stage, FailureStage::kUnknown);
  EXPECT_FALSE(SameBug(s, decode));
}

TEST(FailureText, TheFirstCudaFailureWinsOverItsConsequences) {
  // An illegal address on one rank, then NCCL fails on the others and a
  // Python exception ends the process: the illegal address is the bug.
  const FailureSignature s = Sig(
      "[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
      "[rank1]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
      "ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\n"
      "[rank1]: ncclUnhandledCudaError: Call to CUDA function failed.\n");
  EXPECT_EQ(s.failure_class, FailureClass::kCudaError);
  EXPECT_EQ(s.check, "cudaErrorIllegalAddress");
  EXPECT_NE(s.detail.find("illegal memory access"), std::string::npos);
}

TEST(FailureText, NcclErrorsAreNamedByTheirResult) {
  const std::string remote =
      "[rank1]: torch.distributed.DistBackendError: NCCL error in: /tmp/torch/csrc/distributed/c10d/"
      "NCCLUtils.cpp:77, remote process exited or there was a network error, NCCL version 2.26.2\n"
      "[rank1]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
      "prematurely.\n";
  const std::string internal =
      "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1249, "
      "internal error - please report this issue to the NCCL developers, NCCL version 2.18.5\n"
      "ncclInternalError: Internal check failed.\nLast error:\nBootstrap : no socket interface found\n";
  const FailureClass nccl = FailureClass::kNcclError;
  ExpectNamed({
      {remote, nccl, "ncclRemoteError"},
      {internal, nccl, "ncclInternalError"},
      {"[E ProcessGroupNCCL.cpp:828] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
       "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600039 milliseconds before timing out.\n",
       nccl, "watchdog_timeout"},
  });
  EXPECT_FALSE(SameBug(Sig(remote), Sig(internal)));
}

TEST(FailureText, NonFiniteMessages) {
  const FailureClass non_finite = FailureClass::kNonFinite;
  ExpectNamed({
      {"RuntimeError: probability tensor contains either `inf`, `nan` or element < 0\n", non_finite, "probabilities"},
      {"[TP0] Detected errors during sampling! NaN in the logits.\n"
       "ValueError: Detected errors during sampling! NaN in the logits.\n",
       non_finite, "logits"},
      {"RuntimeError: Function 'MulBackward0' returned nan values in its 0th output.", non_finite, "autograd"},
  });
}

TEST(FailureText, PythonExceptionTypeOfTheLastTracebackLine) {
  const FailureSignature key =
      Sig("INFO starting\nTraceback (most recent call last):\n  File \"serve.py\", line 3, in <module>\n"
          "    raise KeyError(\"attention_backend\")\nKeyError: 'attention_backend'\n");
  EXPECT_EQ(key.failure_class, FailureClass::kException);
  EXPECT_EQ(key.check, "KeyError");
  EXPECT_EQ(key.detail, "KeyError: 'attention_backend'");
  // Chained: the last traceback's exception ends the process.
  const FailureSignature chained =
      Sig("Traceback (most recent call last):\n  File \"a.py\", line 2, in f\n    x = d[k]\n           ~^^^\n"
          "KeyError: 'k'\n\nDuring handling of the above exception, another exception occurred:\n\n"
          "Traceback (most recent call last):\n  File \"a.py\", line 4, in <module>\n    f()\n"
          "sglang.srt.errors.SchedulerError: request 7 could not be scheduled\n");
  EXPECT_EQ(chained.check, "sglang.srt.errors.SchedulerError");
  // torchrun prefixes every line of a rank.
  const FailureSignature ranked =
      Sig("[rank1]: Traceback (most recent call last):\n[rank1]:   File \"t.py\", line 9, in <module>\n"
          "[rank1]:     run()\n[rank1]: AssertionError\n");
  EXPECT_EQ(ranked.check, "AssertionError");
  EXPECT_FALSE(SameBug(key, chained));
}

TEST(FailureText, UnrecognisedOutputNamesNothing) {
  EXPECT_FALSE(SignatureFromOutput("").has_value());
  EXPECT_FALSE(SignatureFromOutput("loading weights\nserver ready\nshutting down\n").has_value());
  EXPECT_FALSE(SignatureFromOutput("Traceback (most recent call last):\n  File \"x.py\"\n").has_value());
  // A CUDA error text not in the table is its own kind, named by its text.
  const FailureSignature other = Sig("RuntimeError: CUDA error: operation not supported\n");
  EXPECT_EQ(other.failure_class, FailureClass::kCudaError);
  EXPECT_EQ(other.check, "operation not supported");
}

TEST(FailureText, UserPatternsComeFirstAndTheirGroupIsTheCheck) {
  auto rules = FailureTextRules::Create({"ENGINE_FAULT code=([A-Z_]+)", "watchdog"});
  ASSERT_TRUE(rules.ok()) << rules.status();
  auto s = rules->Match("RuntimeError: CUDA error: misaligned address\nENGINE_FAULT code=PAGE_OOB at step 7\n");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->failure_class, FailureClass::kOther);
  EXPECT_EQ(s->check, "PAGE_OOB");
  auto whole = rules->Match("the watchdog fired\n");
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->check, "watchdog");
  // No user match: the built-in rules.
  EXPECT_EQ(rules->Match("RuntimeError: CUDA error: misaligned address\n")->check, "cudaErrorMisalignedAddress");
  auto bad = FailureTextRules::Create({"([unclosed"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.status().message()).find("([unclosed"), std::string::npos);
}

TEST(FailureText, PrintableTextEscapesWhatCannotBePrinted) {
  EXPECT_EQ(PrintableText("plain\ttext\n"), "plain\ttext\n");
  EXPECT_EQ(PrintableText(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(PrintableText("caf\xC3\xA9"), "caf\xC3\xA9");      // valid UTF-8 stays
  EXPECT_EQ(PrintableText("bad\xFF\xC3"), "bad\\xFF\\xC3");    // invalid bytes are escaped
  EXPECT_EQ(PrintableText("\xED\xA0\x80"), "\\xED\\xA0\\x80");  // a UTF-16 surrogate is not UTF-8
  EXPECT_EQ(PrintableText("\x1B[31m"), "\\x1B[31m");
}

ProcessResult Exited(int code, std::string err = "") {
  ProcessResult p;
  p.started = true;
  p.exited = true;
  p.exit_code = code;
  p.stderr_tail = err;
  p.stderr_bytes = err.size();
  return p;
}

TEST(FailureText, ExitCodesAndSignalsAreDifferentBugsWhenNothingElseNamesThem) {
  const TrialResult three = ClassifyProcess(Exited(3), {}, std::nullopt);
  const TrialResult seven = ClassifyProcess(Exited(7), {}, std::nullopt);
  EXPECT_EQ(three.signature.check, "exit 3");
  EXPECT_FALSE(SameBug(three.signature, seven.signature));
  ProcessResult segv;
  segv.started = true;
  segv.term_signal = 11;
  ProcessResult abrt = segv;
  abrt.term_signal = 6;
  EXPECT_FALSE(
      SameBug(ClassifyProcess(segv, {}, std::nullopt).signature, ClassifyProcess(abrt, {}, std::nullopt).signature));
  // A shell's 128+11 is the same bug as a death by SIGSEGV.
  EXPECT_TRUE(SameBug(ClassifyProcess(Exited(139), {}, std::nullopt).signature,
                      ClassifyProcess(segv, {}, std::nullopt).signature));
  // What it printed names it, whatever the exit code.
  const TrialResult oom = ClassifyProcess(Exited(1, "torch.OutOfMemoryError: CUDA out of memory.\n"), {}, std::nullopt);
  const TrialResult oom_abort =
      ClassifyProcess(Exited(134, "torch.OutOfMemoryError: CUDA out of memory.\n"), {}, std::nullopt);
  EXPECT_EQ(oom.signature.failure_class, FailureClass::kOom);
  EXPECT_TRUE(SameBug(oom.signature, oom_abort.signature));
  const TrialResult assert_ =
      ClassifyProcess(Exited(1, "RuntimeError: CUDA error: device-side assert triggered\n"), {}, std::nullopt);
  EXPECT_FALSE(SameBug(oom.signature, assert_.signature));
}

TEST(FailureText, TheFirstErrorIsFoundWhenStderrOverflowsTheTail) {
  // The assert printed first, then 200 KiB of noise: the head keeps it.
  ProcessResult p = Exited(1);
  p.stderr_head = "RuntimeError: CUDA error: an illegal memory access was encountered\n" + std::string(1000, 'x');
  p.stderr_tail = std::string(1000, 'y') + "\nShutting down\n";
  p.stderr_bytes = 200 << 10;
  EXPECT_EQ(ClassifyProcess(p, {}, std::nullopt).signature.check, "cudaErrorIllegalAddress");
  EXPECT_NE(KeptStderr(p).find("bytes ...]"), std::string::npos);
}

}  // namespace
}  // namespace crashreplay::bisect
