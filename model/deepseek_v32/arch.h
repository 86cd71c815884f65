// The deepseek_v32 registry entry (DeepSeek-V3.2): config reading, weight checks (indexer
// shapes, ue8m0 scales) and the forward (DeepseekV32Model, CPU and CUDA).
#pragma once
#include "model/registry.h"

namespace deepinfer {

Architecture deepseek_v32_architecture();

}  // namespace deepinfer
