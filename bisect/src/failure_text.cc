#include "crashreplay/bisect/failure_text.h"

#include <array>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace crashreplay::bisect {
namespace {

constexpr size_t kMaxDetail = 300;
constexpr size_t kMaxCheck = 160;
constexpr size_t kMaxRegexLine = 4096;     // longer lines are cut before a user pattern sees them
constexpr size_t kMaxRegexBytes = 1 << 20;  // user patterns see the first MiB

struct Phrase {
  std::string_view text;
  FailureClass cls;
  std::string_view check;
};

// What CUDA programs print when they fail. The CUDA runtime strings are
// cudaGetErrorString's (CUDA 13; tests/bisect/data/cuda_error_strings.txt
// holds the runtime's own output), the rest are PyTorch's, sglang's and
// vLLM's messages. At one position the first entry wins.
constexpr std::array<Phrase, 44> kPhrases = {{
    {"device-side assert triggered", FailureClass::kDeviceAssert, ""},
    {"cudaErrorAssert", FailureClass::kDeviceAssert, ""},
    // Device memory.
    {"CUDA out of memory", FailureClass::kOom, "cuda"},
    {"OutOfMemoryError", FailureClass::kOom, "cuda"},  // torch.OutOfMemoryError, torch.cuda.OutOfMemoryError
    {"CUDA error: out of memory", FailureClass::kOom, "cuda"},
    {"CUDA driver error: out of memory", FailureClass::kOom, "cuda"},
    {"cudaErrorMemoryAllocation", FailureClass::kOom, "cuda"},
    {"CUBLAS_STATUS_ALLOC_FAILED", FailureClass::kOom, "cuda"},
    {"HIP out of memory", FailureClass::kOom, "cuda"},
    {"[CUDA]: out of memory", FailureClass::kOom, "cuda"},  // Triton: "Triton Error [CUDA]: out of memory"
    // The KV cache pool does not fit what is left after the weights.
    {"Not enough memory. Please try to increase --mem-fraction-static", FailureClass::kOom, "kv_cache"},
    {"No available memory for the cache blocks", FailureClass::kOom, "kv_cache"},
    // Host memory.
    {"std::bad_alloc", FailureClass::kOom, "host"},
    {"MemoryError", FailureClass::kOom, "host"},
    {"Cannot allocate memory", FailureClass::kOom, "host"},
    {"DefaultCPUAllocator: can't allocate memory", FailureClass::kOom, "host"},
    // The CUDA runtime's other sticky and launch errors.
    {"an illegal memory access was encountered", FailureClass::kCudaError, "cudaErrorIllegalAddress"},
    {"cudaErrorIllegalAddress", FailureClass::kCudaError, "cudaErrorIllegalAddress"},
    {"misaligned address", FailureClass::kCudaError, "cudaErrorMisalignedAddress"},
    {"cudaErrorMisalignedAddress", FailureClass::kCudaError, "cudaErrorMisalignedAddress"},
    {"unspecified launch failure", FailureClass::kCudaError, "cudaErrorLaunchFailure"},
    {"cudaErrorLaunchFailure", FailureClass::kCudaError, "cudaErrorLaunchFailure"},
    {"no kernel image is available for execution on the device", FailureClass::kUnsupportedArch,
     "cudaErrorNoKernelImageForDevice"},
    {"cudaErrorNoKernelImageForDevice", FailureClass::kUnsupportedArch, "cudaErrorNoKernelImageForDevice"},
    // Libraries' own host-side refusals (FlashMLA, DeepGEMM, trtllm-gen FMHA).
    {"Unsupported architecture", FailureClass::kUnsupportedArch, "library"},
    {"an illegal instruction was encountered", FailureClass::kCudaError, "cudaErrorIllegalInstruction"},
    {"too many resources requested for launch", FailureClass::kCudaError, "cudaErrorLaunchOutOfResources"},
    {"the launch timed out and was terminated", FailureClass::kCudaError, "cudaErrorLaunchTimeout"},
    {"invalid device function", FailureClass::kCudaError, "cudaErrorInvalidDeviceFunction"},
    {"hardware stack error", FailureClass::kCudaError, "cudaErrorHardwareStackError"},
    {"invalid program counter", FailureClass::kCudaError, "cudaErrorInvalidPc"},
    {"operation not supported on global/shared address space", FailureClass::kCudaError,
     "cudaErrorInvalidAddressSpace"},
    {"uncorrectable ECC error encountered", FailureClass::kCudaError, "cudaErrorECCUncorrectable"},
    {"the provided PTX was compiled with an unsupported toolchain", FailureClass::kCudaError,
     "cudaErrorUnsupportedPtxVersion"},
    {"CUDA driver version is insufficient for CUDA runtime version", FailureClass::kCudaError,
     "cudaErrorInsufficientDriver"},
    {"operation not permitted when stream is capturing", FailureClass::kCudaError, "cudaErrorStreamCaptureUnsupported"},
    {"operation failed due to a previous error during capture", FailureClass::kCudaError,
     "cudaErrorStreamCaptureInvalidated"},
    // NaN/Inf.
    {"probability tensor contains either `inf`, `nan` or element < 0", FailureClass::kNonFinite, "probabilities"},
    {"NaN in the logits", FailureClass::kNonFinite, "logits"},
    // sglang's maybe_detect_nan (SGLANG_ENABLE_NAN_LOGITS_CHECK): "NaN detected! <what>".
    {"NaN detected!", FailureClass::kNonFinite, "logits"},
    {"returned nan values in its", FailureClass::kNonFinite, "autograd"},
    {"returned inf values in its", FailureClass::kNonFinite, "autograd"},
    {"nan or inf in the logits", FailureClass::kNonFinite, "logits"},
    {"contains NaN or Inf", FailureClass::kNonFinite, ""},
}};

struct NcclPhrase {
  std::string_view text;
  std::string_view check;
};

// ncclGetErrorString's descriptions (torch prints "NCCL error in: FILE:LINE,
// <description>, NCCL version X" and then "<ncclResult name>: ...").
constexpr std::array<NcclPhrase, 14> kNcclPhrases = {{
    {"ncclUnhandledCudaError", "ncclUnhandledCudaError"},
    {"ncclSystemError", "ncclSystemError"},
    {"ncclInternalError", "ncclInternalError"},
    {"ncclInvalidArgument", "ncclInvalidArgument"},
    {"ncclInvalidUsage", "ncclInvalidUsage"},
    {"ncclRemoteError", "ncclRemoteError"},
    {"unhandled cuda error", "ncclUnhandledCudaError"},
    {"unhandled system error", "ncclSystemError"},
    {"remote process exited or there was a network error", "ncclRemoteError"},
    {"Watchdog caught collective operation timeout", "watchdog_timeout"},
    {"NCCL operation timed out", "watchdog_timeout"},
    {"NCCL communicator was aborted", "communicator_aborted"},
    {"NCCL error", "nccl"},
    {"NCCL Error", "nccl"},
}};

std::string_view LineAt(std::string_view text, size_t pos) {
  size_t begin = text.rfind('\n', pos);
  begin = begin == std::string_view::npos ? 0 : begin + 1;
  size_t end = text.find('\n', pos);
  if (end == std::string_view::npos) end = text.size();
  return text.substr(begin, end - begin);
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string Bounded(std::string_view s, size_t max) {
  std::string out = PrintableText(Trim(s));
  if (out.size() > max) {
    size_t cut = max - 3;
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;  // whole UTF-8 characters
    out = out.substr(0, cut) + "...";
  }
  return out;
}

// "CUDA error: <text>" not in the table: the text (up to the line's end or a
// sentence end) names the error.
std::string GenericCudaError(std::string_view text, size_t pos) {
  std::string_view rest = text.substr(pos + std::string_view("CUDA error: ").size());
  const size_t end = rest.find_first_of("\n\r");
  rest = rest.substr(0, end == std::string_view::npos ? rest.size() : end);
  return Bounded(rest, 80);
}

// The CUDA assert line, "FILE.cu:LINE: FUNC: block: [x,y,z], thread: [x,y,z]
// Assertion `EXPR` failed.", possibly wrapped: kernel "FILE.cu:LINE" and
// check EXPR. The first one printed names the assert.
bool ParseKernelAssert(std::string_view text, std::string* kernel, std::string* check) {
  size_t at = 0;
  while ((at = text.find("Assertion `", at)) != std::string_view::npos) {
    const size_t expr_begin = at + std::string_view("Assertion `").size();
    const size_t expr_end = text.find("` failed", expr_begin);
    if (expr_end == std::string_view::npos || expr_end - expr_begin > 4096) {
      at = expr_begin;
      continue;
    }
    // The location precedes "block: [" on this line or the one before.
    const size_t window_begin = at > 600 ? at - 600 : 0;
    const std::string_view window = text.substr(window_begin, at - window_begin);
    const size_t block = window.rfind("block: [");
    if (block == std::string_view::npos) {
      at = expr_end;
      continue;
    }
    std::string_view head = window.substr(0, block);
    // The location is the last "PATH:DIGITS:" before it.
    size_t colon = head.size();
    std::string location;
    while (colon > 0) {
      colon = head.rfind(':', colon - 1);
      if (colon == std::string_view::npos || colon == 0) break;
      size_t d = colon;
      while (d > 0 && std::isdigit(static_cast<unsigned char>(head[d - 1]))) --d;
      if (d == colon || d == 0 || head[d - 1] != ':') continue;
      size_t path_begin = d - 1;
      while (path_begin > 0 && !std::isspace(static_cast<unsigned char>(head[path_begin - 1]))) --path_begin;
      std::string_view path = head.substr(path_begin, d - 1 - path_begin);
      const size_t slash = path.rfind('/');
      if (slash != std::string_view::npos) path.remove_prefix(slash + 1);
      if (path.empty()) continue;
      location = absl::StrCat(std::string(path), ":", std::string(head.substr(d, colon - d)));
      break;
    }
    *kernel = Bounded(location, kMaxCheck);
    *check = Bounded(text.substr(expr_begin, expr_end - expr_begin), kMaxCheck);
    return true;
  }
  return false;
}

bool InGraphCapture(std::string_view text) {
  // sglang's message, or a traceback frame in a capture function (sglang's
  // CudaGraphRunner.capture / capture_one_batch_size, vLLM's capture_model).
  return text.find("Capture cuda graph failed") != std::string_view::npos ||
         text.find(", in capture") != std::string_view::npos;
}

// The first known phrase at or after `from` in `text`.
size_t FirstPhrase(std::string_view text, size_t from, const Phrase** hit) {
  size_t best = std::string_view::npos;
  for (const Phrase& p : kPhrases) {
    const size_t pos = text.find(p.text, from);
    if (pos < best) {
      best = pos;
      *hit = &p;
    }
  }
  return best;
}

std::optional<FailureSignature> CudaFailure(std::string_view text) {
  const Phrase* hit = nullptr;
  size_t best = FirstPhrase(text, 0, &hit);
  // An earlier "CUDA error: <text>" whose text is in no table row is a CUDA
  // error of its own kind.
  constexpr std::string_view kCudaError = "CUDA error: ";
  bool generic = false;
  for (size_t g = text.find(kCudaError); g < best; g = text.find(kCudaError, g + 1)) {
    const std::string_view line = LineAt(text, g);
    const Phrase* on_line = nullptr;
    const size_t line_begin = static_cast<size_t>(line.data() - text.data());
    if (FirstPhrase(line, g - line_begin, &on_line) != std::string_view::npos) continue;
    best = g;
    generic = true;
    break;
  }
  if (best == std::string_view::npos) return std::nullopt;
  FailureSignature s;
  if (generic) {
    s.failure_class = FailureClass::kCudaError;
    s.check = GenericCudaError(text, best);
  } else {
    s.failure_class = hit->cls;
    s.check = std::string(hit->check);
  }
  if (s.failure_class == FailureClass::kDeviceAssert) ParseKernelAssert(text, &s.kernel, &s.check);
  if (s.failure_class != FailureClass::kNonFinite && InGraphCapture(text)) s.stage = FailureStage::kGraphCapture;
  s.detail = Bounded(LineAt(text, best), kMaxDetail);
  return s;
}

std::optional<FailureSignature> NcclFailure(std::string_view text) {
  size_t best = std::string_view::npos;
  for (const NcclPhrase& p : kNcclPhrases) {
    const size_t pos = text.find(p.text);
    if (pos < best) best = pos;
  }
  if (best == std::string_view::npos) return std::nullopt;
  // The most specific name anywhere in the output: torch prints the
  // description first and the ncclResult name on a later line.
  FailureSignature s;
  s.failure_class = FailureClass::kNcclError;
  for (const NcclPhrase& p : kNcclPhrases) {
    if (text.find(p.text) != std::string_view::npos) {
      s.check = std::string(p.check);
      break;
    }
  }
  s.detail = Bounded(LineAt(text, best), kMaxDetail);
  return s;
}

bool IsIdentStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsIdent(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// "pkg.mod.TypeName: message" or "TypeName" -> "pkg.mod.TypeName".
std::optional<std::string> ExceptionType(std::string_view line) {
  size_t i = 0;
  while (true) {
    if (i >= line.size() || !IsIdentStart(line[i])) return std::nullopt;
    while (i < line.size() && IsIdent(line[i])) ++i;
    if (i < line.size() && line[i] == '.' && i + 1 < line.size() && IsIdentStart(line[i + 1])) {
      ++i;
      continue;
    }
    break;
  }
  if (i < line.size() && line[i] != ':') return std::nullopt;
  return std::string(line.substr(0, i));
}

std::optional<FailureSignature> PythonException(std::string_view text) {
  constexpr std::string_view kTraceback = "Traceback (most recent call last):";
  const size_t tb = text.rfind(kTraceback);
  if (tb == std::string_view::npos) return std::nullopt;
  const std::string_view tb_line = LineAt(text, tb);
  // torchrun prefixes every line of a rank ("[rank1]: "); a logger prefixes
  // only the first. Strip a prefix the frame lines share.
  const std::string_view prefix = tb_line.substr(0, static_cast<size_t>(text.data() + tb - tb_line.data()));
  size_t pos = text.find('\n', tb);
  while (pos != std::string_view::npos && pos + 1 < text.size()) {
    std::string_view line = LineAt(text, pos + 1);
    pos = text.find('\n', pos + 1);
    if (!prefix.empty() && line.substr(0, prefix.size()) == prefix) line.remove_prefix(prefix.size());
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.front() == ' ' || line.front() == '\t') continue;  // frames, code, ^^^ markers
    const std::optional<std::string> type = ExceptionType(line);
    if (!type) return std::nullopt;
    FailureSignature s;
    s.failure_class = FailureClass::kException;
    s.check = Bounded(*type, kMaxCheck);
    s.detail = Bounded(line, kMaxDetail);
    return s;
  }
  return std::nullopt;
}

// Splits at '\n', giving each line (cut to kMaxRegexLine) to `fn` until it returns true.
template <typename Fn>
bool ForEachLine(std::string_view text, Fn fn) {
  text = text.substr(0, std::min(text.size(), kMaxRegexBytes));
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(begin, std::min(end - begin, kMaxRegexLine));
    if (fn(line)) return true;
    if (end == text.size()) break;
    begin = end + 1;
  }
  return false;
}

// Length of the valid UTF-8 sequence at s[i], or 0.
size_t Utf8Length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  uint32_t cp = 0;
  if ((c & 0xE0) == 0xC0)
    n = 2, cp = c & 0x1F;
  else if ((c & 0xF0) == 0xE0)
    n = 3, cp = c & 0x0F;
  else if ((c & 0xF8) == 0xF0)
    n = 4, cp = c & 0x07;
  else
    return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  const uint32_t min = n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

}  // namespace

std::string PrintableText(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n' || c == '\t' || (c >= 0x20 && c != 0x7F && c < 0x80)) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    const size_t n = c >= 0x80 ? Utf8Length(text, i) : 0;
    if (n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out += absl::StrFormat("\\x%02X", c);
      ++i;
    }
  }
  return out;
}

absl::StatusOr<FailureTextRules> FailureTextRules::Create(const std::vector<std::string>& user_patterns) {
  FailureTextRules r;
  for (const std::string& p : user_patterns) {
    try {
      r.user_.emplace_back(p, std::regex::ECMAScript | std::regex::optimize);
    } catch (const std::regex_error& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("--signature-regex '", PrintableText(p), "' is not a valid regular expression: ", e.what()));
    }
    r.sources_.push_back(p);
  }
  return r;
}

std::optional<FailureSignature> FailureTextRules::Match(std::string_view output) const {
  for (const std::regex& re : user_) {
    std::optional<FailureSignature> found;
    ForEachLine(output, [&](std::string_view line) {
      std::match_results<std::string_view::const_iterator> m;
      bool hit = false;
      try {
        hit = std::regex_search(line.begin(), line.end(), m, re);
      } catch (const std::regex_error&) {
        hit = false;  // too complex for this line (libstdc++ limits): no match
      }
      if (!hit) return false;
      FailureSignature s;
      s.failure_class = FailureClass::kOther;
      const auto& g = m.size() > 1 && m[1].matched ? m[1] : m[0];
      s.check =
          Bounded(line.substr(static_cast<size_t>(g.first - line.begin()), static_cast<size_t>(g.length())), kMaxCheck);
      s.detail = Bounded(line, kMaxDetail);
      found = s;
      return true;
    });
    if (found) return found;
  }
  return SignatureFromOutput(output);
}

std::optional<FailureSignature> SignatureFromOutput(std::string_view output) {
  if (auto s = CudaFailure(output)) return s;
  if (auto s = NcclFailure(output)) return s;
  return PythonException(output);
}

}  // namespace crashreplay::bisect
