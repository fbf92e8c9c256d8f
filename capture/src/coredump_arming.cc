#include "crashreplay/capture/coredump_arming.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "crashreplay/formats/coredump/coredump.h"

namespace crashreplay::capture {
namespace {

// The driver API's types, as cuda.h declares them (CUDA 12.1 on for the
// attribute functions, 13.2 on for the completion callback); declared here
// so that the recorder needs neither cuda.h nor libcuda to build.
using CUresult = int;
using CUcontext = void*;
constexpr int kCuCoredumpEnableOnException = 1;
constexpr int kCuCoredumpTriggerHost = 2;
constexpr int kCuCoredumpLightweight = 3;
constexpr int kCuCoredumpFile = 5;
constexpr int kCuCoredumpGenerationFlags = 7;
using CuInitFn = CUresult (*)(unsigned int);
using CuSetAttrFn = CUresult (*)(int, void*, size_t*);
using CuCtxGetCurrentFn = CUresult (*)(CUcontext*);
using CuGetErrorStringFn = CUresult (*)(CUresult, const char**);
using CuStatusCallback = void (*)(void*, int, int);
using CuRegisterCallbackFn = CUresult (*)(CuStatusCallback, void*, void**);

std::atomic<uint64_t> g_completed{0};

void OnCoredumpComplete(void*, int, int) { g_completed.fetch_add(1); }

// The lightweight flags as the environment spells them (cuda-gdb's
// documentation of CUDA_COREDUMP_GENERATION_FLAGS).
std::string FlagsForEnvironment(uint32_t flags) {
  static constexpr struct {
    uint32_t bit;
    const char* name;
  } kNames[] = {
      {0x01, "skip_nonrelocated_elf_images"},
      {0x02, "skip_global_memory"},
      {0x04, "skip_shared_memory"},
      {0x08, "skip_local_memory"},
      {0x10, "skip_abort"},
      {0x20, "skip_constbank_memory"},
  };
  std::vector<std::string> parts;
  for (const auto& n : kNames)
    if (flags & n.bit) parts.push_back(n.name);
  return absl::StrJoin(parts, ",");
}

CoredumpArming ArmWithEnvironment(const CoredumpArmRequest& req, std::string why) {
  CoredumpArming a;
  a.file_pattern = req.file_pattern;
  a.generation_flags = req.generation_flags;
  std::vector<std::string> replaced;
  auto set = [&](const char* name, const std::string& value) {
    const char* old = std::getenv(name);
    if (old != nullptr && value != old) replaced.push_back(absl::StrCat(name, "=", old));
    return ::setenv(name, value.c_str(), 1) == 0;
  };
  if (!set("CUDA_ENABLE_COREDUMP_ON_EXCEPTION", "1") ||
      !set("CUDA_COREDUMP_GENERATION_FLAGS", FlagsForEnvironment(req.generation_flags)) ||
      !set("CUDA_COREDUMP_FILE", req.file_pattern)) {
    a.mode = "failed";
    a.reason = absl::StrCat("setenv failed: ", std::strerror(errno));
    return a;
  }
  a.mode = "env";
  a.reason = std::move(why);
  if (!replaced.empty()) absl::StrAppend(&a.reason, "; replaced ", absl::StrJoin(replaced, ", "));
  return a;
}

CoredumpArming ArmWithDriverApi(const CoredumpArmRequest& req, std::string why) {
  CoredumpArming a;
  a.file_pattern = req.file_pattern;
  a.generation_flags = req.generation_flags;
  a.mode = "failed";
  // RTLD_LOCAL: the recorder's handle does not make the driver's symbols
  // visible to anything else; the handle is kept (never dlclose'd).
  void* lib = ::dlopen(req.driver_library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = ::dlerror();
    a.reason = absl::StrCat("the CUDA driver (", req.driver_library, ") cannot be loaded: ", err ? err : "unknown",
                            "; no GPU driver, nothing to arm");
    return a;
  }
  auto init = reinterpret_cast<CuInitFn>(::dlsym(lib, "cuInit"));
  auto set_global = reinterpret_cast<CuSetAttrFn>(::dlsym(lib, "cuCoredumpSetAttributeGlobal"));
  auto set_ctx = reinterpret_cast<CuSetAttrFn>(::dlsym(lib, "cuCoredumpSetAttribute"));
  auto get_current = reinterpret_cast<CuCtxGetCurrentFn>(::dlsym(lib, "cuCtxGetCurrent"));
  auto error_string = reinterpret_cast<CuGetErrorStringFn>(::dlsym(lib, "cuGetErrorString"));
  auto register_complete = reinterpret_cast<CuRegisterCallbackFn>(::dlsym(lib, "cuCoredumpRegisterCompleteCallback"));
  if (init == nullptr || set_global == nullptr || set_ctx == nullptr || get_current == nullptr) {
    a.reason = absl::StrCat(req.driver_library,
                            " has no cuCoredumpSetAttributeGlobal/cuCoredumpSetAttribute (the attribute API needs a "
                            "CUDA 12.1 driver or newer)");
    return a;
  }
  auto describe = [&](CUresult r) {
    const char* s = nullptr;
    if (error_string != nullptr && error_string(r, &s) == 0 && s != nullptr) return absl::StrCat(s, " (", r, ")");
    return absl::StrCat("CUresult ", r);
  };
  if (CUresult r = init(0); r != 0) {
    a.reason = absl::StrCat("cuInit failed: ", describe(r));
    return a;
  }
  bool enable = true;
  int flags = static_cast<int>(req.generation_flags);
  std::string file = req.file_pattern;
  std::vector<std::string> notes;
  // One setter for both scopes; the generation flags attribute is 12.5 on,
  // older drivers get the deprecated lightweight and trigger-host bools.
  auto apply = [&](CuSetAttrFn fn, const char* scope) -> bool {
    size_t size = sizeof enable;
    if (CUresult r = fn(kCuCoredumpEnableOnException, &enable, &size); r != 0) {
      notes.push_back(absl::StrCat(scope, ": enabling failed: ", describe(r)));
      return false;
    }
    size = file.size() + 1;
    if (CUresult r = fn(kCuCoredumpFile, file.data(), &size); r != 0) {
      notes.push_back(absl::StrCat(scope, ": the file name was refused: ", describe(r)));
      return false;
    }
    size = sizeof flags;
    if (CUresult r = fn(kCuCoredumpGenerationFlags, &flags, &size); r != 0) {
      bool light = (req.generation_flags & kCoredumpLightweightFlags) == kCoredumpLightweightFlags;
      bool host = (req.generation_flags & kCoredumpSkipAbort) == 0;
      size_t bsize = sizeof light;
      CUresult r2 = fn(kCuCoredumpLightweight, &light, &bsize);
      bsize = sizeof host;
      CUresult r3 = fn(kCuCoredumpTriggerHost, &host, &bsize);
      notes.push_back(absl::StrCat(scope, ": generation flags refused (", describe(r),
                                   "; a driver before 12.5), lightweight and trigger-host set instead: ",
                                   r2 == 0 && r3 == 0 ? "ok" : "refused too"));
    }
    return true;
  };
  if (!apply(set_global, "global")) {
    a.reason = absl::StrJoin(notes, "; ");
    return a;
  }
  CUcontext ctx = nullptr;
  if (get_current(&ctx) == 0 && ctx != nullptr) {
    if (apply(set_ctx, "current context")) {
      notes.push_back("the calling thread's current context armed too");
    }
  } else {
    notes.push_back(
        "no context current on this thread: contexts created from now on are armed; one already made current on "
        "another thread is not");
  }
  if (register_complete != nullptr) {
    void* handle = nullptr;
    if (register_complete(&OnCoredumpComplete, nullptr, &handle) == 0) {
      a.completion_callback = true;
    }
  }
  a.mode = "driver_api";
  a.reason = why;
  if (!notes.empty()) absl::StrAppend(&a.reason, "; ", absl::StrJoin(notes, "; "));
  return a;
}

}  // namespace

CoredumpArming ArmCoredumps(const CoredumpArmRequest& req) {
  switch (req.method) {
    case CoredumpArmMethod::kEnvironment: return ArmWithEnvironment(req, "the environment, as asked");
    case CoredumpArmMethod::kDriverApi: return ArmWithDriverApi(req, "the driver's attribute API, as asked");
    case CoredumpArmMethod::kAuto: break;
  }
  // RTLD_NOLOAD: a handle only if the driver is already in the process;
  // never loads it. Not loaded: CUDA has not initialised, and the
  // environment read at cuInit is the switch every driver honours.
  void* loaded = ::dlopen(req.driver_library.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (loaded == nullptr) {
    return ArmWithEnvironment(req, absl::StrCat(req.driver_library, " not loaded yet: CUDA not initialised"));
  }
  ::dlclose(loaded);  // drops only the reference RTLD_NOLOAD took
  return ArmWithDriverApi(req, absl::StrCat(req.driver_library, " already loaded: CUDA may be initialised"));
}

std::string CoredumpPatternFor(const std::string& capture_path) {
  std::string stem = capture_path;
  constexpr std::string_view kExt = ".crcap";
  if (stem.size() > kExt.size() && stem.compare(stem.size() - kExt.size(), kExt.size(), kExt) == 0) {
    stem.resize(stem.size() - kExt.size());
  }
  return stem + ".%p.cudacore";
}

std::string CoredumpPathFor(const std::string& pattern, uint32_t pid) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      if (pattern[i + 1] == 'p') {
        absl::StrAppend(&out, pid);
        ++i;
        continue;
      }
      if (pattern[i + 1] == '%') {
        out += '%';
        ++i;
        continue;
      }
    }
    out += pattern[i];
  }
  return out;
}

FoundCoredump FindCoredump(const std::string& pattern, uint32_t pid) {
  FoundCoredump f;
  f.path = CoredumpPathFor(pattern, pid);
  struct stat st{};
  if (::stat(f.path.c_str(), &st) != 0) return f;
  f.exists = true;
  f.bytes = static_cast<uint64_t>(st.st_size);
  absl::StatusOr<coredump::Coredump> dump = coredump::ReadCoredumpFile(f.path);
  if (!dump.ok()) {
    f.note = std::string(dump.status().message());
    return f;
  }
  for (const std::string& n : dump->notes) {
    if (n.find("truncated") != std::string::npos) {
      f.note = n;
      return f;
    }
  }
  f.complete = true;
  return f;
}

uint64_t CoredumpsCompleted() { return g_completed.load(); }

}  // namespace crashreplay::capture
