// `deepinfer info` for DeepSeek-V4.1: a V4.1-shaped summary (layer schedule with its KV and index
// sources, the two-level top-k, hyper-connections, MoE, Engram and DSpark settings, the KV layer
// groups with their bytes per token in the cache formats), and the parameter count from the config.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "core/kv_group_spec.h"
#include "model/config.h"
#include "model/deepseek_v41/config.h"

namespace deepinfer {

class CheckpointReader;

// Parameters of the main layers as the checkpoint holds them (every tensor but FP8/FP4 scales and
// the routers' selection biases, the Engram tables' scales); the DSpark blocks are not counted yet.
ParameterCount v41_parameter_count(const DeepseekV41Config& config);
// Bytes one row of a KV group takes: the packed rows of kv_layout.h as they are (window FP8 with an
// E8M0 scale per 32, compressed entries FP4 with an e4m3 scale per 16, indexer keys FP4 with an
// E8M0 scale per 32); pending rows as BF16.
int64_t v41_format_row_bytes(const KvGroupSpec& group);
std::string v41_summary(const DeepseekV41Config& config);
// Architecture::describe: reads `dir`'s config, loads every weight against it (throws naming the
// tensor) and fills `out`.
void describe_deepseek_v41(const std::string& dir, std::shared_ptr<const CheckpointReader> reader,
                           nlohmann::json& out);

}  // namespace deepinfer
