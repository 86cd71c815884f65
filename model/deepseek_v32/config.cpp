#include "model/deepseek_v32/config.h"

#include <optional>
#include <sstream>

#include "core/error.h"
#include "model/config_fields.h"
#include "model/deepseek_v3/config.h"

namespace deepinfer {

using config_fields::Fields;
using config_fields::require;
using config_fields::str;

ModelConfig parse_deepseek_v32_config(const nlohmann::json& root, const std::string& source) {
  ModelConfig c = parse_deepseek_v3_config(root, source, DeepseekV3Family::V3);
  Fields f(root, source);
  IndexerDims ix;
  ix.n_heads = f.integer("index_n_heads", std::nullopt);
  ix.head_dim = f.integer("index_head_dim", std::nullopt);
  ix.topk = f.integer("index_topk", std::nullopt);
  ix.rope_dim = c.qk_rope_head_dim;
  require(ix.n_heads > 0, source, "index_n_heads", "must be > 0, got " + str(ix.n_heads));
  require(ix.head_dim > 0, source, "index_head_dim", "must be > 0, got " + str(ix.head_dim));
  require(ix.head_dim >= ix.rope_dim, source, "index_head_dim",
          str(ix.head_dim) + " is smaller than the rotated qk_rope_head_dim = " + str(ix.rope_dim));
  require(ix.topk > 0, source, "index_topk", "must be > 0, got " + str(ix.topk));
  require(ix.topk <= c.max_position_embeddings, source, "index_topk",
          str(ix.topk) + " is larger than the context, max_position_embeddings = " +
              str(c.max_position_embeddings));
  // The indexer's queries come from the q_lora output (wq_b reads q_a_layernorm's result).
  require(c.has_q_lora(), source, "q_lora_rank",
          "must be > 0 for deepseek_v32 (the indexer's wq_b reads the q_lora output)");
  c.extras = std::make_shared<const DeepseekV32Extras>(ix);
  return c;
}

const IndexerDims& deepseek_v32_indexer(const ModelConfig& config) {
  const auto* v32 = dynamic_cast<const DeepseekV32Extras*>(config.extras.get());
  DI_CHECK(v32 != nullptr, config.source, ": model_type '", config.model_type,
           "' has no lightning indexer (a deepseek_v32 config has)");
  return v32->indexer;
}

// wq_b, wk, k_norm (weight, bias), weights_proj.
int64_t DeepseekV32Extras::extra_attention_parameters(const ModelConfig& c) const {
  return indexer.n_heads * indexer.head_dim * c.q_lora_rank + indexer.head_dim * c.hidden_size +
         2 * indexer.head_dim + indexer.n_heads * c.hidden_size;
}

std::string DeepseekV32Extras::summary() const {
  std::ostringstream os;
  os << "sparse attention       indexer " << indexer.n_heads << " heads x " << indexer.head_dim
     << " (rope " << indexer.rope_dim << "), top " << indexer.topk << " positions\n";
  return os.str();
}

std::optional<SparseAttentionShape> DeepseekV32Extras::sparse_attention() const {
  return SparseAttentionShape{indexer.topk, indexer.n_heads, indexer.head_dim};
}

}  // namespace deepinfer
