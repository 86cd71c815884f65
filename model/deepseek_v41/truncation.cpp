#include "model/deepseek_v41/truncation.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer {

V41PrefillTruncation v41_prefill_truncation(const DeepseekV41Config& c, const std::string& mode,
                                            int64_t keep) {
  V41PrefillTruncation t;
  DI_CHECK(mode == "compact" || mode == "off", c.base.source,
           ": DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE='", mode,
           "': expected compact (the layers above the last KV source run on the prompt's last "
           "DEEPINFER_YOCO_PREFILL_KEEP_TOKENS rows only) or off (every layer on every row)");
  t.compact = mode == "compact";
  t.keep = keep;
  t.num_layers = c.num_layers();
  t.first_layer = c.kv_source_layers.empty() ? t.num_layers : c.kv_source_layers.back() + 1;
  const int64_t W = c.sliding_window, n = t.num_layers - t.first_layer;
  t.backtracking = 2 * (int64_t{c.dspark_block_size} + 1);
  t.floor = W + t.backtracking;
  t.exact_keep = n > 0 ? n * (W - 1) + 1 : 0;
  t.exact_lag = n > 0 ? (n - 1) * (W - 1) : 0;
  DI_CHECK(keep >= t.floor, c.base.source, ": DEEPINFER_YOCO_PREFILL_KEEP_TOKENS=", keep,
           " is below the floor ", t.floor, " = sliding_window ", W, " + backtracking ",
           t.backtracking, " (2 x (dspark_block_size ", c.dspark_block_size,
           " + 1)): the decode and verify steps after a prompt read the last ", W - 1,
           " rows of every layer's window, and a prefix hit up to ", t.backtracking,
           " tokens before the prompt's end reads them too; rows below the kept ones are never "
           "computed in layers ",
           t.first_layer, " on");
  if (t.active())
    for (int e : c.engram_layers)
      DI_CHECK(e < t.first_layer, c.base.source, ": engram_layer_ids: Engram layer ", e,
               " lies above the last KV source (layer ", t.first_layer - 1,
               "): DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE=compact skips the rows it would read");
  return t;
}

double v41_layer_prefill_flops(const DeepseekV41Config& c, int layer, int64_t rows, int64_t end) {
  const double H = static_cast<double>(c.base.hidden_size),
               ql = static_cast<double>(c.base.q_lora_rank);
  const double heads = c.base.num_attention_heads, D = static_cast<double>(c.head_dim);
  const double nh = static_cast<double>(c.index_n_heads),
               di = static_cast<double>(c.index_head_dim);
  const double hc = c.hc_mult, inter = static_cast<double>(c.base.moe_intermediate_size);
  const int64_t ratio = c.ratio(layer), W = c.sliding_window;
  const double R = static_cast<double>(rows);
  double mac = 0;
  // Hyper-connection mixes (two sites: (2 + hc) hc mixes of hc H inputs each) and the norms'
  // weights are per row; collapse / post are O(hc H) and left out.
  mac += R * 2 * (2 + hc) * hc * (hc * H);
  // Attention projections: wq_a, wq_b, wkv, grouped wo_a (heads D -> o_groups x o_lora), wo_b.
  mac += R * (H * ql + ql * heads * D + H * D + heads * D * static_cast<double>(c.o_lora_rank) +
              static_cast<double>(c.o_groups * c.o_lora_rank) * H);
  // Window attention (QK and PV) over min(W, p + 1) rows, p = end - rows .. end - 1.
  double window_rows = 0, entries = 0, chosen = 0;
  for (int64_t p = end - rows; p < end; ++p) {
    window_rows += static_cast<double>(std::min<int64_t>(W, p + 1));
    if (ratio > 0) {
      const int64_t visible = (p + 1) / ratio;
      entries += static_cast<double>(visible);
      chosen += static_cast<double>(std::min<int64_t>(c.index_topk, visible));
    }
  }
  mac += 2 * heads * D * (window_rows + chosen);
  if (ratio > 0 && c.is_kv_source(layer)) {
    // Compressor: wkv (+ wgate for ratio > 1) per row; per entry the indexer key wk.
    mac += R * H * D * (ratio > 1 ? 2 : 1);
    mac += static_cast<double>(end / ratio - (end - rows) / ratio) * D * di;
  }
  if (ratio > 0 && c.is_index_source(layer)) {
    // Indexer: wq_b and weights_proj per row, scores of nh heads x di against visible entries.
    mac += R * (ql * nh * di + H * nh);
    mac += entries * nh * di;
  }
  // MoE: router, top-k routed experts and the shared expert (SwiGLU: three matrices).
  mac += R * (H * c.base.n_routed_experts +
              (c.base.num_experts_per_tok + c.base.n_shared_experts) * 3 * H * inter);
  // Engram: the gathered rows' projection into hc keys and one value.
  if (std::find(c.engram_layers.begin(), c.engram_layers.end(), layer) != c.engram_layers.end())
    mac += R * (c.engram_max_ngram_size - 1) * c.engram_n_heads *
           static_cast<double>(c.engram_head_dim) * H * (hc + 1);
  return 2 * mac;
}

}  // namespace deepinfer
