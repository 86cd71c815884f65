// Config reading of DeepSeek-V3.2 (model_type deepseek_v32): V3's fields (with V3's
// defaults) plus the lightning indexer's index_n_heads, index_head_dim, index_topk.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "model/config.h"

namespace deepinfer {

// Unlike transformers (which defaults them to 64 / 128 / 2048), the index_* fields are
// required: every V3.2 checkpoint writes them, and a silent default would pick positions
// with the wrong shapes. Throws Error naming `source` and the field.
ModelConfig parse_deepseek_v32_config(const nlohmann::json& root, const std::string& source);

}  // namespace deepinfer
