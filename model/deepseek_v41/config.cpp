#include "model/deepseek_v41/config.h"

#include <algorithm>

#include "core/json.h"
#include "model/config_fields.h"

namespace deepinfer {

using config_fields::Fields;
using config_fields::json;
using config_fields::require;
using config_fields::str;

namespace {

const std::vector<int> kReleasedRatios = [] {
  std::vector<int> r = {0, 0};
  r.insert(r.end(), 18, 2);
  r.insert(r.end(), 20, 1);
  return r;
}();
const std::vector<int> kReleasedKvSources = {2, 8, 14, 20};
const std::vector<int> kReleasedIndexSources = {2, 8, 14, 20, 24, 28, 32, 36};

std::vector<int64_t> int_list(const Fields& f, const char* key) {
  std::vector<int64_t> out;
  const json* v = f.find(key);
  if (v == nullptr) return out;
  if (!v->is_array()) f.bad(key, "a list of integers");
  for (const json& e : *v) {
    if (!e.is_number_integer()) f.bad(key, "a list of integers");
    out.push_back(e.get<int64_t>());
  }
  return out;
}

std::string list_string(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Layer ids of `key`: each in [0, L), strictly ascending.
std::vector<int> layer_ids(const Fields& f, const char* key, const std::vector<int>& fallback,
                           int L) {
  if (!f.present(key)) return fallback;
  std::vector<int> out;
  for (int64_t id : int_list(f, key)) {
    require(id >= 0 && id < L, f.source(), key,
            "layer id " + str(id) + " does not fit num_hidden_layers = " + str(L) +
                " (ids are 0 .. " + str(L - 1) + ")");
    require(out.empty() || id > out.back(), f.source(), key,
            "layer ids must be strictly ascending");
    out.push_back(static_cast<int>(id));
  }
  return out;
}

// The DSpark drafter's fields (dspark.h). DeepSeek's config.json and the PR spell them `dspark_*`
// in the text config; DeepSpec's drafter configs spell them without the prefix (block_size,
// mask_token_id, target_layer_ids, markov_rank, markov_head_type, enable_confidence_head,
// confidence_head_with_markov), read here from a `dspark_config` object. A field given both ways
// must agree. Values are checked where the config declares drafter layers (num_nextn_predict_layers).
void parse_dspark(const Fields& f, DeepseekV41Config& v) {
  const std::string& src = f.source();
  const int L = v.num_layers();
  const bool drafter = v.base.num_nextn_predict_layers > 0;
  static const json kEmpty = json::object();
  const json* sub = f.find("dspark_config");
  if (sub != nullptr && !sub->is_object()) f.bad("dspark_config", "an object");
  const Fields g(sub != nullptr ? *sub : kEmpty, src, "dspark_config.");
  // The spelling in use: `ours` at the top, else `theirs` under dspark_config; both must agree.
  auto pick = [&](const char* ours, const char* theirs) -> const char* {
    const json* a = f.find(ours);
    const json* b = g.find(theirs);
    if (a != nullptr && b != nullptr && *a != *b)
      fail(src, ": field '", ours, "' is ", json_snippet(*a), " but 'dspark_config.", theirs, "' is ",
           json_snippet(*b), " (the same DSpark field spelled two ways must agree)");
    return a != nullptr || b == nullptr ? ours : theirs;
  };
  auto ours = [&](const char* key, const char* picked) { return std::string(key) == picked; };
  auto integer = [&](const char* key, const char* theirs, int64_t fallback) {
    const char* k = pick(key, theirs);
    return ours(key, k) ? f.integer(key, fallback) : g.integer(theirs, fallback);
  };
  auto boolean = [&](const char* key, const char* theirs, bool fallback) {
    const char* k = pick(key, theirs);
    return ours(key, k) ? f.boolean(key, fallback) : g.boolean(theirs, fallback);
  };
  v.dspark_block_size = static_cast<int>(integer("dspark_block_size", "block_size", 5));
  require(v.dspark_block_size >= 1 && v.dspark_block_size <= 16, src, pick("dspark_block_size", "block_size"),
          "block of " + str(v.dspark_block_size) +
              " draft positions (expected 1 .. 16: the engine verifies at most 16 drafts)");
  v.dspark_noise_token_id = integer("dspark_noise_token_id", "mask_token_id", 128799);
  require(!drafter || (v.dspark_noise_token_id >= 0 && v.dspark_noise_token_id < v.base.vocab_size), src,
          pick("dspark_noise_token_id", "mask_token_id"),
          str(v.dspark_noise_token_id) + " is not a token id (vocab_size " + str(v.base.vocab_size) + ")");
  v.dspark_markov_rank = integer("dspark_markov_rank", "markov_rank", 256);
  require(v.dspark_markov_rank >= 0 && v.dspark_markov_rank <= (int64_t{1} << 20), src,
          pick("dspark_markov_rank", "markov_rank"),
          str(v.dspark_markov_rank) + " (expected 0: no Markov head, or a rank > 0)");
  {
    const char* k = pick("dspark_markov_head_type", "markov_head_type");
    const std::string type = ours("dspark_markov_head_type", k) ? f.string(k, "vanilla") : g.string(k, "vanilla");
    require(type == "vanilla", src, k,
            "'" + type +
                "' is not supported (DeepSeek's drafters use 'vanilla': a rank-r bias from the previous token)");
  }
  v.dspark_confidence_head = boolean("dspark_enable_confidence_head", "enable_confidence_head", true);
  v.dspark_confidence_with_markov =
      boolean("dspark_confidence_head_with_markov", "confidence_head_with_markov", v.dspark_markov_rank > 0);
  require(!v.dspark_confidence_head || !v.dspark_confidence_with_markov || v.dspark_markov_rank > 0, src,
          pick("dspark_confidence_head_with_markov", "confidence_head_with_markov"),
          "true needs a Markov head (dspark_markov_rank > 0)");
  v.dspark_n_routed_experts = f.small_int("dspark_n_routed_experts", 128);
  v.dspark_num_experts_per_tok = f.small_int("dspark_num_experts_per_tok", 3);
  require(v.dspark_n_routed_experts > 0, src, "dspark_n_routed_experts", "must be > 0");
  require(v.dspark_num_experts_per_tok > 0 && v.dspark_num_experts_per_tok <= v.dspark_n_routed_experts, src,
          "dspark_num_experts_per_tok", "must be in [1, dspark_n_routed_experts]");
  std::vector<int> fallback;  // the PR's: the last 3 layers that are not KV sources
  for (int i = 0; i < L; ++i)
    if (!v.is_kv_source(i)) fallback.push_back(i);
  if (fallback.size() > 3) fallback.erase(fallback.begin(), fallback.end() - 3);
  const char* k = pick("dspark_target_layer_ids", "target_layer_ids");
  v.dspark_target_layers =
      ours("dspark_target_layer_ids", k) ? layer_ids(f, k, fallback, L) : layer_ids(g, k, fallback, L);
  require(!v.dspark_target_layers.empty() || !drafter, src, k,
          "the drafter (num_nextn_predict_layers " + str(v.base.num_nextn_predict_layers) +
              ") needs at least one target layer to condition on");
}

}  // namespace

bool DeepseekV41Config::is_kv_source(int layer) const {
  return std::find(kv_source_layers.begin(), kv_source_layers.end(), layer) !=
         kv_source_layers.end();
}

bool DeepseekV41Config::is_index_source(int layer) const {
  return std::find(index_source_layers.begin(), index_source_layers.end(), layer) !=
         index_source_layers.end();
}

int DeepseekV41Config::kv_source_of(int layer) const {
  int out = -1;
  for (int s : kv_source_layers)
    if (s <= layer) out = s;
  return out;
}

int DeepseekV41Config::index_source_of(int layer) const {
  int out = -1;
  for (int s : index_source_layers)
    if (s <= layer) out = s;
  return out;
}

DeepseekV41Config parse_deepseek_v41_config(const json& root, const std::string& source) {
  if (!root.is_object()) fail(source, ": config.json must be a JSON object");
  // Composite (released): the text model under text_config, quantization_config at the top.
  json text = root;
  std::string src = source;
  if (const auto it = root.find("text_config"); it != root.end() && !it->is_null()) {
    if (!it->is_object())
      fail(source, ": field 'text_config': expected an object, got ", json_snippet(*it));
    text = *it;
    src = source + " (text_config)";
    if (!text.contains("quantization_config") && root.contains("quantization_config"))
      text["quantization_config"] = root["quantization_config"];
  }
  DeepseekV41Config v;
  parse_v4_family_config(text, src, {"deepseek_v41", 5120, 2304, 1280, 32, 40, 384, 3, 1e-20}, v);
  v.base.model_type = Fields(root, source).string("model_type", "deepseek_v41");
  v.base.source = source;  // the file (the loader reads it again); `src` names the part in messages
  Fields f(text, src);
  const int L = v.num_layers(), nextn = v.base.num_nextn_predict_layers;

  // Per-layer compression ratios (DSpark entries after the main layers are window-only: ignored).
  if (f.present("compress_ratios")) {
    const std::vector<int64_t> r = int_list(f, "compress_ratios");
    require(static_cast<int>(r.size()) >= L && static_cast<int>(r.size()) <= L + nextn, src,
            "compress_ratios",
            "has " + str(static_cast<int64_t>(r.size())) +
                " entries, expected num_hidden_layers = " + str(L) +
                " (up to num_hidden_layers + num_nextn_predict_layers = " + str(L + nextn) + ")");
    for (int i = 0; i < L; ++i) {
      require(r[static_cast<size_t>(i)] >= 0 && r[static_cast<size_t>(i)] <= 1 << 20, src,
              "compress_ratios",
              "entry " + str(i) + " is " + str(r[static_cast<size_t>(i)]) +
                  " (expected 0, 1 or a pooling ratio > 1)");
      v.compress_ratios.push_back(static_cast<int>(r[static_cast<size_t>(i)]));
    }
  } else if (L == static_cast<int>(kReleasedRatios.size())) {
    v.compress_ratios = kReleasedRatios;
  } else {  // the released pattern scaled to L layers (the PR's rule)
    const int slide = std::min(2, L), enc = std::max(0, (L - slide + 1) / 2);
    v.compress_ratios.assign(static_cast<size_t>(slide), 0);
    v.compress_ratios.insert(v.compress_ratios.end(), static_cast<size_t>(enc), 2);
    v.compress_ratios.insert(v.compress_ratios.end(),
                             static_cast<size_t>(std::max(0, L - slide - enc)), 1);
  }

  // Sources. Defaults as the PR: the released ones for the released schedule (a prefix of it
  // included, whose ids then may not fit), else the first layer of each run of equal ratios.
  std::vector<int> kv_default;
  if (std::equal(v.compress_ratios.begin(), v.compress_ratios.end(), kReleasedRatios.begin(),
                 kReleasedRatios.begin() +
                     std::min<size_t>(kReleasedRatios.size(), v.compress_ratios.size())) &&
      v.compress_ratios.size() <= kReleasedRatios.size()) {
    kv_default = kReleasedKvSources;
    for (int id : kv_default)
      require(id < L, src, "kv_source_layer_ids",
              "absent, and the released default " + list_string(kReleasedKvSources) +
                  " does not fit num_hidden_layers = " + str(L) + ": give kv_source_layer_ids");
  } else {
    for (int i = 0; i < L; ++i)
      if (v.compress_ratios[static_cast<size_t>(i)] > 0 &&
          (i == 0 || v.compress_ratios[static_cast<size_t>(i - 1)] !=
                         v.compress_ratios[static_cast<size_t>(i)]))
        kv_default.push_back(i);
  }
  v.kv_source_layers = layer_ids(f, "kv_source_layer_ids", kv_default, L);
  v.index_source_layers = layer_ids(
      f, "index_source_layer_ids",
      v.kv_source_layers == kReleasedKvSources ? kReleasedIndexSources : v.kv_source_layers, L);
  for (int s : v.kv_source_layers) {
    require(
        v.ratio(s) > 0, src, "kv_source_layer_ids",
        "layer " + str(s) +
            " has compress_ratios entry 0 (window only): a KV source needs a compressed branch");
    require(v.is_index_source(s), src, "index_source_layer_ids",
            "must hold every KV source (layer " + str(s) + " of kv_source_layer_ids " +
                list_string(v.kv_source_layers) + " makes its group's indexer keys)");
  }
  for (int s : v.index_source_layers) {
    require(v.ratio(s) > 0, src, "index_source_layer_ids",
            "layer " + str(s) +
                " has compress_ratios entry 0 (window only): an index source needs a compressed "
                "branch");
    require(v.kv_source_of(s) >= 0, src, "index_source_layer_ids",
            "layer " + str(s) +
                " has no kv_source_layer_ids entry at or before it to publish the indexer keys");
  }
  for (int l = 0; l < L; ++l) {
    if (v.ratio(l) == 0) continue;
    const int s = v.kv_source_of(l);
    require(s >= 0, src, "kv_source_layer_ids",
            "layer " + str(l) + " has compress_ratios entry " + str(v.ratio(l)) +
                " but no KV source at or before it (kv_source_layer_ids " +
                list_string(v.kv_source_layers) + ")");
    require(v.ratio(l) == v.ratio(s), src, "compress_ratios",
            "layer " + str(l) + " has ratio " + str(v.ratio(l)) +
                " but reads the compressed KV of source layer " + str(s) + " (ratio " +
                str(v.ratio(s)) + ")");
  }
  {
    const int64_t c = f.integer(
        "candidate_source_layer_id",
        v.kv_source_layers.empty() ? -1 : static_cast<int64_t>(v.kv_source_layers.back()));
    require(
        c < L, src, "candidate_source_layer_id",
        str(c) + " does not fit num_hidden_layers = " + str(L) + " (negative: no two-level top-k)");
    v.candidate_source_layer = c < 0 ? -1 : static_cast<int>(c);
    require(
        v.candidate_source_layer < 0 || v.is_index_source(v.candidate_source_layer), src,
        "candidate_source_layer_id",
        str(c) + " must be one of index_source_layer_ids " + list_string(v.index_source_layers));
  }
  for (int s :
       v.index_source_layers)  // the candidates are blocks of the candidate source's entries
    require(v.candidate_source_layer < 0 || s <= v.candidate_source_layer ||
                v.kv_source_of(s) == v.kv_source_of(v.candidate_source_layer),
            src, "candidate_source_layer_id",
            "index source " + str(s) + " after candidate source " + str(v.candidate_source_layer) +
                " reads the entries of KV source " + str(v.kv_source_of(s)) +
                ", not those of KV source " + str(v.kv_source_of(v.candidate_source_layer)) +
                " the candidate blocks are made of");
  v.candidate_topk_blocks = f.integer("candidate_topk_blocks", 2048);
  v.candidate_block_size = f.integer("candidate_block_size", 8);
  require(v.candidate_topk_blocks > 0, src, "candidate_topk_blocks", "must be > 0");
  require(v.candidate_block_size > 0, src, "candidate_block_size", "must be > 0");
  // The cache formats: window KV FP8 and indexer keys FP4 with a scale per 32 channels,
  // compressed KV FP4 with a scale per 16.
  require(v.head_dim % 32 == 0, src, "head_dim",
          str(v.head_dim) +
              " must be a multiple of 32 (the window KV holds one FP8 scale per 32 channels)");
  require(v.index_head_dim % 32 == 0, src, "index_head_dim",
          str(v.index_head_dim) +
              " must be a multiple of 32 (the indexer keys hold one FP4 scale per 32 channels)");
  v.gate_temp = f.number("gate_temp", 1.0);
  require(v.gate_temp > 0, src, "gate_temp", "must be > 0");
  const std::string topk_method = f.string("topk_method", "noaux_tc");
  require(topk_method == "noaux_tc", src, "topk_method",
          "'" + topk_method + "' is not supported (expected 'noaux_tc')");

  // Engram.
  v.engram_layers = layer_ids(f, "engram_layer_ids", {}, L);
  for (int64_t n : int_list(f, "engram_num_embeddings")) {
    require(n >= 0, src, "engram_num_embeddings", "table sizes must be >= 0");
    v.engram_num_embeddings.push_back(n);
  }
  if (!f.present("engram_num_embeddings"))
    v.engram_num_embeddings.assign(v.engram_layers.size(), 0);
  require(v.engram_num_embeddings.size() == v.engram_layers.size(), src, "engram_num_embeddings",
          "has " + str(static_cast<int64_t>(v.engram_num_embeddings.size())) +
              " entries but engram_layer_ids " + list_string(v.engram_layers) + " has " +
              str(static_cast<int64_t>(v.engram_layers.size())));
  v.engram_vocab_size = f.integer("engram_vocab_size", 16000000);
  v.engram_max_ngram_size = f.small_int("engram_max_ngram_size", 4);
  v.engram_n_heads = f.small_int("engram_n_heads", 8);
  v.engram_head_dim = f.integer("engram_head_dim", 256);
  v.engram_pad_id = f.integer("engram_pad_id", 2);
  v.engram_compressed_vocab_size = f.integer("engram_compressed_vocab_size", 99092);
  require(v.engram_max_ngram_size >= 2, src, "engram_max_ngram_size",
          "must be >= 2 (2-grams and up)");
  require(v.engram_n_heads > 0, src, "engram_n_heads", "must be > 0");
  require(v.engram_head_dim > 0 && v.engram_head_dim % 32 == 0, src, "engram_head_dim",
          "must be a positive multiple of 32 (one scale per 32 channels)");
  require(v.engram_vocab_size > 0, src, "engram_vocab_size", "must be > 0");
  require(v.engram_compressed_vocab_size > 0, src, "engram_compressed_vocab_size", "must be > 0");
  require(v.engram_pad_id >= 0 && v.engram_pad_id < v.base.vocab_size, src, "engram_pad_id",
          str(v.engram_pad_id) + " is not a token id (vocab_size " + str(v.base.vocab_size) + ")");
  // The step's compressed ids live in an F32 cache (kv_layout.h): exact below 2^24.
  require(v.engram_compressed_vocab_size <= (int64_t{1} << 24), src, "engram_compressed_vocab_size",
          str(v.engram_compressed_vocab_size) + " exceeds 2^24 (the ids are cached as F32)");
  require(v.engram_layers.empty() || v.engram_compressed_vocab_size <= v.base.vocab_size, src, "engram_compressed_vocab_size",
          str(v.engram_compressed_vocab_size) + " exceeds vocab_size " + str(v.base.vocab_size) +
              " (the map only merges tokens)");
  for (size_t i = 0; i < v.engram_layers.size(); ++i)
    require(v.engram_num_embeddings[i] > 0 && v.engram_num_embeddings[i] < (int64_t{1} << 31), src,
            "engram_num_embeddings",
            "table of Engram layer " + str(v.engram_layers[i]) + " has " +
                str(v.engram_num_embeddings[i]) + " rows (needs 1 .. 2^31 - 1)");

  parse_dspark(f, v);
  return v;
}

namespace {

// V4.1's step counts are not written yet (shared compressed KV, Engram, delayed
// hyper-connections): bench reports its times without a roofline rather than V3's count.
class DeepseekV41Extras final : public ArchitectureExtras {
 public:
  std::optional<StepCounts> count_step(const ModelConfig&, const StepQuery&) const override {
    StepCounts none;
    none.modeled = false;
    return none;
  }
};

}  // namespace

ModelConfig parse_deepseek_v41_model_config(const json& root, const std::string& source) {
  ModelConfig base = parse_deepseek_v41_config(root, source).base;
  base.extras = std::make_shared<const DeepseekV41Extras>();
  return base;
}

DeepseekV41Config dspark_stage_config(const DeepseekV41Config& c) {
  DeepseekV41Config d = c;
  d.base.n_routed_experts = c.dspark_n_routed_experts;
  d.base.num_experts_per_tok = c.dspark_num_experts_per_tok;
  return d;
}

DeepseekV41Config load_deepseek_v41_config(const std::string& path) {
  std::string file;
  const json root = read_config_json(path, file);
  return parse_deepseek_v41_config(root, file);
}

}  // namespace deepinfer
