#include "model/deepseek_v32/config.h"

#include <optional>

#include "model/config_fields.h"
#include "model/deepseek_v3/config.h"

namespace deepinfer {

using config_fields::Fields;
using config_fields::require;
using config_fields::str;

ModelConfig parse_deepseek_v32_config(const nlohmann::json& root, const std::string& source) {
  ModelConfig c = parse_deepseek_v3_config(root, source, DeepseekV3Family::V3);
  Fields f(root, source);
  IndexerDims& ix = c.indexer;
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
  return c;
}

}  // namespace deepinfer
