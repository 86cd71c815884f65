#include "app/bench_counts.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "model/config.h"

namespace deepinfer::app {

StepCounts count_step(const ModelConfig& c, StepKind kind, double linear_bytes, double table_bytes, int batch,
                      int tokens_per_seq, int logits_rows, double context, double kv_bytes_per_value) {
  return count_step(c, StepQuery{kind, linear_bytes, table_bytes, batch, tokens_per_seq, logits_rows, context,
                                 kv_bytes_per_value});
}

StepCounts count_step(const ModelConfig& c, const StepQuery& q) {
  if (c.extras) {
    if (std::optional<StepCounts> own = c.extras->count_step(c, q)) return *own;
  }
  const StepKind kind = q.kind;
  const double linear_bytes = q.linear_bytes, table_bytes = q.table_bytes, context = q.context;
  const double kv_bytes_per_value = q.kv_bytes_per_value;
  const int batch = q.batch, tokens_per_seq = q.tokens_per_seq, logits_rows = q.logits_rows;
  const ParameterCount pc = c.parameter_count();
  const double H = static_cast<double>(c.hidden_size), V = static_cast<double>(c.vocab_size);
  const double expert = 3.0 * H * c.moe_intermediate_size;
  const int moe_layers = c.num_moe_layers();
  const double tokens = static_cast<double>(batch) * tokens_per_seq;
  const double k = c.num_experts_per_tok, e = c.n_routed_experts;
  const double distinct = e > 0 ? e * (1.0 - std::pow(1.0 - k / e, tokens)) : 0.0;
  // active_per_token counts embed_tokens (and an untied lm_head) too; neither is a linear layer
  // every token runs.
  const double linear_active = static_cast<double>(pc.active_per_token - pc.embedding);
  const double lm_head = V * H;
  StepCounts r;
  r.weight_bytes = (linear_active - moe_layers * k * expert + moe_layers * distinct * expert) * linear_bytes +
                   (logits_rows > 0 ? lm_head * table_bytes : 0.0) + tokens * H * table_bytes;
  const double layers = c.num_hidden_layers, heads = c.num_attention_heads;
  const double row = static_cast<double>(c.kv_row_dim());
  const double per_context =
      kind == StepKind::Decode ? 2.0 * heads * (row + c.kv_lora_rank) : 2.0 * heads * (c.qk_head_dim() + c.v_head_dim);
  // Sparse attention (the architecture's, ModelConfig::sparse_attention; V3.2's indexer): MLA
  // over min(context, topk) positions; the scorer reads every key of its cache (2 x its heads x
  // key_dim FLOPs per key).
  const std::optional<SparseAttentionShape> sparse = c.sparse_attention();
  const double attended = sparse ? std::min(context, static_cast<double>(sparse->topk)) : context;
  const double index_dim = sparse ? static_cast<double>(sparse->key_dim) : 0.0;
  const double index_flops = sparse ? 2.0 * sparse->score_heads * index_dim : 0.0;
  r.flops = tokens * (2.0 * linear_active + (per_context * attended + index_flops * context) * layers) +
            logits_rows * 2.0 * lm_head;
  r.kv_bytes = (kind == StepKind::Decode ? batch * (attended * row + context * index_dim) : tokens * (row + index_dim)) *
               layers * kv_bytes_per_value;
  return r;
}

}  // namespace deepinfer::app
