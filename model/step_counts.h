// Bytes and FLOPs of one engine step: the types of the project's one count (bench/NOTES.md
// "Counting"; app/bench_counts.h has the shared MLA count, an architecture whose layers it does
// not describe gives its own through ArchitectureExtras::count_step, model/config.h).
#pragma once

namespace deepinfer {

enum class StepKind { Decode, Prefill };

// One step of `batch` sequences computing `tokens_per_seq` new tokens each after `context`
// tokens of visible context on average (a prefill: the mean causal context (n + 1) / 2 of a
// prompt of n tokens with nothing cached), `logits_rows` of the new tokens with logits.
// Linear weights at `linear_bytes` per parameter (1: FP8 checkpoint or --dtype fp8), embedding
// and lm_head at `table_bytes`, KV values at `kv_bytes_per_value`.
struct StepQuery {
  StepKind kind = StepKind::Decode;
  double linear_bytes = 2.0;
  double table_bytes = 2.0;
  int batch = 1;
  int tokens_per_seq = 1;
  int logits_rows = 1;
  double context = 0.0;
  double kv_bytes_per_value = 2.0;
  // Bytes per routed-expert parameter where an architecture keeps experts in their own format
  // (V4: FP4 e2m1 at linear_bytes 1); 0: that format. 1 asks for FP8 experts.
  double expert_bytes = 0.0;
};

struct StepCounts {
  double weight_bytes = 0;
  double kv_bytes = 0;
  double flops = 0;
  // false: the architecture has no count yet (the figures above are 0; bench reports no roofline).
  bool modeled = true;
};

}  // namespace deepinfer
