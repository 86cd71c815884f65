#include "model/deepseek_v4/kv_layout.h"

namespace deepinfer {

V4KvLayout v4_kv_layout(const DeepseekV4Config& c) {
  V4KvLayout out;
  int num_csa = 0, num_hca = 0;
  for (int l = 0; l < c.num_layers(); ++l) {
    const V4AttentionKind kind = c.attention[static_cast<size_t>(l)];
    out.layer_in_group.push_back(kind == V4AttentionKind::Csa ? num_csa++
                                 : kind == V4AttentionKind::Hca ? num_hca++
                                                                : l);
  }
  const int64_t D = c.head_dim, d = c.index_head_dim;
  out.csa_kv = 0;
  out.csa_gate = 2 * D;
  out.csa_index_kv = 4 * D;
  out.csa_index_gate = 4 * D + 2 * d;
  out.csa_row = 4 * D + 4 * d;
  out.hca_kv = 0;
  out.hca_gate = D;
  out.hca_row = 2 * D;
  auto add = [&](const char* name, int layers, int64_t row_dim, int tokens_per_row, int window) {
    KvGroupSpec g;
    g.name = name;
    g.num_layers = layers;
    g.row_dim = row_dim;
    g.tokens_per_row = tokens_per_row;
    g.window = window;
    out.groups.push_back(g);
    return static_cast<int>(out.groups.size()) - 1;
  };
  out.window = add("window", c.num_layers(), D, 1, static_cast<int>(c.sliding_window));
  if (num_csa > 0) {
    out.csa_entries = add("csa_entries", num_csa, D, c.csa_rate, 0);
    out.indexer_keys = add("indexer_keys", num_csa, d, c.csa_rate, 0);
    out.csa_pending = add("csa_pending", num_csa, out.csa_row, 1, 2 * c.csa_rate);
  }
  if (num_hca > 0) {
    out.hca_entries = add("hca_entries", num_hca, D, c.hca_rate, 0);
    out.hca_pending = add("hca_pending", num_hca, out.hca_row, 1, c.hca_rate);
  }
  return out;
}

}  // namespace deepinfer
