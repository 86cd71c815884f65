// Bytes and FLOPs of one DeepSeek-V4 step (model/step_counts.h; the count `deepinfer bench`
// and deepinfer_v4_model_bench report rooflines with), layer by layer from the config:
//  - weights, in the formats V4-Flash ships and --random-weights makes (weights_random.cpp):
//    at linear_bytes 1 the dense linears (wq_a, wq_b, wkv, wo_b, shared expert) FP8 with an F32
//    scale per 128 x 128 block and the routed experts FP4 e2m1 with one scale byte per 32
//    (expert_bytes 1: FP8 like the dense ones); at 2 (or 4) both at linear_bytes; wo_a, the
//    router, the compressors' and the indexer's projections BF16 (F32 at linear_bytes 4);
//    norms, sinks, `ape` and the hyper-connection mixes F32. A step reads every non-expert weight once, each routed expert it touches once
//    (E (1 - (1 - k/E)^T) distinct experts per layer for T tokens, uniform routing; the hash
//    layers counted alike), the head when a row has logits and one embedding row per token;
//  - FLOPs: 2 per multiply-add of every linear a token runs (hyper-connection mixes included),
//    attention 4 x heads x head_dim per row attended (K = V: scores and values), the indexer's
//    2 x index_heads x index_head_dim per compressed entry scored, 2 x vocab x hidden per
//    logits row;
//  - rows attended by the token at position p: the window's min(W, p + 1) rows, on CSA layers
//    min(index_topk, (p + 1) / 4) compressed entries (the indexer scores all of them), on HCA
//    layers all (p + 1) / 128;
//  - KV bytes: decode reads the rows it attends plus the indexer keys it scores; prefill writes
//    a window row per token and layer, and the compressed rows and indexer keys of its groups.
//    Values at kv_bytes_per_value.
// Decode positions are the mean context; a prefill of n tokens covers positions 0 .. n - 1
// (nothing cached, as bench runs it).
#pragma once
#include "model/deepseek_v4/config.h"
#include "model/step_counts.h"

namespace deepinfer {

StepCounts count_v4_step(const DeepseekV4Config& config, const StepQuery& query);

}  // namespace deepinfer
