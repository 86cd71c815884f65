// Assembles ModelWeights from named tensors, checking each against the config.
#include "model/weights.h"

#include <map>
#include <set>
#include <tuple>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "model/weight_check.h"

namespace deepinfer {

namespace {

std::string layer_prefix(int layer) { return "model.layers." + std::to_string(layer) + "."; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

class Assembler {
 public:
  Assembler(const ModelConfig& config, const TensorSource& source)
      : c_(config), src_(source) {
    if (c_.quantization.is_fp8()) {
      block_n_ = c_.quantization.block_n;
      block_k_ = c_.quantization.block_k;
    }
  }

  bool has(const std::string& name) const { return src_.find(name).has_value(); }

  // A tensor that must exist with exactly `dims`, in one of `dtypes`.
  Tensor get(const std::string& name, const std::vector<int64_t>& dims,
             std::initializer_list<DType> dtypes, const char* what) const {
    std::optional<Tensor> t = src_.find(name);
    DI_CHECK(t.has_value(), "tensor '", name, "' (", what, ") is missing from ", src_.describe(name));
    DI_CHECK(t->dims() == dims, "tensor '", name, "' in ", src_.describe(name), " has shape ",
             shape_string(t->dims()), " but config ", c_.source, " expects ", shape_string(dims),
             " (", what, ")");
    bool ok = false;
    std::string allowed;
    for (DType d : dtypes) {
      ok = ok || t->dtype == d;
      allowed += (allowed.empty() ? "" : " or ") + std::string(dtype_name(d));
    }
    DI_CHECK(ok, "tensor '", name, "' in ", src_.describe(name), " has dtype ",
             dtype_name(t->dtype), " but ", what, " must be ", allowed);
    return *t;
  }

  Tensor norm(const std::string& name, int64_t dim) const {
    return get(name, {dim}, {DType::F32, DType::BF16}, "RMSNorm weight");
  }

  // Linear `prefix`.weight [n, k]; FP8 adds `prefix`.weight_scale_inv.
  Weight linear(const std::string& prefix, int64_t n, int64_t k) const {
    Weight w;
    w.w = get(prefix + ".weight", {n, k}, {DType::F32, DType::BF16, DType::F8_E4M3},
              "linear weight [out, in]");
    w.block_n = block_n_;
    w.block_k = block_k_;
    if (w.w.dtype == DType::F8_E4M3) {
      w.scale_inv = get(prefix + ".weight_scale_inv", {ceil_div(n, block_n_), ceil_div(k, block_k_)},
                        {DType::F32}, "FP8 block scale [ceil(out/block_n), ceil(in/block_k)]");
    }
    return w;
  }

  AttentionWeights attention(const std::string& p) const {
    const int64_t H = c_.hidden_size, heads = c_.num_attention_heads;
    AttentionWeights a;
    if (c_.has_q_lora()) {
      a.q_a_proj = linear(p + "q_a_proj", c_.q_lora_rank, H);
      a.q_a_layernorm = norm(p + "q_a_layernorm.weight", c_.q_lora_rank);
      a.q_b_proj = linear(p + "q_b_proj", heads * c_.qk_head_dim(), c_.q_lora_rank);
    } else {
      a.q_proj = linear(p + "q_proj", heads * c_.qk_head_dim(), H);
    }
    a.kv_a_proj_with_mqa = linear(p + "kv_a_proj_with_mqa", c_.kv_row_dim(), H);
    a.kv_a_layernorm = norm(p + "kv_a_layernorm.weight", c_.kv_lora_rank);
    a.kv_b_proj =
        linear(p + "kv_b_proj", heads * (c_.qk_nope_head_dim + c_.v_head_dim), c_.kv_lora_rank);
    a.o_proj = linear(p + "o_proj", H, heads * c_.v_head_dim);
    return a;
  }

  ExpertWeights mlp(const std::string& p, int64_t intermediate) const {
    const int64_t H = c_.hidden_size;
    return {linear(p + "gate_proj", intermediate, H), linear(p + "up_proj", intermediate, H),
            linear(p + "down_proj", H, intermediate)};
  }

  // Fused transformers-5 experts: gate_up_proj [E, 2I, H] (gate rows first),
  // down_proj [E, H, I]; each expert becomes zero-copy views.
  std::vector<ExpertWeights> fused_experts(const std::string& p) const {
    const int64_t E = c_.n_routed_experts, I = c_.moe_intermediate_size, H = c_.hidden_size;
    Tensor gate_up = get(p + "gate_up_proj", {E, 2 * I, H}, {DType::F32, DType::BF16},
                         "fused experts [experts, 2 * moe_intermediate, hidden]");
    Tensor down = get(p + "down_proj", {E, H, I}, {DType::F32, DType::BF16},
                      "fused experts [experts, hidden, moe_intermediate]");
    std::vector<ExpertWeights> experts(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      Tensor gu = gate_up.row(e);  // [2I, H]
      experts[e].gate.w = gu.slice_rows(0, I);
      experts[e].up.w = gu.slice_rows(I, 2 * I);
      experts[e].down.w = down.row(e);  // [H, I]
    }
    return experts;
  }

  MoeWeights moe(const std::string& p) const {
    const int64_t H = c_.hidden_size, E = c_.n_routed_experts;
    MoeWeights m;
    m.gate = linear(p + "gate", E, H);
    if (c_.scoring_func == "sigmoid") {
      m.e_score_correction_bias = get(p + "gate.e_score_correction_bias", {E}, {DType::F32},
                                      "routing bias (noaux_tc)");
    }
    if (has(p + "experts.gate_up_proj")) {
      m.experts = fused_experts(p + "experts.");
    } else {
      m.experts.reserve(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) {
        m.experts.push_back(
            mlp(p + "experts." + std::to_string(e) + ".", c_.moe_intermediate_size));
      }
    }
    if (c_.n_shared_experts > 0) m.shared = mlp(p + "shared_experts.", c_.shared_intermediate_size());
    return m;
  }

  LayerWeights layer(int id) const {
    const std::string p = layer_prefix(id);
    LayerWeights l;
    l.input_layernorm = norm(p + "input_layernorm.weight", c_.hidden_size);
    l.post_attention_layernorm = norm(p + "post_attention_layernorm.weight", c_.hidden_size);
    l.attn = attention(p + "self_attn.");
    l.is_moe = c_.is_moe_layer(id);
    if (l.is_moe) {
      l.moe = moe(p + "mlp.");
    } else {
      l.mlp = mlp(p + "mlp.", c_.intermediate_size);
    }
    return l;
  }

  Tensor embedding(const std::string& name) const {
    return get(name, {c_.vocab_size, c_.hidden_size}, {DType::F32, DType::BF16},
               "embedding [vocab, hidden]");
  }

  MtpWeights mtp(int id) const {
    const std::string p = layer_prefix(id);
    const int64_t H = c_.hidden_size;
    MtpWeights m;
    m.enorm = norm(p + "enorm.weight", H);
    m.hnorm = norm(p + "hnorm.weight", H);
    m.eh_proj = linear(p + "eh_proj", H, 2 * H);
    m.block = layer(id);
    m.shared_head_norm = norm(p + "shared_head.norm.weight", H);
    if (has(p + "embed_tokens.weight")) m.embed_tokens = embedding(p + "embed_tokens.weight");
    if (has(p + "shared_head.head.weight")) {
      m.shared_head = linear(p + "shared_head.head", c_.vocab_size, H);
    }
    return m;
  }

 private:
  const ModelConfig& c_;
  const TensorSource& src_;
  int block_n_ = 128;
  int block_k_ = 128;
};

void visit_weight(const std::string& prefix, Weight& w,
                  const std::function<void(const std::string&, Tensor&)>& fn) {
  if (!w.w.defined()) return;
  fn(prefix + ".weight", w.w);
  if (w.scale_inv.defined()) fn(prefix + ".weight_scale_inv", w.scale_inv);
}

void visit_mlp(const std::string& p, ExpertWeights& e,
               const std::function<void(const std::string&, Tensor&)>& fn) {
  visit_weight(p + "gate_proj", e.gate, fn);
  visit_weight(p + "up_proj", e.up, fn);
  visit_weight(p + "down_proj", e.down, fn);
}

void visit_norm(const std::string& name, Tensor& t,
                const std::function<void(const std::string&, Tensor&)>& fn) {
  if (t.defined()) fn(name, t);
}

void visit_layer(const std::string& p, LayerWeights& l,
                 const std::function<void(const std::string&, Tensor&)>& fn) {
  visit_norm(p + "input_layernorm.weight", l.input_layernorm, fn);
  AttentionWeights& a = l.attn;
  const std::string s = p + "self_attn.";
  visit_weight(s + "q_a_proj", a.q_a_proj, fn);
  visit_norm(s + "q_a_layernorm.weight", a.q_a_layernorm, fn);
  visit_weight(s + "q_b_proj", a.q_b_proj, fn);
  visit_weight(s + "q_proj", a.q_proj, fn);
  visit_weight(s + "kv_a_proj_with_mqa", a.kv_a_proj_with_mqa, fn);
  visit_norm(s + "kv_a_layernorm.weight", a.kv_a_layernorm, fn);
  visit_weight(s + "kv_b_proj", a.kv_b_proj, fn);
  visit_weight(s + "o_proj", a.o_proj, fn);
  visit_norm(p + "post_attention_layernorm.weight", l.post_attention_layernorm, fn);
  if (!l.is_moe) {
    visit_mlp(p + "mlp.", l.mlp, fn);
    return;
  }
  visit_weight(p + "mlp.gate", l.moe.gate, fn);
  visit_norm(p + "mlp.gate.e_score_correction_bias", l.moe.e_score_correction_bias, fn);
  for (size_t e = 0; e < l.moe.experts.size(); ++e) {
    visit_mlp(p + "mlp.experts." + std::to_string(e) + ".", l.moe.experts[e], fn);
  }
  if (l.moe.has_shared()) visit_mlp(p + "mlp.shared_experts.", l.moe.shared, fn);
}

}  // namespace

void ModelWeights::for_each_tensor(
    const std::function<void(const std::string& name, Tensor& t)>& fn) {
  visit_norm("model.embed_tokens.weight", embed_tokens, fn);
  for (size_t i = 0; i < layers.size(); ++i) {
    visit_layer(layer_prefix(static_cast<int>(i)), layers[i], fn);
  }
  visit_norm("model.norm.weight", norm, fn);
  visit_weight("lm_head", lm_head, fn);
  for (size_t k = 0; k < mtp.size(); ++k) {
    const std::string p = layer_prefix(static_cast<int>(layers.size() + k));
    MtpWeights& m = mtp[k];
    visit_norm(p + "enorm.weight", m.enorm, fn);
    visit_norm(p + "hnorm.weight", m.hnorm, fn);
    visit_weight(p + "eh_proj", m.eh_proj, fn);
    visit_layer(p, m.block, fn);
    visit_norm(p + "shared_head.norm.weight", m.shared_head_norm, fn);
    visit_norm(p + "embed_tokens.weight", m.embed_tokens, fn);
    visit_weight(p + "shared_head.head", m.shared_head, fn);
  }
}

ModelWeights assemble_weights(const ModelConfig& config, const TensorSource& source,
                              bool load_mtp) {
  Assembler a(config, source);
  ModelWeights w;
  w.embed_tokens = a.embedding("model.embed_tokens.weight");
  w.layers.reserve(static_cast<size_t>(config.num_hidden_layers));
  for (int l = 0; l < config.num_hidden_layers; ++l) w.layers.push_back(a.layer(l));
  w.norm = a.norm("model.norm.weight", config.hidden_size);
  if (config.tie_word_embeddings && !a.has("lm_head.weight")) {
    w.lm_head.w = w.embed_tokens;
  } else {
    w.lm_head = a.linear("lm_head", config.vocab_size, config.hidden_size);
  }
  if (load_mtp) {
    // MTP modules are optional in a checkpoint (transformers 5.17 does not save them).
    for (int k = 0; k < config.num_nextn_predict_layers; ++k) {
      const int id = config.num_hidden_layers + k;
      if (!a.has(layer_prefix(id) + "eh_proj.weight")) break;
      w.mtp.push_back(a.mtp(id));
    }
  }
  return w;
}

ModelWeights load_weights(std::shared_ptr<const CheckpointReader> reader,
                          const ModelConfig& config, const LoadOptions& options) {
  DI_CHECK(reader != nullptr, "load_weights: no checkpoint");
  if (options.progress != nullptr) reader->touch_all(options.progress, options.progress_user);
  const CheckpointReader* r = reader.get();
  std::vector<std::string> used;  // checkpoint tensors the model takes, in first-use order
  std::set<std::string, std::less<>> seen;
  TensorSource source;
  source.find = [r, &used, &seen](const std::string& name) -> std::optional<Tensor> {
    if (!r->has(name)) return std::nullopt;
    if (seen.insert(name).second) used.push_back(name);
    return r->tensor(name);
  };
  source.describe = [r](const std::string& name) {
    return r->has(name) ? r->info(name).file : r->path();
  };
  ModelWeights w = assemble_weights(config, source, options.load_mtp);
  if (options.check_finite) {
    std::vector<NamedTensor> tensors;
    tensors.reserve(used.size());
    for (const std::string& name : used) tensors.push_back({name, r->info(name).file, r->tensor(name)});
    check_weights_finite(tensors, default_thread_pool());
  }
  w.owners.push_back(std::move(reader));
  return w;
}

ModelWeights load_weights(const std::string& dir, const ModelConfig& config,
                          const LoadOptions& options) {
  if (options.random_weights) {
    return make_random_weights(config, options.seed, options.random_weight_dtype, options.load_mtp);
  }
  auto reader = std::make_shared<const CheckpointReader>(CheckpointReader::open(dir));
  return load_weights(std::move(reader), config, options);
}

ModelWeights upload_weights(const ModelWeights& host, Backend& backend) {
  ModelWeights out = host;
  out.owners.clear();
  // Identical views (same bytes, dtype and shape) share one device allocation.
  std::map<std::tuple<const void*, DType, std::vector<int64_t>>, Tensor> uploaded;
  bool kept_host_views = false;  // e.g. a CPU backend: nothing to copy
  out.for_each_tensor([&](const std::string& name, Tensor& t) {
    if (t.device == backend.device()) {
      kept_host_views = true;
      return;
    }
    DI_CHECK(t.is_contiguous(), "upload_weights: tensor '", name, "' is not contiguous: ",
             t.describe());
    auto key = std::make_tuple(static_cast<const void*>(t.data), t.dtype, t.dims());
    auto it = uploaded.find(key);
    if (it != uploaded.end()) {
      t = it->second;
      return;
    }
    auto buffer = std::make_shared<DeviceBuffer>(backend.alloc(t.dtype, t.dims()));
    backend.copy(t, buffer->tensor());
    uploaded.emplace(key, buffer->tensor());
    t = buffer->tensor();
    out.owners.push_back(std::move(buffer));
  });
  backend.synchronize();
  // Views left in place still need their original owners.
  if (kept_host_views) out.owners.insert(out.owners.end(), host.owners.begin(), host.owners.end());
  return out;
}

}  // namespace deepinfer
