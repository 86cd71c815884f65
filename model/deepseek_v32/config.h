// Config reading of DeepSeek-V3.2 (model_type deepseek_v32): V3's fields (with V3's
// defaults) plus the lightning indexer's index_n_heads, index_head_dim, index_topk, kept in
// the config's ArchitectureExtras (DeepseekV32Extras) rather than in the shared fields.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "model/config.h"
#include "model/layers/indexer.h"

namespace deepinfer {

// V3.2's facts beyond V3's: the indexer's dimensions (the same in every layer, MTP included).
class DeepseekV32Extras final : public ArchitectureExtras {
 public:
  explicit DeepseekV32Extras(const IndexerDims& indexer) : indexer(indexer) {}
  int64_t extra_attention_parameters(const ModelConfig& config) const override;
  std::string summary() const override;
  std::optional<SparseAttentionShape> sparse_attention() const override;

  const IndexerDims indexer;
};

// Unlike transformers (which defaults them to 64 / 128 / 2048), the index_* fields are
// required: every V3.2 checkpoint writes them, and a silent default would pick positions
// with the wrong shapes. Throws Error naming `source` and the field.
ModelConfig parse_deepseek_v32_config(const nlohmann::json& root, const std::string& source);

// The indexer dimensions of a config parse_deepseek_v32_config made; throws Error naming
// config.source for any other config.
const IndexerDims& deepseek_v32_indexer(const ModelConfig& config);

}  // namespace deepinfer
