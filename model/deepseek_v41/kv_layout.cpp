#include "model/deepseek_v41/kv_layout.h"

#include <string>

namespace deepinfer {

V41KvLayout v41_kv_layout(const DeepseekV41Config& c, bool dspark) {
  V41KvLayout out;
  // packed: rows of `channels` values in that cache format (U8 bytes); else activation rows.
  auto add = [&](const std::string& name, int layers, int64_t channels, int tokens_per_row,
                 int window, const Backend::FakeQuant* packed) {
    KvGroupSpec g;
    g.name = name;
    g.num_layers = layers;
    g.row_dim = packed != nullptr ? packed_row_bytes(*packed, channels) : channels;
    g.activation_dtype = packed == nullptr;
    g.dtype = DType::U8;
    g.tokens_per_row = tokens_per_row;
    g.window = window;
    out.groups.push_back(g);
    return static_cast<int>(out.groups.size()) - 1;
  };
  const Backend::FakeQuant fp8 = V41KvLayout::kWindowFormat, entry = V41KvLayout::kEntryFormat,
                           key = V41KvLayout::kKeyFormat;
  out.window =
      add("window", c.num_layers(), c.head_dim, 1, static_cast<int>(c.sliding_window), &fp8);
  // Sources per ratio, in order of first appearance; each source's slot within its ratio's groups.
  std::vector<int> slot_of_source(static_cast<size_t>(c.num_layers()), V41KvLayout::kNone);
  std::vector<int> count;
  for (int s : c.kv_source_layers) {
    size_t r = 0;
    while (r < out.ratios.size() && out.ratios[r].ratio != c.ratio(s)) ++r;
    if (r == out.ratios.size()) {
      out.ratios.push_back({c.ratio(s)});
      count.push_back(0);
    }
    slot_of_source[static_cast<size_t>(s)] = count[r]++;
  }
  for (size_t r = 0; r < out.ratios.size(); ++r) {
    V41KvLayout::Ratio& g = out.ratios[r];
    const std::string tag = "_r" + std::to_string(g.ratio);
    g.compressed = add("compressed" + tag, count[r], c.head_dim, g.ratio, 0, &entry);
    g.indexer_keys = add("indexer_keys" + tag, count[r], c.index_head_dim, g.ratio, 0, &key);
    if (g.ratio > 1)
      g.pending = add("pending" + tag, count[r], 2 * c.head_dim, 1, g.ratio, nullptr);
  }
  if (!c.engram_layers.empty()) {
    KvGroupSpec g;
    g.name = "engram_tokens";
    g.num_layers = 1;
    g.row_dim = 1;
    g.activation_dtype = false;
    g.dtype = DType::F32;
    g.window = c.engram_max_ngram_size;
    out.groups.push_back(g);
    out.engram = static_cast<int>(out.groups.size()) - 1;
  }
  if (dspark)
    out.dspark = add("dspark_context", c.base.num_nextn_predict_layers, c.head_dim, 1,
                     static_cast<int>(c.sliding_window), nullptr);
  for (int l = 0; l < c.num_layers(); ++l) {
    int ratio = V41KvLayout::kNone, slot = V41KvLayout::kNone;
    if (c.ratio(l) > 0) {
      const int s = c.kv_source_of(l);
      for (size_t r = 0; r < out.ratios.size(); ++r)
        if (out.ratios[r].ratio == c.ratio(s)) ratio = static_cast<int>(r);
      slot = slot_of_source[static_cast<size_t>(s)];
    }
    out.ratio_of_layer.push_back(ratio);
    out.source_slot.push_back(slot);
  }
  return out;
}

}  // namespace deepinfer
