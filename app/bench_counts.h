// The project's one count of bytes and FLOPs per step (bench/NOTES.md "Counting"), used by
// `deepinfer bench` for every roofline ratio and FLOP rate it reports.
//
// Per step of `batch` sequences computing `tokens_per_seq` new tokens each after `context`
// tokens of visible context on average, `logits_rows` of the new tokens with logits:
//  - linear FLOPs: 2 x the linear parameters one token touches (dense MLP or shared + top-k
//    experts, attention projections, router, MTP excluded) per token, plus 2 x vocab x hidden
//    per logits row (lm_head); the embedding table is a lookup, no FLOPs;
//  - attention FLOPs per token and layer: decode (absorbed form over the latent cache)
//    2 x heads x (kv_row_dim + kv_lora_rank) x context; prefill of a prompt with no cached
//    prefix (direct form) 2 x heads x (qk_head_dim + v_head_dim) x context, where the caller
//    passes the mean visible context (n + 1) / 2 of a causal prompt of n tokens;
//  - weight bytes: the dense linear parameters once per step, each routed expert touched by the
//    step once (E (1 - (1 - k/E)^T) distinct experts per MoE layer for T tokens, uniform
//    routing), lm_head once when any row has logits, one embedding row per token; linear
//    parameters at `linear_bytes` each, embedding and lm_head at `table_bytes` (bf16 also in FP8
//    checkpoints);
//  - KV bytes: decode reads batch x context rows per layer, prefill writes its new rows;
//  - sparse attention (V3.2's indexer, config.sparse_attention()): attention over min(context, index_topk)
//    rows, plus the indexer's 2 x index_n_heads x index_head_dim FLOPs and one index_head_dim
//    key read per context position (its key cache; score writes/reads not counted).
//  - an architecture with its own count (ModelConfig::extras, ArchitectureExtras::count_step:
//    V4) answers instead; one without a count yet (V4.1) answers StepCounts::modeled false.
#pragma once

#include "model/step_counts.h"

namespace deepinfer {
struct ModelConfig;
}

namespace deepinfer::app {

using deepinfer::StepCounts;
using deepinfer::StepKind;
using deepinfer::StepQuery;

StepCounts count_step(const ModelConfig& c, const StepQuery& q);
StepCounts count_step(const ModelConfig& c, StepKind kind, double linear_bytes, double table_bytes, int batch,
                      int tokens_per_seq, int logits_rows, double context, double kv_bytes_per_value);

}  // namespace deepinfer::app
