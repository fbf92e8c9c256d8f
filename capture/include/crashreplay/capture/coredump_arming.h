// Arming lightweight GPU core dumps for the recording process, and finding
// the dump the driver wrote (docs/capture.md, "GPU core dumps").
//
// A process whose GPU core dumps are armed writes, when a device exception
// hits (an assert, an illegal address), an ELF file naming the kernel that
// faulted, its block, thread and PC (docs/formats/coredump.md). The driver
// reads the switches at two points:
//   * the environment (CUDA_ENABLE_COREDUMP_ON_EXCEPTION,
//     CUDA_COREDUMP_GENERATION_FLAGS, CUDA_COREDUMP_FILE) when CUDA
//     initialises (cuInit); values set there take permanent precedence;
//   * the driver's attribute API (cuCoredumpSetAttributeGlobal for contexts
//     created later, cuCoredumpSetAttribute for the calling thread's
//     current context) at any time after cuInit.
// So ArmCoredumps picks by whether the driver library is in the process
// yet (dlopen("libcuda.so.1", RTLD_NOLOAD)): not loaded means CUDA cannot
// have initialised, and the environment is set; loaded means it may have,
// and the attribute API is used. The attribute API is reached with dlopen
// and dlsym only: the recorder never links libcuda, and a machine without
// a driver gets a status naming why nothing was armed, never a crash.
//
// What is armed: the lightweight generation flags (no memory, no
// unrelocated images: the dump names the fault, it does not hold the
// model) plus CU_COREDUMP_SKIP_ABORT, so the failing process still returns
// the CUDA error to the engine and the recorder's usual failure path
// (OnFailure) runs instead of an abort() inside the driver.
//
// Thread safety: ArmCoredumps calls setenv, which races with getenv on
// other threads; call it (Recorder::Begin does) before the engine starts
// threads that touch CUDA. FindCoredump is pure apart from reading files.
#pragma once

#include <cstdint>
#include <string>

#include "crashreplay/formats/capture_records.h"

namespace crashreplay::capture {

// CUCoredumpGenerationFlags bits (cuda.h, CUDA 12.5 on).
inline constexpr uint32_t kCoredumpLightweightFlags =
    0x2f;  // skip unrelocated images, global/shared/local/const memory
inline constexpr uint32_t kCoredumpSkipAbort = 0x10;

enum class CoredumpArmMethod {
  kAuto,         // the environment when the driver is not loaded yet, else the attribute API
  kEnvironment,  // the environment only (right only before CUDA initialises)
  kDriverApi,    // the attribute API only
};

struct CoredumpArmRequest {
  // CUDA_COREDUMP_FILE; %p is replaced by the driver with the process id.
  std::string file_pattern;
  uint32_t generation_flags = kCoredumpLightweightFlags | kCoredumpSkipAbort;
  CoredumpArmMethod method = CoredumpArmMethod::kAuto;
  // The driver library dlopen()ed for the attribute API (tests name one
  // that does not exist to take the no-driver path on purpose).
  std::string driver_library = "libcuda.so.1";
};

// Arms dumps for this process. Never fails: the result's mode says what
// happened ("env", "driver_api", or "failed" with the reason).
CoredumpArming ArmCoredumps(const CoredumpArmRequest& request);

// The dump pattern of a capture file: its path without ".crcap", then
// ".%p.cudacore" ("rank-00003.%p.cudacore" beside "rank-00003.crcap").
std::string CoredumpPatternFor(const std::string& capture_path);
// The pattern with %p (and %%) expanded for `pid`; other specifiers the
// recorder does not write are left as they are.
std::string CoredumpPathFor(const std::string& pattern, uint32_t pid);

// The dump the driver wrote for `pid` from `pattern`, as read now.
struct FoundCoredump {
  bool exists = false;
  std::string path;
  uint64_t bytes = 0;
  bool complete = false;  // the coredump reader read it without an error or a truncation note
  std::string note;       // why it is not complete (the reader's message)
};
FoundCoredump FindCoredump(const std::string& pattern, uint32_t pid);

// How many dumps the driver's completion callback has reported in this
// process (0 when no callback could be registered: drivers before 13.2).
uint64_t CoredumpsCompleted();

}  // namespace crashreplay::capture
