// The deepseek_v41 registry entry (DeepSeek-V4.1-Flash): config reading (composite or flat),
// weights under the released and the PR's names, the CPU forward (model.h) and `deepinfer info`.
#pragma once
#include "model/registry.h"

namespace deepinfer {

Architecture deepseek_v41_architecture();
// The same for a flat `deepseek_v41_text` config.json.
Architecture deepseek_v41_text_architecture();

}  // namespace deepinfer
