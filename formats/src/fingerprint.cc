#include "crashreplay/formats/fingerprint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_format.h"
#include "crashreplay/formats/hash.h"
#include "crashreplay/formats/numeric.h"

namespace crashreplay {
namespace {

template <typename T>
T Load(const unsigned char* p, uint64_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

// Element i of a dense buffer as fp64 (integers exactly up to 2^53).
double ElementAt(DType t, const unsigned char* p, uint64_t i) {
  switch (t) {
    case DType::kBool: return p[i] != 0 ? 1.0 : 0.0;
    case DType::kU8: return p[i];
    case DType::kI8: return static_cast<int8_t>(p[i]);
    case DType::kI16: return Load<int16_t>(p, i);
    case DType::kU16: return Load<uint16_t>(p, i);
    case DType::kI32: return Load<int32_t>(p, i);
    case DType::kU32: return Load<uint32_t>(p, i);
    case DType::kI64: return static_cast<double>(Load<int64_t>(p, i));
    case DType::kU64: return static_cast<double>(Load<uint64_t>(p, i));
    case DType::kF16: return Fp16ToFloat(Load<uint16_t>(p, i));
    case DType::kBF16: return Bf16ToFloat(Load<uint16_t>(p, i));
    case DType::kF32: return Load<float>(p, i);
    case DType::kF64: return Load<double>(p, i);
    case DType::kF8E4M3: return E4m3ToFloat(p[i]);
    case DType::kF8E5M2: return E5m2ToFloat(p[i]);
    case DType::kF8E8M0:
    case DType::kF4E2M1: break;
  }
  return 0.0;
}

bool HasValues(DType t) { return t != DType::kF8E8M0 && t != DType::kF4E2M1; }

double Rms(const Fingerprint& f) {
  const uint64_t finite = f.numel - f.nonfinite();
  return finite > 0 ? std::sqrt(f.sum_squares / static_cast<double>(finite)) : 0.0;
}

double Mean(const Fingerprint& f) {
  const uint64_t finite = f.numel - f.nonfinite();
  return finite > 0 ? f.sum / static_cast<double>(finite) : 0.0;
}

std::string NonFiniteText(const Fingerprint& f) {
  std::string s;
  auto add = [&s](uint64_t n, const char* what) {
    if (n == 0) return;
    s += absl::StrFormat("%s%d %s", s.empty() ? "" : ", ", n, what);
  };
  add(f.nan, "NaN");
  add(f.pos_inf, "+Inf");
  add(f.neg_inf, "-Inf");
  if (f.first_nonfinite_token >= 0) {
    s += absl::StrFormat(" (first at token %d, column %d)", f.first_nonfinite_token, f.first_nonfinite_column);
  }
  return s;
}

// The running summary of a float tensor. Sums run in kLanes interleaved
// lanes (element i in lane i % kLanes), combined pairwise at the end: a fixed
// order, so the same bits on every host, and independent chains the CPU
// overlaps (one chain of fp64 adds in element order cost ~1.3 ns an
// element). min, max and max |x| do not depend on the order.
constexpr int kLanes = 8;

struct Lanes {
  double sum[kLanes] = {};
  double sq[kLanes] = {};
  double lo[kLanes], hi[kLanes], abs_max[kLanes] = {};
  bool any = false;
  Lanes() {
    for (int j = 0; j < kLanes; ++j) {
      lo[j] = std::numeric_limits<double>::infinity();
      hi[j] = -std::numeric_limits<double>::infinity();
    }
  }
};

double Combine(const double (&v)[kLanes]) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// Accumulates v (finite) at element index i into its lane.
inline void AddFinite(Lanes& a, uint64_t i, double v) {
  const int lane = static_cast<int>(i % kLanes);
  a.sum[lane] += v;
  a.sq[lane] += v * v;
  a.lo[lane] = std::min(a.lo[lane], v);
  a.hi[lane] = std::max(a.hi[lane], v);
  a.abs_max[lane] = std::max(a.abs_max[lane], std::fabs(v));
  a.any = true;
}

void AddNonFinite(Fingerprint& f, uint64_t i, double v) {
  if (std::isnan(v)) {
    f.nan += 1;
  } else if (v > 0) {
    f.pos_inf += 1;
  } else {
    f.neg_inf += 1;
  }
  if (f.first_nonfinite_token < 0) {
    f.first_nonfinite_token = static_cast<int64_t>(i / f.columns);
    f.first_nonfinite_column = static_cast<int64_t>(i % f.columns);
  }
}

// One typed pass: `decode(i)` is element i as fp64. Whole blocks of kLanes
// finite elements take the branch-free path; a block with a non-finite
// element goes element by element.
template <typename Decode>
void Accumulate(Fingerprint& f, uint64_t numel, Decode decode) {
  Lanes a;
  uint64_t i = 0;
  for (; i + kLanes <= numel; i += kLanes) {
    double v[kLanes];
    bool finite = true;
    for (int j = 0; j < kLanes; ++j) {
      v[j] = decode(i + j);
      finite &= std::isfinite(v[j]);
    }
    if (finite) {
      for (int j = 0; j < kLanes; ++j) {
        a.sum[j] += v[j];
        a.sq[j] += v[j] * v[j];
        a.lo[j] = std::min(a.lo[j], v[j]);
        a.hi[j] = std::max(a.hi[j], v[j]);
        a.abs_max[j] = std::max(a.abs_max[j], std::fabs(v[j]));
      }
      a.any = true;
      continue;
    }
    for (int j = 0; j < kLanes; ++j) {
      if (std::isfinite(v[j])) {
        AddFinite(a, i + j, v[j]);
      } else {
        AddNonFinite(f, i + j, v[j]);
      }
    }
  }
  for (; i < numel; ++i) {
    const double v = decode(i);
    if (std::isfinite(v)) {
      AddFinite(a, i, v);
    } else {
      AddNonFinite(f, i, v);
    }
  }
  if (!a.any) return;
  f.min = *std::min_element(a.lo, a.lo + kLanes);
  f.max = *std::max_element(a.hi, a.hi + kLanes);
  f.max_abs = *std::max_element(a.abs_max, a.abs_max + kLanes);
  f.sum = Combine(a.sum);
  f.sum_squares = Combine(a.sq);
}

template <typename T, typename Convert>
void AccumulateAs(Fingerprint& f, const unsigned char* p, uint64_t numel, Convert convert) {
  Accumulate(f, numel, [p, convert](uint64_t i) { return static_cast<double>(convert(Load<T>(p, i))); });
}

}  // namespace

Fingerprint SummarizeTensor(std::string_view name, DType dtype, const void* data, uint64_t numel, uint64_t columns,
                            bool hash) {
  Fingerprint f;
  f.name = std::string(name);
  f.dtype = std::string(DTypeName(dtype));
  f.numel = numel;
  f.columns = columns > 0 ? columns : 1;
  f.is_int = !IsFloat(dtype) && HasValues(dtype);
  const auto* p = static_cast<const unsigned char*>(data);
  if (hash) f.content_hash = XXH128Of(p, DTypeBytes(dtype, numel));
  auto same = [](auto v) { return v; };
  switch (dtype) {
    case DType::kF32: AccumulateAs<float>(f, p, numel, same); break;
    case DType::kBF16: AccumulateAs<uint16_t>(f, p, numel, [](uint16_t h) { return Bf16ToFloat(h); }); break;
    case DType::kF16: AccumulateAs<uint16_t>(f, p, numel, [](uint16_t h) { return Fp16ToFloat(h); }); break;
    case DType::kF64: AccumulateAs<double>(f, p, numel, same); break;
    case DType::kI32: AccumulateAs<int32_t>(f, p, numel, same); break;
    case DType::kI64: AccumulateAs<int64_t>(f, p, numel, same); break;
    case DType::kF8E8M0:
    case DType::kF4E2M1: break;
    default: Accumulate(f, numel, [dtype, p](uint64_t i) { return ElementAt(dtype, p, i); }); break;
  }
  return f;
}

double FingerprintTolerance(std::string_view dtype) {
  if (dtype == "F32" || dtype == "F64") return 1e-2;
  if (dtype == "F16") return 2e-2;
  if (dtype == "F8_E4M3" || dtype == "F8_E5M2") return 0.25;
  return 6e-2;
}

std::optional<std::string> FingerprintDeparts(const Fingerprint& e, const Fingerprint& r) {
  if (e.numel != r.numel) {
    return absl::StrFormat("the engine's tensor has %d elements, the reference's %d", e.numel, r.numel);
  }
  const bool e_bad = e.nonfinite() > 0, r_bad = r.nonfinite() > 0;
  if (e_bad && !r_bad) {
    return absl::StrFormat("the engine has %s where the reference is finite (max |x| %.6g)", NonFiniteText(e),
                           r.max_abs);
  }
  if (r_bad && !e_bad) {
    return absl::StrFormat("the reference has %s where the engine is finite (max |x| %.6g)", NonFiniteText(r),
                           e.max_abs);
  }
  if (e_bad && r_bad) return std::nullopt;
  if (e.is_int || r.is_int) {
    if (e.numel > 0 && (e.min < r.min || e.max > r.max)) {
      return absl::StrFormat("the engine's values span [%.0f, %.0f], outside the reference's [%.0f, %.0f]", e.min,
                             e.max, r.min, r.max);
    }
    return std::nullopt;
  }
  const double tol = FingerprintTolerance(e.dtype);
  const double r_rms = Rms(r), e_rms = Rms(e);
  // A floor for all-zero references: the smallest normal float's scale.
  const double scale = std::max(r_rms, 1e-30);
  if (std::fabs(e.max_abs - r.max_abs) > tol * std::max(r.max_abs, scale)) {
    return absl::StrFormat("max |x| %.6g against the reference's %.6g (tolerance %.3g relative)", e.max_abs,
                           r.max_abs, tol);
  }
  if (std::fabs(e_rms - r_rms) > tol * scale) {
    return absl::StrFormat("root mean square %.6g against the reference's %.6g (tolerance %.3g relative)", e_rms,
                           r_rms, tol);
  }
  if (std::fabs(Mean(e) - Mean(r)) > tol * scale) {
    return absl::StrFormat("mean %.6g against the reference's %.6g (tolerance %.3g of its rms %.6g)", Mean(e), Mean(r),
                           tol, r_rms);
  }
  return std::nullopt;
}

std::string FingerprintText(const Fingerprint& f) {
  std::string s = absl::StrFormat("%s %d elements", f.dtype, f.numel);
  if (f.nonfinite() > 0) s += ", " + NonFiniteText(f);
  if (f.is_int) return s + absl::StrFormat(", values in [%.0f, %.0f]", f.min, f.max);
  return s + absl::StrFormat(", max |x| %.6g, rms %.6g, mean %.6g", f.max_abs, Rms(f), Mean(f));
}

}  // namespace crashreplay
