// The GPU's own account of a failure: the core dump the recorder armed
// (capture/coredump_arming.h), read with formats/coredump, shown by `info`
// and `replay` beside the failed step, and the faulting library kernel
// matched to the exact engine's op that does its job (docs/capture.md, "GPU
// core dumps", has the table; it is in gpu_fault.cc).
//
// Which dump: the one the failure record names (the recorder found it
// whole when it wrote the failure); else, when the manifest says dumps were
// armed, the armed name for the recorded pid, found beside the capture now
// (the driver finished it after the failure record, or a signal path wrote
// the failure). A dump that does not read whole is shown as incomplete,
// with the reader's reason, and no fault is taken from it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "crashreplay/formats/capture_records.h"

namespace crashreplay::tools {

// A library kernel's job in the exact engine.
struct KernelJob {
  std::string pattern;   // what matched in the kernel's name
  std::string op;        // the exact engine's op ("attention", "experts", ...)
  std::string kernels;   // its kernels' labels in the replay ("L*.attention"), as --dump-kernels takes them
  std::string boundary;  // where it runs ("L*.attention": every layer's)
};
// First row of the table whose pattern the (demangled) name contains,
// case-insensitively; nullopt when none does.
std::optional<KernelJob> MatchKernelJob(std::string_view kernel_name);

struct GpuFault {
  std::string capture;  // the rank file it belongs to
  std::string path;     // the dump
  std::string how;   // "named by the failure record" / "found beside the capture ..."
  bool complete = false;
  std::string problem;              // why it is not complete, or could not be read
  std::vector<std::string> faults;  // one line per fault (exception, kernel, device/SM/warp, block/thread, pc offset)
  std::string kernel;  // the first fault's kernel (demangled), empty when unknown
  std::optional<KernelJob> job;

  // Text lines (no indent): the dump, its faults, and the kernel's job.
  std::vector<std::string> Lines() const;
  nlohmann::json ToJson() const;
};

// The dump of this capture's failure, or nullopt when none was armed or
// none is there. `capture_path` is the rank file.
std::optional<GpuFault> FindGpuFault(const std::string& capture_path, const SessionManifest& manifest,
                                     const FailureRecord* failure);

}  // namespace crashreplay::tools
