// DeepSeek-V4.1's prefill truncation ("bounded replay", YOCO-style; MODELS.md V4.1-Flash, issue 19
// item 3): DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE=compact|off (default off) and
// DEEPINFER_YOCO_PREFILL_KEEP_TOKENS (default 140), passed down as LoadOptions.
//
// What the layers above the last KV source ("the decoder": 21-39 of the released schedule) keep
// of earlier tokens: their compressed entries and indexer keys are the last KV source's (made from
// that layer's input, i.e. from layers 0-19; the PR's DeepseekV41Attention.forward takes
// shared["compress_kv"] and DeepseekV41Indexer.forward shared["index_k"] unless the layer is in
// kv_source_layer_ids), the candidate blocks and top-k choices are per query row, and the hyper-
// connection mixes are per row: the only state they read from other rows is their OWN window KV,
// rows [p - W + 1, p] of the same layer. So compact mode runs layers [0, first_layer) over every
// prompt row and layers [first_layer, L) only on the prompt's last `keep` rows (rows of positions
// >= floor = prompt length - keep; decode and verify rows always), their window attention reading
// no row before `floor` (the rows below were never computed).
//
// Exactness. The window of a truncated layer moves information W - 1 rows per layer, so layer
// first_layer + m's output at position p equals full prefill's when p >= floor + m (W - 1) (and in
// general only then), and its window row (made from layer first_layer + m - 1's output) when
// p >= floor + (m - 1)(W - 1). The last prompt row's logits and the window rows later steps read
// are therefore those of full prefill when keep >= exact_keep = n (W - 1) + 1, n = L - first_layer
// (released: 19 x 127 + 1 = 2414; tests/golden/test_v41_truncation.cpp: bit-equal at 15 on
// v41_tiny, different at 14); with the default 140 they are not: outputs differ from full
// prefill's. Serving engines accept that by design: lightseekorg/tokenspeed#1594 runs the
// decoder (layers from the candidate source on) on each prompt's last window only, and
// vllm-project/vllm#56227 says of its window replay after a prefix hit "not bit-identical to a cold run, by design".
// Chunked prefill equals one-shot prefill bit for bit in both cases (the floor depends on the
// prompt length only), decode never reads below the floor (keep >= W), and the prefix cache
// serves window blocks only from floor + exact_lag on (rows equal to full prefill's; with the
// default keep no window block of a truncated prompt, so no prefix hit on it: see NOTES).
//
// The floor: keep >= sliding_window + backtracking, backtracking = 2 x (dspark_block_size + 1), the
// issue's 140 = 128 + 12 for blocks of 5 (the decode and verify steps after the prompt read its
// last W - 1 rows; the 12 keep a prefix hit up to 12 tokens before a prompt's end served, the
// "protection = 2 x verify width" of lightseekorg/tokenspeed#1594's V4.1 replay windows).
#pragma once
#include <cstdint>
#include <string>

#include "model/deepseek_v41/config.h"

namespace deepinfer {

struct V41PrefillTruncation {
  bool compact = false;
  int64_t keep = 140;
  int first_layer = 0;       // layers [first_layer, num_layers) are truncated
  int num_layers = 0;
  int64_t backtracking = 0;  // 2 x (dspark_block_size + 1)
  int64_t floor = 0;         // sliding_window + backtracking: the least keep accepted
  int64_t exact_keep = 0;    // (num_layers - first_layer) x (W - 1) + 1: the least exact keep
  int64_t exact_lag = 0;     // (num_layers - first_layer - 1) x (W - 1): window rows from
                             // floor + exact_lag on are full prefill's (prefix-cache rule)
  bool active() const { return compact && first_layer < num_layers; }
  // First prompt row the truncated layers compute for a prompt of `prompt_tokens` (0: every row).
  int64_t row_floor(int64_t prompt_tokens) const {
    return active() && prompt_tokens > keep ? prompt_tokens - keep : 0;
  }
};

// Validates and resolves the settings for config `c`. Throws Error naming the variable for a mode
// other than compact / off, or a keep below the floor; with compact, Engram layers must lie below
// first_layer (the released ones, 1 and 14, do). No KV source, or no layer above the last:
// nothing to truncate (active() false).
V41PrefillTruncation v41_prefill_truncation(const DeepseekV41Config& c, const std::string& mode,
                                            int64_t keep);

// Prefill FLOPs (multiply-adds x 2) of one layer over `rows` query rows ending at prompt position
// `end` (the rows are [end - rows, end)): projections, indexer scoring (index sources), attention
// over the window and the chosen entries, the grouped output, hyper-connection mixes, routed and
// shared experts (top-k of them), Engram's projection. Counted per layer so a truncated prefill
// sums layers [0, first_layer) over the whole prompt and the rest over its kept rows.
double v41_layer_prefill_flops(const DeepseekV41Config& c, int layer, int64_t rows, int64_t end);

}  // namespace deepinfer
