// Where DeepSeek-V4.1's attention state lives: its KV layer groups (Model::kv_groups;
// kv/kv_groups.h says how the block manager, runner and forward use them):
//   "window"            every layer: each token's K=V row (head_dim), window sliding_window;
//   "compressed_r<R>"   the KV sources of ratio R: the compressed entries (head_dim) their group of
//                       layers shares, one row per R tokens;
//   "indexer_keys_r<R>" the same sources: the indexer keys (index_head_dim) of those entries;
//   "pending_r<R>"      (R > 1) the same sources: each token's compressor inputs [kv D | gate D],
//                       window R: the tokens of the group not yet complete;
//   "engram_tokens"     (Engram layers only) each token's compressed id (engram_hash.h), one F32
//                       per row (exact below 2^24), window engram_max_ngram_size: the n-gram
//                       look-back of the next step's first token.
//   "dspark_context"    (a loaded DSpark drafter only) one layer per drafter stage: each verified
//                       token's context K=V row (head_dim, activation dtype; dspark.h), window
//                       sliding_window: what the drafter's block attends to.
// Only source layers hold compressed rows: the layers up to the next source read their source's.
// The window, compressed and indexer-key rows are U8 rows in their cache formats
// (Backend::store_packed_rows): window FP8 e4m3 with an E8M0 scale per 32 (head_dim 512: 528 B),
// entries FP4 e2m1 with an e4m3 scale per 16 (288 B), keys FP4 with an E8M0 scale per 32 (68 B);
// the pending compressor inputs are activation-dtype rows.
#pragma once
#include <vector>

#include "backend/backend.h"
#include "core/kv_group_spec.h"
#include "model/deepseek_v41/config.h"

namespace deepinfer {

struct V41KvLayout {
  static constexpr int kNone = -1;
  static constexpr Backend::FakeQuant kWindowFormat = Backend::FakeQuant::Fp8Ue8m0x32;
  static constexpr Backend::FakeQuant kEntryFormat = Backend::FakeQuant::Fp4E4m3x16;
  static constexpr Backend::FakeQuant kKeyFormat = Backend::FakeQuant::Fp4Ue8m0x32;
  struct Ratio {  // the groups of one compression ratio
    int ratio = 0;
    int compressed = kNone, indexer_keys = kNone, pending = kNone;  // group indices
  };
  int window = kNone;
  int engram = kNone;  // "engram_tokens"
  int dspark = kNone;  // "dspark_context"
  std::vector<Ratio> ratios;
  // Per model layer (ratio > 0): which ratios[] entry and which layer of its groups holds the
  // compressed rows it reads (its KV source's); kNone for window-only layers.
  std::vector<int> ratio_of_layer, source_slot;
  std::vector<KvGroupSpec> groups;
};

// dspark: the model has its DSpark drafter loaded (num_nextn_predict_layers stages).
V41KvLayout v41_kv_layout(const DeepseekV41Config& config, bool dspark = false);

}  // namespace deepinfer
