// Config reading of the DeepSeek-V2/V3 family (see model/config.h for the facts
// mirrored from transformers 5.17). Used by this folder's architecture entries
// and by architectures built on V3 (deepseek_v32/).
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "model/config.h"

namespace deepinfer {

// Whose transformers defaults fill absent fields, and which routing rules apply.
enum class DeepseekV3Family { V2, V3 };

// Reads and validates every V2/V3 field of config.json `root` (an object).
// model_type is copied, not checked (the registry chose this reader). Throws
// Error naming `source` and the field.
ModelConfig parse_deepseek_v3_config(const nlohmann::json& root, const std::string& source,
                                     DeepseekV3Family family);

}  // namespace deepinfer
