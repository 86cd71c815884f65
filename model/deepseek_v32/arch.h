// The deepseek_v32 registry entry (DeepSeek-V3.2): config reading and weight checks.
// No forward yet (issue 14 items 4-6: the CPU indexer, sparse MLA, golden tests).
#pragma once
#include "model/registry.h"

namespace deepinfer {

Architecture deepseek_v32_architecture();

}  // namespace deepinfer
