// Config reading for the DeepSeek-V2/V3 family (model_type deepseek_v3 and
// deepseek_v2), with the transformers 5.17 defaults of each; the ModelConfig
// methods (derived quantities, summary) live here too.
#include "model/deepseek_v3/config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "model/config_fields.h"

namespace deepinfer {

namespace {

using config_fields::Fields;
using config_fields::json;
using config_fields::require;
using config_fields::str;

// YaRN/default rope from either spelling (see config.h).
void parse_rope(const Fields& top, ModelConfig& c) {
  const double top_theta = top.number("rope_theta", 10000.0);
  const json* params = top.find("rope_parameters");
  const char* field = "rope_parameters";
  if (params == nullptr) {
    params = top.find("rope_scaling");
    field = "rope_scaling";
  }
  c.rope_theta = top_theta;
  if (params == nullptr) return;  // plain RoPE
  if (!params->is_object()) top.bad(field, "an object");
  Fields p(*params, c.source, std::string(field) + ".");
  c.rope_theta = p.number("rope_theta", top_theta);
  // "rope_type" (transformers 5) or "type" (official configs).
  c.rope_scaling.type = p.string("rope_type", p.string("type", "default"));
  if (c.rope_scaling.type == "default") return;
  if (c.rope_scaling.type != "yarn") {
    fail(c.source, ": field '", field, ".rope_type': '", c.rope_scaling.type,
         "' is not supported (expected 'default' or 'yarn')");
  }
  RopeScaling& y = c.rope_scaling;
  y.original_max_position_embeddings =
      p.integer("original_max_position_embeddings", c.max_position_embeddings);
  // transformers: a null factor means max_position_embeddings / original.
  y.factor = p.number("factor", static_cast<double>(c.max_position_embeddings) /
                                    static_cast<double>(std::max<int64_t>(
                                        y.original_max_position_embeddings, 1)));
  // beta_* use `or`: 0 also means the default.
  y.beta_fast = p.number("beta_fast", 32.0);
  if (y.beta_fast == 0) y.beta_fast = 32.0;
  y.beta_slow = p.number("beta_slow", 1.0);
  if (y.beta_slow == 0) y.beta_slow = 1.0;
  y.mscale = p.number("mscale", 0.0);
  y.mscale_all_dim = p.number("mscale_all_dim", 0.0);
  y.attention_factor = p.number("attention_factor", -1.0);
  y.truncate = p.boolean("truncate", true);
  require(y.factor > 0 && std::isfinite(y.factor), c.source, field,
          "yarn 'factor' must be a positive number");
  require(y.original_max_position_embeddings > 0, c.source, field,
          "yarn 'original_max_position_embeddings' must be positive");
}

void parse_quantization(const Fields& top, ModelConfig& c) {
  const json* q = top.find("quantization_config");
  if (q == nullptr) return;
  if (!q->is_object()) top.bad("quantization_config", "an object");
  Fields f(*q, c.source, "quantization_config.");
  QuantizationConfig& qc = c.quantization;
  qc.quant_method = f.string("quant_method", "");
  if (qc.quant_method != "fp8") {
    fail(c.source, ": field 'quantization_config.quant_method': '", qc.quant_method,
         "' is not supported (expected 'fp8')");
  }
  qc.fmt = f.string("fmt", "e4m3");
  require(qc.fmt == "e4m3", c.source, "quantization_config.fmt",
          "'" + qc.fmt + "' is not supported (expected 'e4m3')");
  qc.activation_scheme = f.string("activation_scheme", "dynamic");
  if (const json* sf = f.find("scale_fmt"); sf != nullptr && !sf->is_null()) {
    if (!sf->is_string()) f.bad("scale_fmt", "a string ('ue8m0') or null");
    qc.scale_fmt = sf->get<std::string>();
    require(qc.scale_fmt == "ue8m0", c.source, "quantization_config.scale_fmt",
            "'" + qc.scale_fmt + "' is not supported (expected 'ue8m0' or null)");
  }
  if (const json* b = f.find("weight_block_size")) {
    if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number_integer() ||
        !(*b)[1].is_number_integer() || (*b)[0].get<int64_t>() <= 0 ||
        (*b)[1].get<int64_t>() <= 0 || (*b)[0].get<int64_t>() > 65536 ||
        (*b)[1].get<int64_t>() > 65536) {
      f.bad("weight_block_size", "[block_n, block_k] positive integers");
    }
    qc.block_n = (*b)[0].get<int>();
    qc.block_k = (*b)[1].get<int>();
  }
}

void validate(const ModelConfig& c) {
  const std::string& s = c.source;
  auto positive = [&](int64_t v, const char* field) {
    require(v > 0, s, field, "must be > 0, got " + str(v));
  };
  positive(c.vocab_size, "vocab_size");
  positive(c.hidden_size, "hidden_size");
  positive(c.intermediate_size, "intermediate_size");
  positive(c.num_hidden_layers, "num_hidden_layers");
  positive(c.num_attention_heads, "num_attention_heads");
  require(c.q_lora_rank >= 0, s, "q_lora_rank", "must be null or > 0, got " + str(c.q_lora_rank));
  positive(c.kv_lora_rank, "kv_lora_rank");
  positive(c.qk_nope_head_dim, "qk_nope_head_dim");
  positive(c.qk_rope_head_dim, "qk_rope_head_dim");
  require(c.qk_rope_head_dim % 2 == 0, s, "qk_rope_head_dim",
          "must be even (rotated in pairs), got " + str(c.qk_rope_head_dim));
  positive(c.v_head_dim, "v_head_dim");
  positive(c.max_position_embeddings, "max_position_embeddings");
  require(c.rms_norm_eps > 0, s, "rms_norm_eps", "must be > 0");
  require(c.rope_theta > 0, s, "rope_theta", "must be > 0");
  require(c.hidden_act == "silu", s, "hidden_act", "'" + c.hidden_act + "' is not supported (expected 'silu')");
  require(c.num_nextn_predict_layers >= 0, s, "num_nextn_predict_layers",
          "must be >= 0, got " + str(c.num_nextn_predict_layers));
  require(c.first_k_dense_replace >= 0, s, "first_k_dense_replace",
          "must be >= 0, got " + str(c.first_k_dense_replace));
  require(c.moe_layer_freq >= 1, s, "moe_layer_freq", "must be >= 1, got " + str(c.moe_layer_freq));
  require(c.n_routed_experts >= 0, s, "n_routed_experts",
          "must be >= 0, got " + str(c.n_routed_experts));
  if (c.n_routed_experts == 0) return;  // dense model: MoE fields unused

  positive(c.moe_intermediate_size, "moe_intermediate_size");
  require(c.n_shared_experts >= 0, s, "n_shared_experts", "must be >= 0, got " + str(c.n_shared_experts));
  require(c.num_experts_per_tok >= 1 && c.num_experts_per_tok <= c.n_routed_experts, s,
          "num_experts_per_tok",
          "must be in [1, n_routed_experts = " + str(c.n_routed_experts) + "], got " +
              str(c.num_experts_per_tok));
  require(c.n_group >= 1, s, "n_group", "must be >= 1, got " + str(c.n_group));
  require(c.n_routed_experts % c.n_group == 0, s, "n_group",
          "n_routed_experts = " + str(c.n_routed_experts) + " is not divisible by n_group = " +
              str(c.n_group));
  require(c.topk_group >= 1 && c.topk_group <= c.n_group, s, "topk_group",
          "must be in [1, n_group = " + str(c.n_group) + "], got " + str(c.topk_group));
  const int experts_per_group = c.n_routed_experts / c.n_group;
  const bool grouped = c.scoring_func == "sigmoid" || c.topk_method == "group_limited_greedy";
  if (grouped) {
    require(c.num_experts_per_tok <= c.topk_group * experts_per_group, s, "num_experts_per_tok",
            str(c.num_experts_per_tok) + " exceeds the " + str(c.topk_group * experts_per_group) +
                " experts of the topk_group = " + str(c.topk_group) + " groups kept");
  }
  if (c.scoring_func == "sigmoid") {
    // The group score is the sum of each group's top-2 biased scores.
    require(experts_per_group >= 2, s, "n_group",
            "needs at least 2 experts per group for noaux_tc routing, got " +
                str(experts_per_group));
  }
  require(c.routed_scaling_factor > 0, s, "routed_scaling_factor", "must be > 0");
}

}  // namespace

ModelConfig parse_deepseek_v3_config(const json& root, const std::string& source,
                                     DeepseekV3Family family) {
  Fields f(root, source);
  ModelConfig c;
  c.source = source;
  c.model_type = f.string("model_type", "");
  const bool v3 = family == DeepseekV3Family::V3;

  // Architecture sizes have no safe default: a missing one is an error.
  c.vocab_size = f.integer("vocab_size", std::nullopt);
  c.hidden_size = f.integer("hidden_size", std::nullopt);
  c.intermediate_size = f.integer("intermediate_size", std::nullopt);
  c.num_hidden_layers = f.small_int("num_hidden_layers", std::nullopt);
  c.num_attention_heads = f.small_int("num_attention_heads", std::nullopt);
  c.kv_lora_rank = f.integer("kv_lora_rank", std::nullopt);
  c.qk_nope_head_dim = f.integer("qk_nope_head_dim", std::nullopt);
  c.qk_rope_head_dim = f.integer("qk_rope_head_dim", std::nullopt);
  c.v_head_dim = f.integer("v_head_dim", std::nullopt);
  // q_lora_rank: absent -> transformers default 1536; null -> no compression.
  if (root.contains("q_lora_rank") && root["q_lora_rank"].is_null()) {
    c.q_lora_rank = 0;
  } else {
    c.q_lora_rank = f.integer("q_lora_rank", 1536);
    require(c.q_lora_rank > 0, source, "q_lora_rank", "must be null or > 0, got " + str(c.q_lora_rank));
  }
  c.hidden_act = f.string("hidden_act", "silu");

  // MoE, with each model type's transformers defaults. n_routed_experts null = dense.
  if (root.contains("n_routed_experts") && root["n_routed_experts"].is_null()) {
    c.n_routed_experts = 0;
  } else {
    c.n_routed_experts = f.small_int("n_routed_experts", v3 ? 256 : 64);
  }
  c.moe_intermediate_size = f.integer("moe_intermediate_size", v3 ? 2048 : 1407);
  c.n_shared_experts = f.small_int("n_shared_experts", v3 ? 1 : 2);
  c.num_experts_per_tok =
      v3 ? f.small_int("num_experts_per_tok", 8)
         : (c.n_routed_experts > 0 ? f.small_int("num_experts_per_tok", std::nullopt) : 0);
  c.first_k_dense_replace = f.small_int("first_k_dense_replace", v3 ? 3 : 0);
  c.moe_layer_freq = f.small_int("moe_layer_freq", 1);
  c.n_group = f.small_int("n_group", v3 ? 8 : 1);
  c.topk_group = f.small_int("topk_group", v3 ? 4 : 1);
  c.norm_topk_prob = f.boolean("norm_topk_prob", v3);
  c.routed_scaling_factor = f.number("routed_scaling_factor", v3 ? 2.5 : 1.0);
  if (v3) {
    c.topk_method = f.string("topk_method", "noaux_tc");
    c.scoring_func = f.string("scoring_func", "sigmoid");
    require(c.topk_method == "noaux_tc", source, "topk_method",
            "'" + c.topk_method + "' is not supported for " + c.model_type + " (expected 'noaux_tc')");
    require(c.scoring_func == "sigmoid", source, "scoring_func",
            "'" + c.scoring_func + "' is not supported for " + c.model_type + " (expected 'sigmoid')");
  } else {
    c.topk_method = f.string("topk_method", "greedy");
    c.scoring_func = f.string("scoring_func", "softmax");
    require(c.topk_method == "greedy" || c.topk_method == "group_limited_greedy", source,
            "topk_method",
            "'" + c.topk_method + "' is not supported for deepseek_v2 (expected 'greedy' or "
            "'group_limited_greedy')");
    require(c.scoring_func == "softmax", source, "scoring_func",
            "'" + c.scoring_func + "' is not supported for deepseek_v2 (expected 'softmax')");
  }

  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  c.max_position_embeddings = f.integer("max_position_embeddings", v3 ? 4096 : 2048);
  parse_rope(f, c);
  c.rope_interleave = f.boolean("rope_interleave", true);
  // transformers 5 maps num_mtp_layers -> num_nextn_predict_layers (default 1 for V3).
  c.num_nextn_predict_layers =
      f.small_int("num_nextn_predict_layers", f.integer("num_mtp_layers", v3 ? 1 : 0));
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.bos_token_id = f.integer("bos_token_id", -1);
  if (const json* eos = f.find("eos_token_id")) {
    if (eos->is_number_integer()) {
      c.eos_token_ids.push_back(eos->get<int64_t>());
    } else if (eos->is_array()) {
      for (const auto& e : *eos) {
        if (!e.is_number_integer()) f.bad("eos_token_id", "an integer or a list of integers");
        c.eos_token_ids.push_back(e.get<int64_t>());
      }
    } else {
      f.bad("eos_token_id", "an integer or a list of integers");
    }
  }
  parse_quantization(f, c);
  validate(c);
  return c;
}

bool ModelConfig::is_moe_layer(int layer) const {
  return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
}

int ModelConfig::num_moe_layers() const {
  int n = 0;
  for (int l = 0; l < num_hidden_layers; ++l) n += is_moe_layer(l) ? 1 : 0;
  return n;
}

double ModelConfig::softmax_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope_scaling.type != "default" && rope_scaling.mscale_all_dim != 0.0) {
    const double m = yarn_get_mscale(rope_scaling.factor, rope_scaling.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

double ModelConfig::yarn_attention_factor() const { return rope_attention_factor(rope_scaling); }

MlaDims ModelConfig::mla_dims() const {
  MlaDims d;
  d.heads = num_attention_heads;
  d.q_lora_rank = q_lora_rank;
  d.kv_lora_rank = kv_lora_rank;
  d.qk_nope_head_dim = qk_nope_head_dim;
  d.qk_rope_head_dim = qk_rope_head_dim;
  d.v_head_dim = v_head_dim;
  d.rope_interleave = rope_interleave;
  d.softmax_scale = softmax_scale();
  return d;
}

FfnDims ModelConfig::ffn_dims() const {
  FfnDims d;
  d.hidden = hidden_size;
  d.max_intermediate = std::max({intermediate_size, shared_intermediate_size(), moe_intermediate_size});
  d.n_routed_experts = n_routed_experts;
  d.top_k = num_experts_per_tok;
  return d;
}

RopeDims ModelConfig::rope_dims() const { return {qk_rope_head_dim, rope_theta, rope_scaling}; }

MoeRouting ModelConfig::moe_routing() const {
  MoeRouting r;
  r.num_experts = n_routed_experts;
  r.top_k = num_experts_per_tok;
  r.num_groups = n_group;
  r.top_k_groups = topk_group;
  r.scaling = static_cast<float>(routed_scaling_factor);
  if (scoring_func == "sigmoid") {
    r.scoring = MoeRouting::Scoring::Sigmoid;
    r.use_bias = true;
    r.group_limited = n_group > 1;
    r.normalize = norm_topk_prob;
  } else {
    r.scoring = MoeRouting::Scoring::Softmax;
    r.use_bias = false;
    r.group_limited = topk_method == "group_limited_greedy";
    r.normalize = false;  // the transformers V2 router never renormalises
  }
  return r;
}

ParameterCount ModelConfig::parameter_count() const {
  const int64_t H = hidden_size;
  const int64_t heads = num_attention_heads;
  int64_t attention = kv_lora_rank + H * (kv_lora_rank + qk_rope_head_dim) +
                      kv_lora_rank * heads * (qk_nope_head_dim + v_head_dim) + heads * v_head_dim * H;
  attention += has_q_lora() ? H * q_lora_rank + q_lora_rank + q_lora_rank * heads * qk_head_dim()
                            : H * heads * qk_head_dim();
  if (extras) attention += extras->extra_attention_parameters(*this);  // e.g. V3.2's indexer
  const int64_t norms = 2 * H;
  const int64_t dense_mlp = 3 * H * intermediate_size;
  const int64_t expert = 3 * H * moe_intermediate_size;
  // Router weight only: e_score_correction_bias is a buffer, not a parameter
  // (transformers counts it nowhere either).
  const int64_t router = static_cast<int64_t>(n_routed_experts) * H;
  const int64_t moe_total = router + (n_routed_experts + n_shared_experts) * expert;
  const int64_t moe_active = router + (num_experts_per_tok + n_shared_experts) * expert;

  ParameterCount p;
  p.embedding = vocab_size * H * (tie_word_embeddings ? 1 : 2);
  p.total = p.embedding + H;  // + final norm
  p.active_per_token = p.total;
  for (int l = 0; l < num_hidden_layers; ++l) {
    p.total += attention + norms + (is_moe_layer(l) ? moe_total : dense_mlp);
    p.active_per_token += attention + norms + (is_moe_layer(l) ? moe_active : dense_mlp);
  }
  // MTP module: enorm, hnorm, eh_proj [H, 2H], one block, shared_head.norm.
  for (int k = 0; k < num_nextn_predict_layers; ++k) {
    const bool moe = is_moe_layer(num_hidden_layers + k);
    const int64_t extra = 3 * H + 2 * H * H + attention + norms;
    p.mtp_total += extra + (moe ? moe_total : dense_mlp);
    p.mtp_active_per_token += extra + (moe ? moe_active : dense_mlp);
  }
  return p;
}

std::string ModelConfig::summary() const {
  std::ostringstream os;
  os << "model_type             " << model_type << "\n"
     << "layers                 " << num_hidden_layers << " (" << num_moe_layers() << " MoE, "
     << num_hidden_layers - num_moe_layers() << " dense) + " << num_nextn_predict_layers
     << " MTP\n"
     << "hidden / vocab         " << hidden_size << " / " << vocab_size << "\n"
     << "attention (MLA)        " << num_attention_heads << " heads, q_lora_rank "
     << (has_q_lora() ? std::to_string(q_lora_rank) : std::string("none (q_proj)"))
     << ", kv_lora_rank " << kv_lora_rank << ", qk_nope " << qk_nope_head_dim << ", qk_rope "
     << qk_rope_head_dim << ", v " << v_head_dim << "\n"
     << "kv cache row           " << kv_row_dim() << " values per token per layer\n"
     << "softmax scale          " << softmax_scale() << "\n"
     << "rope                   theta " << rope_theta << ", " << rope_scaling.type;
  if (rope_scaling.is_yarn()) {
    os << " (factor " << rope_scaling.factor << ", original "
       << rope_scaling.original_max_position_embeddings << ", beta " << rope_scaling.beta_fast
       << "/" << rope_scaling.beta_slow << ", mscale " << rope_scaling.mscale << "/"
       << rope_scaling.mscale_all_dim << ")";
  }
  os << (rope_interleave ? ", interleaved" : ", halves") << "\n"
     << "max positions          " << max_position_embeddings << "\n";
  if (n_routed_experts > 0) {
    os << "MoE                    " << n_routed_experts << " routed (top-" << num_experts_per_tok
       << ") + " << n_shared_experts << " shared, intermediate " << moe_intermediate_size
       << ", " << scoring_func << "/" << topk_method << ", groups " << topk_group << " of "
       << n_group << ", scaling " << routed_scaling_factor
       << (norm_topk_prob ? ", normalized" : "") << "\n";
  }
  if (extras) os << extras->summary();
  os << "dense intermediate     " << intermediate_size << " (first " << first_k_dense_replace
     << " layers)\n"
     << "weights                "
     << (quantization.is_fp8() ? "fp8 e4m3, block " + std::to_string(quantization.block_n) + "x" +
                                     std::to_string(quantization.block_k)
                               : std::string("unquantized"))
     << (tie_word_embeddings ? ", tied embeddings" : "") << "\n";
  return os.str();
}

}  // namespace deepinfer
