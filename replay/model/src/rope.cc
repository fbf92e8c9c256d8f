// RoPE: which settings the engine reads (ChooseRope, the rope_config
// toggle) and the frequency tables for the scaling variants in HF
// transformers' modeling_rope_utils: default, linear, llama3 and yarn.
#include <algorithm>
#include <cmath>

#include "crashreplay/base/text.h"
#include "crashreplay/replay/model/model.h"

namespace crashreplay::replay {
namespace {

using text::Cat;

double YarnMscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

double CorrectionDim(double rotations, double dim, double base, double max_pos) {
  return dim * std::log(max_pos / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
}

}  // namespace

std::string DescribeRope(const RopeSpec& r) {
  std::string out = Cat(r.type, ", theta ", r.theta);
  if (r.type == "linear") out += Cat(", factor ", r.factor);
  if (r.type == "llama3") {
    out += Cat(", factor ", r.factor, ", low/high freq ", r.low_freq_factor, "/", r.high_freq_factor, ", original ",
               r.original_max_position);
  }
  if (r.type == "yarn") {
    out += Cat(", factor ", r.factor, ", original ", r.original_max_position, ", beta ", r.beta_fast, "/", r.beta_slow);
    if (r.attention_factor != 0) out += Cat(", attention_factor ", r.attention_factor);
    if (r.mscale != 0 || r.mscale_all_dim != 0) out += Cat(", mscale ", r.mscale, "/", r.mscale_all_dim);
    if (!r.truncate) out += ", no truncate";
  }
  return out;
}

RopeChoice ChooseRope(const ModelSpec& spec, RopeConfig toggle) {
  RopeChoice c;
  const RopeSpec file = spec.FileRope();
  const bool both = spec.rope_legacy.has_value() && spec.rope_parameters.has_value();
  switch (toggle) {
    case RopeConfig::kCheckpoint:
      c.rope = file;
      if (both && !(*spec.rope_legacy == *spec.rope_parameters)) {
        const bool legacy_won = spec.rope_scaling_wins;
        c.note = Cat("config.json states RoPE twice and the two disagree: rope_parameters says (",
                     DescribeRope(*spec.rope_parameters), "), ", legacy_won ? "rope_scaling" : "rope_theta", " says (",
                     DescribeRope(*spec.rope_legacy), "); using ",
                     legacy_won ? "rope_scaling, which transformers 5 reads over rope_parameters"
                                : "rope_parameters, as transformers 5 does",
                     " (--set rope_config=legacy or rope_config=rope_parameters reads only one)");
      }
      return c;
    case RopeConfig::kLegacy:
      c.from_default = !spec.rope_legacy.has_value();
      c.rope = spec.rope_legacy.value_or(RopeSpec{});
      if (!(c.rope == file)) {
        c.note =
            Cat("rope_config=legacy: the engine reads only rope_theta/rope_scaling and ignores config.json's "
                "rope_parameters (",
                DescribeRope(file), "); RoPE used: ", DescribeRope(c.rope),
                c.from_default ? " (defaults: the file has no rope_theta or rope_scaling)" : "");
      }
      return c;
    case RopeConfig::kRopeParameters:
      c.from_default = !spec.rope_parameters.has_value();
      c.rope = spec.rope_parameters.value_or(RopeSpec{});
      if (!(c.rope == file)) {
        c.note =
            Cat("rope_config=rope_parameters: the engine reads only rope_parameters and ignores config.json's "
                "rope_theta/rope_scaling (",
                DescribeRope(file), "); RoPE used: ", DescribeRope(c.rope),
                c.from_default ? " (defaults: the file has no rope_parameters)" : "");
      }
      return c;
  }
  return c;
}

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
    double low = CorrectionDim(rope.beta_fast, dim, rope.theta, orig);
    double high = CorrectionDim(rope.beta_slow, dim, rope.theta, orig);
    if (rope.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
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
