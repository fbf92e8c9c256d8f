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

// Two lanes in one vector (GCC/Clang vector extensions: SSE2 on x86-64,
// NEON on aarch64, plain code elsewhere), four vectors for the eight lanes:
// lane j is vector j / 2, element j % 2, the same lanes as scalar code.
typedef double D2 __attribute__((vector_size(16)));
typedef int64_t I2 __attribute__((vector_size(16)));
constexpr int kVecs = kLanes / 2;

struct Lanes {
  D2 sum[kVecs] = {};
  D2 sq[kVecs] = {};
  D2 lo[kVecs], hi[kVecs], abs_max[kVecs] = {};
  bool any = false;
  Lanes() {
    const double inf = std::numeric_limits<double>::infinity();
    for (int k = 0; k < kVecs; ++k) {
      lo[k] = D2{inf, inf};
      hi[k] = D2{-inf, -inf};
    }
  }
};

double Combine(const D2 (&v)[kVecs]) {
  return ((v[0][0] + v[0][1]) + (v[1][0] + v[1][1])) + ((v[2][0] + v[2][1]) + (v[3][0] + v[3][1]));
}

inline D2 Abs(D2 x) { return reinterpret_cast<D2>(reinterpret_cast<I2>(x) & I2{INT64_MAX, INT64_MAX}); }

// Accumulates v (finite) at element index i into its lane.
inline void AddFinite(Lanes& a, uint64_t i, double v) {
  const int k = static_cast<int>(i % kLanes) / 2, e = static_cast<int>(i % 2);
  a.sum[k][e] += v;
  a.sq[k][e] += v * v;
  a.lo[k][e] = std::min(static_cast<double>(a.lo[k][e]), v);
  a.hi[k][e] = std::max(static_cast<double>(a.hi[k][e]), v);
  a.abs_max[k][e] = std::max(static_cast<double>(a.abs_max[k][e]), std::fabs(v));
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
    for (int j = 0; j < kLanes; ++j) v[j] = decode(i + j);
    D2 x[kVecs];
    for (int k = 0; k < kVecs; ++k) x[k] = D2{v[2 * k], v[2 * k + 1]};
    // x - x is 0 for a finite x and NaN for NaN and +-Inf.
    const D2 z = ((x[0] - x[0]) + (x[1] - x[1])) + ((x[2] - x[2]) + (x[3] - x[3]));
    if (z[0] == 0 && z[1] == 0) {
      for (int k = 0; k < kVecs; ++k) {
        a.sum[k] += x[k];
        a.sq[k] += x[k] * x[k];
        a.lo[k] = x[k] < a.lo[k] ? x[k] : a.lo[k];  // std::min's choice
        a.hi[k] = a.hi[k] < x[k] ? x[k] : a.hi[k];  // std::max's choice
        const D2 m = Abs(x[k]);
        a.abs_max[k] = a.abs_max[k] < m ? m : a.abs_max[k];
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
  f.min = f.max = f.max_abs = 0;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo, abs_max = 0;
  for (int k = 0; k < kVecs; ++k) {
    for (int e = 0; e < 2; ++e) {
      lo = std::min(lo, static_cast<double>(a.lo[k][e]));
      hi = std::max(hi, static_cast<double>(a.hi[k][e]));
      abs_max = std::max(abs_max, static_cast<double>(a.abs_max[k][e]));
    }
  }
  f.min = lo;
  f.max = hi;
  f.max_abs = abs_max;
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
    return absl::StrFormat("max |x| %.6g against the reference's %.6g (tolerance %.3g relative)", e.max_abs, r.max_abs,
                           tol);
  }
  if (std::fabs(e_rms - r_rms) > tol * scale) {
    return absl::StrFormat("root mean square %.6g against the reference's %.6g (tolerance %.3g relative)", e_rms, r_rms,
                           tol);
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
