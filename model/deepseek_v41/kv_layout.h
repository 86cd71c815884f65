// Where DeepSeek-V4.1's attention state lives: its KV layer groups (Model::kv_groups;
// kv/kv_groups.h says how the block manager, runner and forward use them):
//   "window"            every layer: each token's K=V row (head_dim), window sliding_window;
//   "compressed_r<R>"   the KV sources of ratio R: the compressed entries (head_dim) their group of
//                       layers shares, one row per R tokens;
//   "indexer_keys_r<R>" the same sources: the indexer keys (index_head_dim) of those entries;
//   "pending_r<R>"      (R > 1) the same sources: each token's compressor inputs [kv D | gate D],
//                       window R: the tokens of the group not yet complete.
// Only source layers hold compressed rows: the layers up to the next source read their source's.
// Rows hold F32 on the CPU backend: the window and compressed rows and the indexer keys carry the
// values the FP8 / FP4 cache formats round them to (Backend::fake_quant), not yet those formats'
// bytes.
#pragma once
#include <vector>

#include "core/kv_group_spec.h"
#include "model/deepseek_v41/config.h"

namespace deepinfer {

struct V41KvLayout {
  static constexpr int kNone = -1;
  struct Ratio {  // the groups of one compression ratio
    int ratio = 0;
    int compressed = kNone, indexer_keys = kNone, pending = kNone;  // group indices
  };
  int window = kNone;
  std::vector<Ratio> ratios;
  // Per model layer (ratio > 0): which ratios[] entry and which layer of its groups holds the
  // compressed rows it reads (its KV source's); kNone for window-only layers.
  std::vector<int> ratio_of_layer, source_slot;
  std::vector<KvGroupSpec> groups;
};

V41KvLayout v41_kv_layout(const DeepseekV41Config& config);

}  // namespace deepinfer
