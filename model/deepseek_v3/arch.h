// The registry entries of this folder: deepseek_v3 (V3, R1, V3.1) and deepseek_v2
// (V2, V2-Lite), one forward (DeepseekV3Model).
#pragma once
#include "model/registry.h"

namespace deepinfer {

Architecture deepseek_v3_architecture();
Architecture deepseek_v2_architecture();

}  // namespace deepinfer
