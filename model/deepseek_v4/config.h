// Config reading of DeepSeek-V4 (model_type deepseek_v4; MODELS.md V4-Flash), with the
// defaults of transformers 5.17 (configuration_deepseek_v4.py) for absent fields.
//
// Spellings accepted (both as DeepSeek ships them and as transformers saves them):
//  - per-layer attention: `compress_ratios` (DeepSeek: one int per main layer, optionally
//    followed by one per MTP layer; 0 = window only, else the CSA or HCA rate), or
//    `layer_types` ("sliding_attention" | "compressed_sparse_attention" |
//    "heavily_compressed_attention", one per main layer); absent: transformers' default
//    (2 HCA, then CSA/HCA alternating from CSA at odd layers).
//  - rates: `compress_rates` {compressed_sparse_attention, heavily_compressed_attention}
//    or `compress_rate_csa` / `compress_rate_hca`; default 4 / 128. A CSA layer has the
//    overlapping compressor and the lightning indexer; an HCA layer the non-overlapping one.
//  - MoE kind: `mlp_layer_types` ("hash_moe" | "moe") or `num_hash_layers` (default 3).
//  - rope dims: `qk_rope_head_dim` or `partial_rotary_factor` (default 64 / head_dim 512).
//  - RoPE: window-only layers use rope_theta (default 1e4) without scaling; compressed layers
//    compress_rope_theta (default 160000) with `rope_scaling` (DeepSeek) or `rope_parameters`
//    (flat, or nested {main, compress}); YaRN's attention_factor is 1 unless given (the V4
//    reference does not scale cos/sin).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/config.h"

namespace deepinfer {

enum class V4AttentionKind { Window, Csa, Hca };

// What V4 and V4.1 (model/deepseek_v41/) share: one K=V latent with window attention, grouped
// output, sinks, the indexer's dimensions, hyper-connections, sqrt-softplus MoE with SwiGLU clamp
// and the two RoPE settings. Each model's reader adds its per-layer schedule.
struct V4FamilyConfig {
  // Common facts in the shared shape (vocab, hidden, layers, heads, q_lora_rank, experts,
  // eps, ids, quantization); kv_lora_rank = v_head_dim = head_dim, qk_rope_head_dim = rope dim.
  ModelConfig base;
  int64_t head_dim = 512;
  int64_t rope_dim = 64;
  int64_t o_groups = 8;
  int64_t o_lora_rank = 1024;
  int64_t sliding_window = 128;
  int64_t index_n_heads = 64;
  int64_t index_head_dim = 128;
  int64_t index_topk = 512;
  int hc_mult = 4;
  int hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double swiglu_limit = 10.0;
  double rope_theta = 10000.0;             // window-only layers
  double compress_rope_theta = 160000.0;   // layers with compressed attention
  RopeScaling compress_rope;               // YaRN (or default) of the compressed layers
  // transformers clamps the shared expert's SwiGLU too; DeepSeek's reference does not.
  bool clamp_shared_expert = true;

  int num_layers() const { return base.num_hidden_layers; }
  // What rope_cos_sin_table (model/layers/rope_table.h) builds the two tables from.
  RopeDims main_rope_dims() const;
  RopeDims compress_rope_dims() const;
};

// The defaults (transformers' config class) of the fields V4FamilyConfig reads.
struct V4FamilyDefaults {
  const char* model_type;
  int64_t hidden_size, moe_intermediate_size, q_lora_rank, index_n_heads;
  int num_hidden_layers, n_routed_experts, num_nextn_predict_layers;
  double rms_norm_eps;
};

// Reads and validates the shared fields of config object `root` into `out` (throws Error naming
// `source` and the field). The per-layer schedule is the caller's.
void parse_v4_family_config(const nlohmann::json& root, const std::string& source, const V4FamilyDefaults& defaults,
                            V4FamilyConfig& out);

// The JSON of `path` (config.json, or a directory holding one); `file` gets the file's path.
nlohmann::json read_config_json(const std::string& path, std::string& file);

struct DeepseekV4Config : V4FamilyConfig {
  int csa_rate = 4;
  int hca_rate = 128;
  std::vector<V4AttentionKind> attention;  // one per main layer
  std::vector<bool> hash_moe;              // one per main layer

  int ratio(int layer) const;  // 0, csa_rate or hca_rate
};

// Reads and validates config.json `root`. Throws Error naming `source` and the field:
// compress_ratios of the wrong length or with a ratio other than 0 / CSA / HCA rate,
// unknown layer_types / mlp_layer_types entries, scoring_func other than sqrtsoftplus,
// num_key_value_heads != 1, heads not divisible by o_groups, ...
DeepseekV4Config parse_deepseek_v4_config(const nlohmann::json& root, const std::string& source);
// The registry's reader: the shared-shape part of parse_deepseek_v4_config.
ModelConfig parse_deepseek_v4_model_config(const nlohmann::json& root, const std::string& source);
// Reads `path` (config.json, or a directory holding one).
DeepseekV4Config load_deepseek_v4_config(const std::string& path);

}  // namespace deepinfer
