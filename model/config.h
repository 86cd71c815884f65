// ModelConfig: the architecture facts of a DeepSeek-V2/V3 checkpoint, parsed
// from HF config.json (model_type "deepseek_v3" or "deepseek_v2"), with the
// defaults of transformers 5.17 (configuration_deepseek_v{2,3}.py) for absent
// fields, and derived quantities (head dims, softmax scale, parameter counts).
//
// Facts mirrored from transformers 5.17 (the oracle):
//  - rope: official configs write `rope_theta` + `rope_scaling: {type|rope_type:
//    "yarn", factor, original_max_position_embeddings, beta_fast, beta_slow,
//    mscale, mscale_all_dim}`; transformers 5 writes `rope_parameters:
//    {rope_type, rope_theta, ...}`. Both load; rope_theta defaults to 10000.
//  - rope_interleave defaults to true (V3). V2 has no such field: its rotary
//    embedding is complex multiplication of adjacent pairs, i.e. interleaved,
//    so deepseek_v2 configs get rope_interleave = true as well.
//  - softmax scale = qk_head_dim^-0.5, times m^2 with m = 0.1 * mscale_all_dim *
//    ln(factor) + 1 when the rope type is not "default", mscale_all_dim != 0
//    and factor > 1 (yarn_apply_mscale; `mscale` itself does not enter here).
//  - YaRN cos/sin are multiplied by attention_factor: the explicit value if
//    given, else get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
//    when both are non-zero (1.0 for V3 where both are 1), else
//    get_mscale(factor) = 0.1 ln(factor) + 1; see yarn_attention_factor(). A
//    yarn factor that is null means max_position_embeddings / original.
//  - A layer is MoE when n_routed_experts > 0, layer >= first_k_dense_replace and
//    layer % moe_layer_freq == 0 (transformers has no moe_layer_freq; official
//    configs set 1, so both rules agree).
//  - V3 routing (transformers ignores topk_method/scoring_func for V3): sigmoid
//    scores, selection on scores + e_score_correction_bias, group score = sum of
//    the top-2 biased scores of each group, keep topk_group groups, top-k inside;
//    weights = unbiased scores, / (sum + 1e-20) if norm_topk_prob,
//    * routed_scaling_factor.
//  - V2 routing: softmax scores; topk_method "greedy" = plain top-k;
//    "group_limited_greedy" = group score is the MAX score of each group; no
//    bias; weights are NOT renormalised whatever norm_topk_prob says (the
//    transformers V2 router ignores it), times routed_scaling_factor.
//  - Expert/shared/dense MLPs are SwiGLU: down(silu(gate(x)) * up(x)). The
//    shared experts form one MLP of intermediate n_shared_experts * moe_intermediate_size.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "model/layers/dims.h"
#include "model/layers/rope_table.h"
#include "model/step_counts.h"

namespace deepinfer {

struct QuantizationConfig {
  std::string quant_method;       // "" (none) or "fp8"
  std::string fmt = "e4m3";
  std::string activation_scheme;  // "dynamic" in V3
  int block_n = 128;              // weight_block_size[0] (rows of W [N, K])
  int block_k = 128;              // weight_block_size[1]
  // "" or "ue8m0" (V3.1 / V3.2: block scales are powers of two and DeepSeek's kernels round
  // activation scales up to one; the weights read the same either way).
  std::string scale_fmt;
  bool is_fp8() const { return quant_method == "fp8"; }
};

struct ParameterCount {
  // Main model (excludes MTP layers). Block-scale tensors are not parameters.
  int64_t total = 0;
  int64_t active_per_token = 0;  // embeddings row + dense parts + top-k and shared experts
  int64_t embedding = 0;         // embed_tokens (+ lm_head when untied)
  // MTP layers (num_nextn_predict_layers), excluding the embedding and output
  // head they share with the main model.
  int64_t mtp_total = 0;
  int64_t mtp_active_per_token = 0;
};

// The shape of an architecture's sparse attention (V3.2's lightning indexer), for bench's
// byte/FLOP counts (app/bench_counts.h): MLA attends min(context, topk) positions chosen by
// scoring every position (2 x score_heads x key_dim FLOPs each) against one cached key of
// key_dim values per position.
struct SparseAttentionShape {
  int64_t topk = 0;
  int64_t score_heads = 0;
  int64_t key_dim = 0;
};

struct ModelConfig;

// What an architecture's config holds beyond the shared fields (V3.2: its indexer), set by
// its parse_config (model/registry.h) and asked for only through these virtuals, so that
// nothing outside the architecture's folder names its fields.
class ArchitectureExtras {
 public:
  virtual ~ArchitectureExtras() = default;
  // Parameters each attention block (main and MTP layers) has beyond MLA's.
  virtual int64_t extra_attention_parameters(const ModelConfig&) const { return 0; }
  // Lines for ModelConfig::summary (each ending in a newline).
  virtual std::string summary() const { return {}; }
  virtual std::optional<SparseAttentionShape> sparse_attention() const { return std::nullopt; }
  // Bytes and FLOPs of a step for an architecture whose layers the shared MLA count
  // (app/bench_counts.cpp) does not describe (V4: windows, compressed rows, hyper-connections,
  // FP4 experts). nullopt: the shared count.
  virtual std::optional<StepCounts> count_step(const ModelConfig&, const StepQuery&) const { return std::nullopt; }
};

struct ModelConfig {
  std::string source;      // config.json path (for error messages)
  std::string model_type;  // a registered model_type (model/registry.h)
  std::string hidden_act = "silu";

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense MLP layers
  int64_t moe_intermediate_size = 0;  // per routed expert
  int num_hidden_layers = 0;
  int num_attention_heads = 0;

  // MLA. q_lora_rank == 0 means no query compression (a single q_proj).
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  // MoE. n_routed_experts == 0 means every layer is dense.
  int n_routed_experts = 0;
  int n_shared_experts = 0;
  int num_experts_per_tok = 0;
  int first_k_dense_replace = 0;
  int moe_layer_freq = 1;
  int n_group = 1;
  int topk_group = 1;
  std::string topk_method;   // "noaux_tc" (V3), "greedy" | "group_limited_greedy" (V2)
  std::string scoring_func;  // "sigmoid" (V3) | "softmax" (V2)
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;

  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool rope_interleave = true;
  int64_t max_position_embeddings = 0;

  int num_nextn_predict_layers = 0;  // MTP layers, ids num_hidden_layers ...
  bool tie_word_embeddings = false;
  int64_t bos_token_id = -1;               // -1 when absent/null
  std::vector<int64_t> eos_token_ids;      // int or list in config.json
  QuantizationConfig quantization;
  // The architecture's own facts (nullptr: none beyond these fields).
  std::shared_ptr<const ArchitectureExtras> extras;

  // --- derived ---------------------------------------------------------------
  bool has_q_lora() const { return q_lora_rank > 0; }
  bool is_moe_layer(int layer) const;
  int num_moe_layers() const;
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Values per cached token per layer in the absorbed MLA cache (512 + 64 in V3).
  int64_t kv_row_dim() const { return kv_lora_rank + qk_rope_head_dim; }
  int64_t shared_intermediate_size() const { return n_shared_experts * moe_intermediate_size; }
  double softmax_scale() const;
  double yarn_attention_factor() const;  // rope_attention_factor(rope_scaling)
  // The dimension structs the shared layers (model/layers/) take, built from these fields.
  MlaDims mla_dims() const;
  FfnDims ffn_dims() const;
  RopeDims rope_dims() const;
  // The routing rule for backend::moe_routing (see the header comment for V2's
  // group score rule, which MoeRouting does not spell out).
  MoeRouting moe_routing() const;
  ParameterCount parameter_count() const;  // with extras' attention parameters
  // extras' sparse attention; nullopt: dense MLA over every position.
  std::optional<SparseAttentionShape> sparse_attention() const {
    return extras ? extras->sparse_attention() : std::nullopt;
  }
  // Multi-line human-readable summary (deepinfer info).
  std::string summary() const;
};

// Parses config.json text with the reader that model/registry.h holds for its
// model_type. `source` names the file in errors. Throws Error naming the field
// for an unknown model_type (listing the known ones), a missing/invalid field or
// an impossible combination (e.g. num_experts_per_tok > n_routed_experts).
ModelConfig parse_model_config(std::string_view json_text, const std::string& source);
// Reads `path`, or `path`/config.json when `path` is a directory.
ModelConfig load_model_config(const std::string& path);

}  // namespace deepinfer
