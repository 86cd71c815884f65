// `deepinfer info` for DeepSeek-V4: a V4-shaped summary (layer kinds, window and compressed
// attention, indexer, hyper-connections, MoE with hash layers, both RoPE settings, the KV
// layer groups with their bytes per token), and the parameter count from the config.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <memory>
#include <string>
#include <vector>

#include "core/kv_group_spec.h"

#include "model/config.h"
#include "model/deepseek_v4/config.h"

namespace deepinfer {

class CheckpointReader;

// Parameters as the checkpoint holds them: every tensor but the FP8/FP4 block scales and
// the buffers tid2eid and the routers' selection bias (FP4 experts: two per byte). The MTP
// block (mtp.*) is not read yet: mtp_total and mtp_active_per_token stay 0.
ParameterCount v4_parameter_count(const DeepseekV4Config& config);
// The summary's "KV groups" and "KV per token" lines: each group's layers, row and bytes (row_bytes of
// one layer's row), window groups per sequence, the others per token of context. `label` heads them.
std::string v4_family_kv_lines(const std::vector<KvGroupSpec>& groups, const std::string& label,
                               int64_t (*row_bytes)(const KvGroupSpec&));
// deepinfer info's "kv_groups" (with "format_row_bytes" when row_bytes is given) and "parameters".
void v4_family_info_json(const std::vector<KvGroupSpec>& groups, const ParameterCount& p,
                         int64_t (*row_bytes)(const KvGroupSpec&), nlohmann::json& out);
// Multi-line text; bf16 KV rows for the bytes per token.
std::string v4_summary(const DeepseekV4Config& config);
// Architecture::describe: reads `dir`'s config, loads every weight against it (throws
// naming the tensor) and fills `out` (deepinfer info's JSON fields and its "summary").
void describe_deepseek_v4(const std::string& dir, std::shared_ptr<const CheckpointReader> reader,
                          nlohmann::json& out);

}  // namespace deepinfer
