// The deepseek_v4 registry entry (DeepSeek-V4-Flash): config reading, weights under
// DeepSeek's and transformers' names, and the CPU prefill forward (model.h).
#pragma once
#include "model/registry.h"

namespace deepinfer {

Architecture deepseek_v4_architecture();

}  // namespace deepinfer
