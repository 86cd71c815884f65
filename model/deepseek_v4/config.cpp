#include "model/deepseek_v4/config.h"

#include <filesystem>
#include <optional>

#include "core/json.h"
#include "core/mapped_file.h"
#include "model/config_fields.h"
#include "model/deepseek_v4/step_counts.h"

namespace deepinfer {

using config_fields::Fields;
using config_fields::json;
using config_fields::require;
using config_fields::str;

namespace {

void parse_yarn(const json& obj, const std::string& source, const char* field, RopeScaling& y) {
  if (!obj.is_object()) fail(source, ": field '", field, "': expected an object, got ", json_snippet(obj));
  Fields f(obj, source, std::string(field) + ".");
  const std::string type = f.string("rope_type", f.string("type", "default"));
  require(type == "default" || type == "yarn", source, field,
          "rope type '" + type + "' is not supported (expected 'default' or 'yarn')");
  y.type = type;
  if (type != "yarn") return;
  y.factor = f.number("factor", std::nullopt);
  y.original_max_position_embeddings = f.integer("original_max_position_embeddings", std::nullopt);
  y.beta_fast = f.number("beta_fast", 32.0);
  y.beta_slow = f.number("beta_slow", 1.0);
  y.mscale = f.number("mscale", 1.0);
  y.mscale_all_dim = f.number("mscale_all_dim", 0.0);
  y.attention_factor = f.number("attention_factor", 1.0);
  y.truncate = f.boolean("truncate", true);
  require(y.factor > 0, source, field, "yarn 'factor' must be positive");
  require(y.original_max_position_embeddings > 0, source, field,
          "yarn 'original_max_position_embeddings' must be positive");
}

std::vector<std::string> string_list(const Fields& f, const char* key) {
  const json* v = f.find(key);
  std::vector<std::string> out;
  if (v == nullptr) return out;
  if (!v->is_array()) f.bad(key, "a list of strings");
  for (const json& e : *v) {
    if (!e.is_string()) f.bad(key, "a list of strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

}  // namespace

int DeepseekV4Config::ratio(int layer) const {
  switch (attention.at(static_cast<size_t>(layer))) {
    case V4AttentionKind::Csa: return csa_rate;
    case V4AttentionKind::Hca: return hca_rate;
    default: return 0;
  }
}

RopeDims V4FamilyConfig::main_rope_dims() const { return {rope_dim, rope_theta, RopeScaling{}}; }

RopeDims V4FamilyConfig::compress_rope_dims() const {
  return {rope_dim, compress_rope_theta, compress_rope};  // no scaling: factor 1 (not YaRN)
}

void parse_v4_family_config(const json& root, const std::string& source, const V4FamilyDefaults& d,
                            V4FamilyConfig& v) {
  if (!root.is_object()) fail(source, ": config.json must be a JSON object");
  Fields f(root, source);
  ModelConfig& c = v.base;
  c.source = source;
  c.model_type = f.string("model_type", d.model_type);
  c.vocab_size = f.integer("vocab_size", 129280);
  c.hidden_size = f.integer("hidden_size", d.hidden_size);
  c.moe_intermediate_size = f.integer("moe_intermediate_size", d.moe_intermediate_size);
  c.intermediate_size = c.moe_intermediate_size;
  c.num_hidden_layers = f.small_int("num_hidden_layers", d.num_hidden_layers);
  c.num_attention_heads = f.small_int("num_attention_heads", 64);
  c.q_lora_rank = f.integer("q_lora_rank", d.q_lora_rank);
  c.n_routed_experts = f.small_int("n_routed_experts", d.n_routed_experts);
  c.n_shared_experts = f.small_int("n_shared_experts", 1);
  c.num_experts_per_tok = f.small_int("num_experts_per_tok", 6);
  c.norm_topk_prob = f.boolean("norm_topk_prob", true);
  c.routed_scaling_factor = f.number("routed_scaling_factor", 1.5);
  c.rms_norm_eps = f.number("rms_norm_eps", d.rms_norm_eps);
  c.max_position_embeddings = f.integer("max_position_embeddings", 1048576);
  c.num_nextn_predict_layers = f.small_int("num_nextn_predict_layers", d.num_nextn_predict_layers);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.hidden_act = f.string("hidden_act", "silu");
  c.bos_token_id = f.integer("bos_token_id", 0);
  if (const json* eos = f.find("eos_token_id")) {
    if (eos->is_number_integer()) {
      c.eos_token_ids.push_back(eos->get<int64_t>());
    } else if (eos->is_array()) {
      for (const json& e : *eos) {
        if (!e.is_number_integer()) f.bad("eos_token_id", "an integer or a list of integers");
        c.eos_token_ids.push_back(e.get<int64_t>());
      }
    } else {
      f.bad("eos_token_id", "an integer or a list of integers");
    }
  } else if (!root.contains("eos_token_id")) {
    c.eos_token_ids.push_back(1);
  }
  const int L = c.num_hidden_layers;
  require(c.vocab_size > 0, source, "vocab_size", "must be > 0, got " + str(c.vocab_size));
  require(c.hidden_size > 0, source, "hidden_size", "must be > 0, got " + str(c.hidden_size));
  require(L > 0, source, "num_hidden_layers", "must be > 0, got " + str(L));
  require(c.num_attention_heads > 0, source, "num_attention_heads", "must be > 0");
  require(c.q_lora_rank > 0, source, "q_lora_rank", "must be > 0, got " + str(c.q_lora_rank));
  require(c.n_routed_experts > 0, source, "n_routed_experts", "must be > 0 (every layer is MoE)");
  require(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.n_routed_experts, source,
          "num_experts_per_tok",
          str(c.num_experts_per_tok) + " must be in [1, n_routed_experts = " + str(c.n_routed_experts) + "]");
  require(c.n_shared_experts >= 0 && c.n_shared_experts <= 1, source, "n_shared_experts",
          "must be 0 or 1, got " + str(c.n_shared_experts));
  require(c.moe_intermediate_size > 0, source, "moe_intermediate_size", "must be > 0");
  require(c.num_nextn_predict_layers >= 0, source, "num_nextn_predict_layers", "must be >= 0");
  require(c.hidden_act == "silu", source, "hidden_act", "'" + c.hidden_act + "' is not supported (expected 'silu')");
  const std::string scoring = f.string("scoring_func", "sqrtsoftplus");
  require(scoring == "sqrtsoftplus", source, "scoring_func",
          "'" + scoring + "' is not supported for " + c.model_type + " (expected 'sqrtsoftplus')");
  require(c.norm_topk_prob, source, "norm_topk_prob", "must be true for " + c.model_type + " (weights are renormalised)");
  const int64_t kv_heads = f.integer("num_key_value_heads", 1);
  require(kv_heads == 1, source, "num_key_value_heads", "must be 1 (one K=V latent), got " + str(kv_heads));

  v.head_dim = f.integer("head_dim", 512);
  require(v.head_dim > 0, source, "head_dim", "must be > 0");
  if (f.present("qk_rope_head_dim")) {
    v.rope_dim = f.integer("qk_rope_head_dim", std::nullopt);
  } else {
    const double prf = f.number("partial_rotary_factor", 64.0 / 512.0);
    v.rope_dim = static_cast<int64_t>(static_cast<double>(v.head_dim) * prf);
  }
  require(v.rope_dim > 0 && v.rope_dim % 2 == 0 && v.rope_dim <= v.head_dim, source, "qk_rope_head_dim",
          "the rotated dims must be even and in (0, head_dim = " + str(v.head_dim) + "], got " + str(v.rope_dim));
  v.o_groups = f.integer("o_groups", 8);
  v.o_lora_rank = f.integer("o_lora_rank", 1024);
  require(v.o_groups > 0 && c.num_attention_heads % v.o_groups == 0, source, "o_groups",
          str(v.o_groups) + " must divide num_attention_heads = " + str(c.num_attention_heads));
  require(v.o_lora_rank > 0, source, "o_lora_rank", "must be > 0");
  v.sliding_window = f.integer("sliding_window", 128);
  require(v.sliding_window > 0, source, "sliding_window", "must be > 0, got " + str(v.sliding_window));
  v.index_n_heads = f.integer("index_n_heads", d.index_n_heads);
  v.index_head_dim = f.integer("index_head_dim", 128);
  v.index_topk = f.integer("index_topk", 512);
  require(v.index_n_heads > 0, source, "index_n_heads", "must be > 0");
  require(v.index_head_dim >= v.rope_dim, source, "index_head_dim",
          "must be >= the rotated dims " + str(v.rope_dim) + ", got " + str(v.index_head_dim));
  require(v.index_topk > 0, source, "index_topk", "must be > 0");
  v.hc_mult = f.small_int("hc_mult", 4);
  v.hc_sinkhorn_iters = f.small_int("hc_sinkhorn_iters", 20);
  v.hc_eps = f.number("hc_eps", 1e-6);
  require(v.hc_mult > 0, source, "hc_mult", "must be > 0");
  require(v.hc_sinkhorn_iters > 0, source, "hc_sinkhorn_iters", "must be > 0");
  v.swiglu_limit = f.number("swiglu_limit", 10.0);
  require(v.swiglu_limit > 0, source, "swiglu_limit", "must be > 0");

  // RoPE.
  v.rope_theta = f.number("rope_theta", 10000.0);
  v.compress_rope_theta = f.number("compress_rope_theta", 160000.0);
  if (const json* rp = f.find("rope_parameters")) {
    if (!rp->is_object()) f.bad("rope_parameters", "an object");
    if (rp->contains("main") && rp->contains("compress")) {
      Fields m((*rp)["main"], source, "rope_parameters.main.");
      Fields cp((*rp)["compress"], source, "rope_parameters.compress.");
      v.rope_theta = m.number("rope_theta", v.rope_theta);
      v.compress_rope_theta = cp.number("rope_theta", v.compress_rope_theta);
      RopeScaling main_scaling;
      parse_yarn((*rp)["main"], source, "rope_parameters.main", main_scaling);
      require(!main_scaling.is_yarn(), source, "rope_parameters.main",
              "YaRN on the window-only layers is not supported (DeepSeek-V4 scales the compressed layers only)");
      parse_yarn((*rp)["compress"], source, "rope_parameters.compress", v.compress_rope);
    } else {
      Fields flat(*rp, source, "rope_parameters.");
      v.rope_theta = flat.number("rope_theta", v.rope_theta);
      parse_yarn(*rp, source, "rope_parameters", v.compress_rope);
    }
  } else if (const json* rs = f.find("rope_scaling")) {
    parse_yarn(*rs, source, "rope_scaling", v.compress_rope);
  }
  require(v.rope_theta > 0 && v.compress_rope_theta > 0, source, "rope_theta", "RoPE bases must be positive");

  // Quantization (DeepSeek ships FP8 e4m3 128x128 with ue8m0 scales; experts FP4).
  if (const json* q = f.find("quantization_config")) {
    if (!q->is_object()) f.bad("quantization_config", "an object");
    Fields qf(*q, source, "quantization_config.");
    c.quantization.quant_method = qf.string("quant_method", "");
    require(c.quantization.quant_method == "fp8", source, "quantization_config.quant_method",
            "'" + c.quantization.quant_method + "' is not supported (expected 'fp8')");
    c.quantization.fmt = qf.string("fmt", "e4m3");
    require(c.quantization.fmt == "e4m3", source, "quantization_config.fmt", "expected 'e4m3'");
    if (const json* b = qf.find("weight_block_size")) {
      if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number_integer() || !(*b)[1].is_number_integer() ||
          (*b)[0].get<int64_t>() <= 0 || (*b)[1].get<int64_t>() <= 0 || (*b)[0].get<int64_t>() > 65536 ||
          (*b)[1].get<int64_t>() > 65536)
        qf.bad("weight_block_size", "[block_n, block_k] positive integers");
      c.quantization.block_n = (*b)[0].get<int>();
      c.quantization.block_k = (*b)[1].get<int>();
    }
  }

  // Shared-shape view.
  c.kv_lora_rank = v.head_dim;
  c.v_head_dim = v.head_dim;
  c.qk_rope_head_dim = v.rope_dim;
  c.qk_nope_head_dim = v.head_dim - v.rope_dim;
  c.first_k_dense_replace = 0;
  c.rope_theta = v.rope_theta;
  c.rope_interleave = true;
  c.scoring_func = scoring;
}

DeepseekV4Config parse_deepseek_v4_config(const json& root, const std::string& source) {
  DeepseekV4Config v;
  parse_v4_family_config(root, source, {"deepseek_v4", 4096, 2048, 1024, 64, 43, 256, 1, 1e-6}, v);
  Fields f(root, source);
  const ModelConfig& c = v.base;
  const int L = c.num_hidden_layers;
  // Compression rates.
  if (const json* rates = f.find("compress_rates")) {
    if (!rates->is_object()) f.bad("compress_rates", "an object");
    Fields r(*rates, source, "compress_rates.");
    v.csa_rate = r.small_int("compressed_sparse_attention", 4);
    v.hca_rate = r.small_int("heavily_compressed_attention", 128);
  }
  v.csa_rate = f.small_int("compress_rate_csa", v.csa_rate);
  v.hca_rate = f.small_int("compress_rate_hca", v.hca_rate);
  require(v.csa_rate > 0, source, "compress_rates.compressed_sparse_attention", "must be > 0, got " + str(v.csa_rate));
  require(v.hca_rate > 0, source, "compress_rates.heavily_compressed_attention", "must be > 0, got " + str(v.hca_rate));

  // Per-layer attention kinds.
  const std::vector<std::string> types = string_list(f, "layer_types");
  if (!types.empty()) {
    require(static_cast<int>(types.size()) == L, source, "layer_types",
            "has " + str(static_cast<int64_t>(types.size())) + " entries, expected num_hidden_layers = " + str(L));
    for (const std::string& t : types) {
      if (t == "sliding_attention") v.attention.push_back(V4AttentionKind::Window);
      else if (t == "compressed_sparse_attention") v.attention.push_back(V4AttentionKind::Csa);
      else if (t == "heavily_compressed_attention") v.attention.push_back(V4AttentionKind::Hca);
      else fail(source, ": field 'layer_types': '", t, "' is not a DeepSeek-V4 attention type (expected "
                "sliding_attention, compressed_sparse_attention or heavily_compressed_attention)");
    }
  } else if (const json* ratios = f.find("compress_ratios")) {
    if (!ratios->is_array()) f.bad("compress_ratios", "a list of integers");
    const int64_t n = static_cast<int64_t>(ratios->size());
    require(n == L || n == L + c.num_nextn_predict_layers, source, "compress_ratios",
            "has " + str(n) + " entries, expected num_hidden_layers = " + str(L) +
                " (or that plus num_nextn_predict_layers = " + str(L + c.num_nextn_predict_layers) + ")");
    require(v.csa_rate != v.hca_rate, source, "compress_ratios",
            "cannot tell CSA from HCA layers when both rates are " + str(v.csa_rate));
    for (int64_t i = 0; i < n; ++i) {
      const json& e = (*ratios)[static_cast<size_t>(i)];
      if (!e.is_number_integer()) f.bad("compress_ratios", "a list of integers");
      const int64_t r = e.get<int64_t>();
      V4AttentionKind kind;
      if (r == 0) kind = V4AttentionKind::Window;
      else if (r == v.csa_rate) kind = V4AttentionKind::Csa;
      else if (r == v.hca_rate) kind = V4AttentionKind::Hca;
      else fail(source, ": field 'compress_ratios': entry ", i, " is ", r, ", which is not supported (expected 0, ",
                v.csa_rate, " (CSA) or ", v.hca_rate, " (HCA))");
      if (i < L) v.attention.push_back(kind);
      else require(kind == V4AttentionKind::Window, source, "compress_ratios",
                   "entry " + str(i) + " (an MTP layer) must be 0: the MTP block is window-only");
    }
  } else {
    for (int i = 0; i < L; ++i)
      v.attention.push_back(i < 2 ? V4AttentionKind::Hca
                                  : ((i - 2) % 2 ? V4AttentionKind::Csa : V4AttentionKind::Hca));
  }

  // Per-layer MoE kinds.
  const std::vector<std::string> mlp = string_list(f, "mlp_layer_types");
  if (!mlp.empty()) {
    require(static_cast<int>(mlp.size()) == L, source, "mlp_layer_types",
            "has " + str(static_cast<int64_t>(mlp.size())) + " entries, expected num_hidden_layers = " + str(L));
    for (const std::string& t : mlp) {
      require(t == "hash_moe" || t == "moe", source, "mlp_layer_types",
              "'" + t + "' is not a DeepSeek-V4 MLP type (expected hash_moe or moe)");
      v.hash_moe.push_back(t == "hash_moe");
    }
  } else {
    const int n_hash = f.small_int("num_hash_layers", 3);
    require(n_hash >= 0, source, "num_hash_layers", "must be >= 0, got " + str(n_hash));
    for (int i = 0; i < L; ++i) v.hash_moe.push_back(i < n_hash);
  }

  return v;
}

namespace {

// What the shared ModelConfig cannot say of V4: its step counts (model/deepseek_v4/step_counts.h).
class DeepseekV4Extras final : public ArchitectureExtras {
 public:
  explicit DeepseekV4Extras(DeepseekV4Config config) : config_(std::move(config)) {}
  std::optional<StepCounts> count_step(const ModelConfig&, const StepQuery& query) const override {
    return count_v4_step(config_, query);
  }

 private:
  DeepseekV4Config config_;
};

}  // namespace

ModelConfig parse_deepseek_v4_model_config(const json& root, const std::string& source) {
  DeepseekV4Config v4 = parse_deepseek_v4_config(root, source);
  ModelConfig base = v4.base;
  base.extras = std::make_shared<const DeepseekV4Extras>(std::move(v4));
  return base;
}

json read_config_json(const std::string& path, std::string& file) {
  file = path;
  if (std::filesystem::is_directory(path)) file = (std::filesystem::path(path) / "config.json").string();
  return parse_json(read_text_file(file), file);
}

DeepseekV4Config load_deepseek_v4_config(const std::string& path) {
  std::string file;
  const json root = read_config_json(path, file);
  return parse_deepseek_v4_config(root, file);
}

}  // namespace deepinfer
