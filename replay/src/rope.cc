// RoPE frequency tables for the scaling variants in HF transformers'
// modeling_rope_utils: default, linear, llama3 and yarn.
#include <algorithm>
#include <cmath>

#include "crashreplay/replay/model.h"

namespace crashreplay::replay {
namespace {

double YarnMscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

double CorrectionDim(double rotations, double dim, double base, double max_pos) {
  return dim * std::log(max_pos / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
}

}  // namespace

RopeTable ComputeRope(const RopeSpec& rope, int64_t head_dim, double partial_rotary_factor) {
  RopeTable t;
  t.used = rope;
  t.rotary_dim = static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
  t.rotary_dim -= t.rotary_dim % 2;
  const int64_t half = t.rotary_dim / 2;
  const double dim = static_cast<double>(t.rotary_dim);
  std::vector<double> f(half);
  for (int64_t i = 0; i < half; ++i) f[i] = 1.0 / std::pow(rope.theta, 2.0 * i / dim);
  if (rope.type == "linear") {
    for (auto& x : f) x /= rope.factor;
  } else if (rope.type == "llama3") {
    const double orig = static_cast<double>(rope.original_max_position);
    const double low_wavelen = orig / rope.low_freq_factor, high_wavelen = orig / rope.high_freq_factor;
    for (auto& x : f) {
      const double wavelen = 2.0 * M_PI / x;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        x /= rope.factor;
        continue;
      }
      const double smooth = (orig / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
      x = (1.0 - smooth) * x / rope.factor + smooth * x;
    }
  } else if (rope.type == "yarn") {
    const double orig = static_cast<double>(rope.original_max_position);
    double low = std::floor(CorrectionDim(rope.beta_fast, dim, rope.theta, orig));
    double high = std::ceil(CorrectionDim(rope.beta_slow, dim, rope.theta, orig));
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1);
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double extrapolation = f[i], interpolation = f[i] / rope.factor;
      const double keep = 1.0 - ramp;  // share of the unscaled frequency
      f[i] = interpolation * (1.0 - keep) + extrapolation * keep;
    }
    double attention = rope.attention_factor;
    if (attention == 0.0) {
      attention = (rope.mscale != 0.0 && rope.mscale_all_dim != 0.0)
                      ? YarnMscale(rope.factor, rope.mscale) / YarnMscale(rope.factor, rope.mscale_all_dim)
                      : YarnMscale(rope.factor, 1.0);
    }
    t.mscale = static_cast<float>(attention);
  }
  t.inv_freq.resize(half);
  for (int64_t i = 0; i < half; ++i) t.inv_freq[i] = static_cast<float>(f[i]);
  return t;
}

}  // namespace crashreplay::replay
