#include "crashreplay/formats/capture_records.h"

namespace crashreplay {

const char* ForwardModeName(ForwardMode m) {
  switch (m) {
    case ForwardMode::kUnknown: return "unknown";
    case ForwardMode::kPrefill: return "prefill";
    case ForwardMode::kDecode: return "decode";
    case ForwardMode::kExtend: return "extend";
    case ForwardMode::kMixed: return "mixed";
    case ForwardMode::kIdle: return "idle";
  }
  return "unknown";
}

const char* FailureClassName(FailureClass c) {
  switch (c) {
    case FailureClass::kUnknown: return "unknown";
    case FailureClass::kDeviceAssert: return "device-assert";
    case FailureClass::kOutOfMemory: return "out-of-memory";
    case FailureClass::kNonFinite: return "non-finite";
    case FailureClass::kOutputMismatch: return "output-mismatch";
    case FailureClass::kTimeout: return "timeout";
    case FailureClass::kCrash: return "crash";
    case FailureClass::kException: return "exception";
  }
  return "unknown";
}

}  // namespace crashreplay
