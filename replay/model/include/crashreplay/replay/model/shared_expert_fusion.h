// sglang's shared-experts fusion as a load-time precondition.
//
// With fusion on (sglang's default for DeepSeek-style MoE unless
// --disable-shared-experts-fusion), the loader copies the shared expert's
// tensors into one more slot of the routed experts' stacked weights, so they
// must be stored exactly like a routed expert's: same dtype, same stored
// shape. A ModelOpt NVFP4 checkpoint whose exclude list keeps the shared
// expert in bf16 ([I, H] bf16 against packed e2m1 [I, H/2] bytes) cannot be
// fused; sglang fails loading with torch's "The size of tensor a (3072) must
// match the size of tensor b (6144) at non-singleton dimension 1".
//
// What is modelled is the check over the real weights; after it passes, the
// replay still runs the shared expert as its own kernel (the fused kernel's
// summation order is not modelled; docs/engines.md).
#pragma once

#include <optional>

#include "crashreplay/replay/config/fault.h"
#include "crashreplay/replay/model/model.h"

namespace crashreplay::replay {

// The first shared expert tensor whose storage differs from the routed
// experts', as a load-stage fault; nullopt when every layer can be fused (or
// has no shared expert).
std::optional<Fault> CheckSharedExpertFusion(const Model& model);

}  // namespace crashreplay::replay
