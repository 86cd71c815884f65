// Config reading of DeepSeek-V4.1 (model_type deepseek_v41; MODELS.md V4.1-Flash), with the
// defaults of the unmerged transformers PR's configuration_deepseek_v41.py for absent fields.
// The released config.json is composite (the text model under `text_config`, quantization_config
// at the top); a flat `deepseek_v41_text` config (what the PR's save_pretrained writes) reads too.
//
// What V4.1 adds to the V4 family (model/deepseek_v4/config.h's V4FamilyConfig):
//  - `compress_ratios`: per main layer 0 (window only), 1 (full-resolution shared KV) or r > 1
//    (r tokens pooled into one entry); optionally followed by one entry per DSpark layer (ignored).
//    Absent: [0, 0] + [2] x 18 + [1] x 20 for 40 layers, else that pattern scaled to the count.
//  - `kv_source_layer_ids`: the layers that own a compressor and publish the compressed KV and
//    indexer keys shared by the layers up to the next source (default [2, 8, 14, 20] for the
//    released schedule, else the first layer of each run of equal ratios);
//    `index_source_layer_ids`: the layers that run the indexer, reused by the layers up to the
//    next one (default [2, 8, 14, 20, 24, 28, 32, 36] with the released sources, else the sources);
//    `candidate_source_layer_id` (default the last KV source; < 0: none): its top
//    `candidate_topk_blocks` blocks of `candidate_block_size` entries constrain later index
//    sources.
//  - router `gate_temp`; Engram (`engram_*`); the DSpark drafter (`dspark_*`, also DeepSpec's
//    unprefixed names under `dspark_config`; dspark.h).
// Bad schedules fail naming the field: ids outside [0, num_hidden_layers), a source on a
// window-only layer, a compressed layer with no KV source at or before it or with a ratio other
// than its source's, an index source that is not a KV source and follows none, a KV source that
// does not run the indexer, a candidate source that is not an index source, Engram tables that
// do not match the Engram layers.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/deepseek_v4/config.h"

namespace deepinfer {

struct DeepseekV41Config : V4FamilyConfig {
  std::vector<int> compress_ratios;      // one per main layer
  std::vector<int> kv_source_layers;     // ascending
  std::vector<int> index_source_layers;  // ascending
  int candidate_source_layer = -1;       // < 0: no two-level top-k
  int64_t candidate_topk_blocks = 2048;
  int64_t candidate_block_size = 8;
  double gate_temp = 1.0;
  // Engram n-gram memory (engram_hash.h; its tables must have the rows its bucket primes give).
  std::vector<int> engram_layers;
  std::vector<int64_t> engram_num_embeddings;  // table rows, one per Engram layer
  int64_t engram_vocab_size = 16000000;
  int engram_max_ngram_size = 4;
  int engram_n_heads = 8;
  int64_t engram_head_dim = 256;
  int64_t engram_pad_id = 2;
  int64_t engram_compressed_vocab_size = 99092;
  // DSpark drafter (model/deepseek_v41/dspark.h): num_nextn_predict_layers stages `mtp.N.*`.
  int dspark_block_size = 5;               // draft positions per block (= drafts per forward)
  int64_t dspark_noise_token_id = 128799;  // the noise (mask) token at the block's draft positions
  std::vector<int> dspark_target_layers;   // target layers whose outputs condition the drafter
  int64_t dspark_markov_rank = 256;        // 0: no Markov head
  bool dspark_confidence_head = true;      // when its weights are present
  bool dspark_confidence_with_markov = true;
  int dspark_n_routed_experts = 128;
  int dspark_num_experts_per_tok = 3;

  int ratio(int layer) const { return compress_ratios.at(static_cast<size_t>(layer)); }
  bool is_kv_source(int layer) const;
  bool is_index_source(int layer) const;
  // The KV source whose compressed KV layer `layer` reads (the last at or before it); -1: none.
  int kv_source_of(int layer) const;
  // The index source whose choice layer `layer` reuses (the last at or before it); -1: none.
  int index_source_of(int layer) const;
};

// Reads and validates config.json `root` (composite or flat). Throws Error naming `source` and
// the field.
DeepseekV41Config parse_deepseek_v41_config(const nlohmann::json& root, const std::string& source);
// The registry's reader: the shared-shape part of parse_deepseek_v41_config.
ModelConfig parse_deepseek_v41_model_config(const nlohmann::json& root, const std::string& source);
// The config a DSpark drafter stage is built with: `c` with the drafter's routed experts and top-k.
DeepseekV41Config dspark_stage_config(const DeepseekV41Config& c);
// Reads `path` (config.json, or a directory holding one).
DeepseekV41Config load_deepseek_v41_config(const std::string& path);

}  // namespace deepinfer
