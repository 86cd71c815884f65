// Where DeepSeek-V4's attention state lives: its KV layer groups (Model::kv_groups;
// kv/kv_groups.h says how the block manager, runner and forward use them). Every piece of
// state is paged, none is kept per sequence on the host:
//   "window"        every layer: each token's K=V row (head_dim), window sliding_window
//                   (a query reads the last sliding_window rows, its own included);
//   "csa_entries"   CSA layers: compressed entries (head_dim), one row per csa_rate tokens;
//   "indexer_keys"  CSA layers: the lightning indexer's compressed keys (index_head_dim),
//                   one row per csa_rate tokens;
//   "csa_pending"   CSA layers: each token's compressor inputs [kv 2D | gate 2D | index kv
//                   2d | index gate 2d], window 2 csa_rate: the tokens of the group not yet
//                   complete and, for the overlap, those of the group before it;
//   "hca_entries"   HCA layers: compressed entries (head_dim), one row per hca_rate tokens;
//   "hca_pending"   HCA layers: each token's [kv D | gate D], window hca_rate.
// The compressor inputs are projections of the layer input, which the window rows (K=V
// after norm and RoPE) do not determine, so they are kept rather than recomputed; their
// windows bound them (at most 2 csa_rate / hca_rate rows per sequence and layer, plus a
// block). A step pools a group once its last token is computed, from these rows, so
// one-shot prefill, chunked prefill and decode read and write the same rows, and a prefix
// hit (a multiple of ratio x block_size tokens in every compressed group, the window
// groups' blocks still cached) restores all of it. Groups without layers are left out.
#pragma once
#include <vector>

#include "core/kv_group_spec.h"
#include "model/deepseek_v4/config.h"

namespace deepinfer {

struct V4KvLayout {
  static constexpr int kNone = -1;
  // Group indices in Model::kv_groups order (kNone: absent).
  int window = kNone;
  int csa_entries = kNone, indexer_keys = kNone, csa_pending = kNone;
  int hca_entries = kNone, hca_pending = kNone;
  // Per model layer: its layer index in the groups of its kind (CSA or HCA groups; the
  // window group holds every layer at its own index).
  std::vector<int> layer_in_group;
  // Column offsets in a CSA pending row (kv, gate, index kv, index gate) and its width.
  int64_t csa_kv = 0, csa_gate = 0, csa_index_kv = 0, csa_index_gate = 0, csa_row = 0;
  // Column offsets in an HCA pending row (kv, gate) and its width.
  int64_t hca_kv = 0, hca_gate = 0, hca_row = 0;
  std::vector<KvGroupSpec> groups;
};

V4KvLayout v4_kv_layout(const DeepseekV4Config& config);

}  // namespace deepinfer
