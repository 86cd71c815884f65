#include "model/deepseek_v4/weights.h"

#include <utility>

#include "core/error.h"
#include "core/quant.h"
#include "io/safetensors.h"

namespace deepinfer {

namespace {

bool replace(std::string& s, const std::string& from, const std::string& to) {
  const size_t p = s.find(from);
  if (p == std::string::npos) return false;
  s.replace(p, from.size(), to);
  return true;
}

// DeepSeek's name -> transformers' (conversion_mapping.py "deepseek_v4", experts aside).
std::string hf_name(const std::string& official) {
  static const std::pair<const char*, const char*> kGlobal[] = {
      {"embed.weight", "model.embed_tokens.weight"}, {"head.weight", "lm_head.weight"},
      {"norm.weight", "model.norm.weight"},          {"hc_head_fn", "model.hc_head.hc_fn"},
      {"hc_head_base", "model.hc_head.hc_base"},     {"hc_head_scale", "model.hc_head.hc_scale"}};
  for (const auto& [a, b] : kGlobal)
    if (official == a) return b;
  std::string s = "model." + official;
  static const std::pair<const char*, const char*> kRules[] = {
      {".attn.indexer.compressor.", ".self_attn.compressor.indexer."},
      {".attn.indexer.weights_proj.", ".self_attn.compressor.indexer.scorer.weights_proj."},
      {".attn.indexer.wq_b.", ".self_attn.compressor.indexer.q_b_proj."},
      {".attn.", ".self_attn."},
      {".ffn.", ".mlp."},
      {".attn_norm.", ".input_layernorm."},
      {".ffn_norm.", ".post_attention_layernorm."},
      {".hc_attn_fn", ".attn_hc.fn"}, {".hc_attn_base", ".attn_hc.base"}, {".hc_attn_scale", ".attn_hc.scale"},
      {".hc_ffn_fn", ".ffn_hc.fn"},   {".hc_ffn_base", ".ffn_hc.base"},   {".hc_ffn_scale", ".ffn_hc.scale"},
      {".attn_sink", ".sinks"},
      {".compressor.norm.", ".compressor.kv_norm."}, {"indexer.norm.", "indexer.kv_norm."},
      {".ape", ".position_bias"},
      {".wq_a.", ".q_a_proj."}, {".wq_b.", ".q_b_proj."}, {".wkv.", ".kv_proj."}, {".wgate.", ".gate_proj."},
      {".wo_a.", ".o_a_proj."}, {".wo_b.", ".o_b_proj."}, {".q_norm.", ".q_a_norm."},
      {".gate.bias", ".gate.e_score_correction_bias"},
      {".shared_experts.w1.", ".shared_experts.gate_proj."},
      {".shared_experts.w2.", ".shared_experts.down_proj."},
      {".shared_experts.w3.", ".shared_experts.up_proj."}};
  for (const auto& [a, b] : kRules) replace(s, a, b);
  return s;
}

class Loader {
 public:
  Loader(const DeepseekV4Config& c, std::shared_ptr<const CheckpointReader> r, V4Weights& w)
      : c_(c), r_(std::move(r)), w_(w) {}

  // The checkpoint's name for `official` (DeepSeek's, else transformers'); "" when absent.
  std::string resolve(const std::string& official) const {
    if (r_->has(official)) return official;
    const std::string hf = hf_name(official);
    return r_->has(hf) ? hf : std::string();
  }
  Tensor raw(const std::string& official, const char* what) const {
    const std::string name = resolve(official);
    DI_CHECK(!name.empty(), "tensor '", official, "' (or '", hf_name(official), "'; ", what,
             ") is missing from ", r_->path());
    return r_->tensor(name);
  }
  void check_dims(const Tensor& t, const std::string& name, const std::vector<int64_t>& dims, const char* what) const {
    DI_CHECK(t.dims() == dims, "tensor '", name, "' in ", r_->path(), " has shape ", shape_string(t.dims()),
             " but config ", c_.base.source, " expects ", shape_string(dims), " (", what, ")");
  }
  Tensor f32(const std::string& official, const std::vector<int64_t>& dims, const char* what) {
    Tensor t = raw(official, what);
    check_dims(t, official, dims, what);
    DI_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, "tensor '", official, "' in ", r_->path(),
             " has dtype ", dtype_name(t.dtype), " but ", what, " must be F32 or BF16");
    auto b = std::make_shared<HostBuffer>(DType::F32, dims);
    for (int64_t i = 0; i < t.numel(); ++i)
      b->ptr<float>()[i] = t.dtype == DType::F32 ? t.ptr<const float>()[i] : bf16_to_float(t.ptr<const uint16_t>()[i]);
    w_.owners.push_back(b);
    return b->tensor();
  }
  Tensor scale_of(const std::string& prefix, const std::vector<int64_t>& dims, const char* what) const {
    for (const char* suffix : {".scale", ".weight_scale_inv"}) {
      const std::string name = resolve(prefix + suffix);
      if (name.empty()) continue;
      Tensor s = r_->tensor(name);
      DI_CHECK(s.dims() == dims, "tensor '", name, "' in ", r_->path(), " has shape ", shape_string(s.dims()),
               " but ", what, " needs scales of shape ", shape_string(dims));
      return s;
    }
    fail("tensor '", prefix, ".scale' (or '.weight_scale_inv'; scales of ", what, ") is missing from ", r_->path());
  }
  // A linear weight [n, k]: F32/BF16 as is; FP8 e4m3 with F32 block scales (E8M0 converted);
  // FP4 e2m1 (I8/U8 [n, k/2]) dequantized to F32. dequantize: FP8 to F32 too.
  Weight linear_from(const Tensor& t, const std::string& prefix, int64_t n, int64_t k, const char* what,
                     bool dequantize = false) {
    Weight w;
    if (t.dtype == DType::I8 || t.dtype == DType::U8) {
      check_dims(t, prefix + ".weight", {n, k / 2}, what);
      DI_CHECK(k % 32 == 0, "tensor '", prefix, ".weight' (", what, "): FP4 needs K % 32 == 0, K = ", k);
      Tensor s = scale_of(prefix, {n, k / 32}, what);
      auto b = std::make_shared<HostBuffer>(DType::F32, std::vector<int64_t>{n, k});
      dequantize_fp4_e2m1(t, s, b->ptr<float>(), (prefix + ".weight").c_str());
      w_.owners.push_back(b);
      w.w = b->tensor();
      return w;
    }
    check_dims(t, prefix + ".weight", {n, k}, what);
    if (t.dtype == DType::F8_E4M3) {
      const int64_t bn = c_.base.quantization.block_n, bk = c_.base.quantization.block_k;
      DI_CHECK(bn == bk, c_.base.source, ": quantization_config.weight_block_size must be square for V4");
      Tensor s = scale_of(prefix, {(n + bn - 1) / bn, (k + bk - 1) / bk}, what);
      if (dequantize) {
        auto b = std::make_shared<HostBuffer>(DType::F32, std::vector<int64_t>{n, k});
        dequantize_fp8_blocks(t, s, static_cast<int>(bn), b->ptr<float>(), (prefix + ".weight").c_str());
        w_.owners.push_back(b);
        w.w = b->tensor();
        return w;
      }
      auto sb = std::make_shared<HostBuffer>(DType::F32, s.dims());
      for (int64_t i = 0; i < s.numel(); ++i) sb->ptr<float>()[i] = scale_value(s, i);
      w_.owners.push_back(sb);
      w.w = t;
      w.scale_inv = sb->tensor();
      w.block_n = static_cast<int>(bn);
      w.block_k = static_cast<int>(bk);
      return w;
    }
    DI_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, "tensor '", prefix, ".weight' in ", r_->path(),
             " has dtype ", dtype_name(t.dtype), " which ", what, " cannot be (F32, BF16, F8_E4M3 or FP4 I8)");
    w.w = t;
    return w;
  }
  Weight linear(const std::string& prefix, int64_t n, int64_t k, const char* what, bool dequantize = false) {
    return linear_from(raw(prefix + ".weight", what), prefix, n, k, what, dequantize);
  }
  V4Compressor compressor(const std::string& p, int64_t width, int64_t d, int ratio) {
    V4Compressor out;
    out.wkv = linear(p + "wkv", width, c_.base.hidden_size, "compressor kv projection");
    out.wgate = linear(p + "wgate", width, c_.base.hidden_size, "compressor gate projection");
    out.ape = f32(p + "ape", {ratio, width}, "compressor position bias (ape) [ratio, width]");
    out.norm = f32(p + "norm.weight", {d}, "compressor norm");
    return out;
  }
  std::vector<ExpertWeights> experts(int l) {
    const int64_t E = c_.base.n_routed_experts, I = c_.base.moe_intermediate_size, H = c_.base.hidden_size;
    std::vector<ExpertWeights> out(static_cast<size_t>(E));
    const std::string fused = "model.layers." + std::to_string(l) + ".mlp.experts.";
    if (r_->has(fused + "gate_up_proj")) {
      Tensor gu = r_->tensor(fused + "gate_up_proj"), dn = r_->tensor(fused + "down_proj");
      check_dims(gu, fused + "gate_up_proj", {E, 2 * I, H}, "fused routed experts [E, 2I, H]");
      check_dims(dn, fused + "down_proj", {E, H, I}, "fused routed experts [E, H, I]");
      for (int64_t e = 0; e < E; ++e) {
        out[e].gate = linear_from(gu.row(e).slice_rows(0, I), fused + "gate_up_proj", I, H, "expert gate");
        out[e].up = linear_from(gu.row(e).slice_rows(I, 2 * I), fused + "gate_up_proj", I, H, "expert up");
        out[e].down = linear_from(dn.row(e), fused + "down_proj", H, I, "expert down");
      }
      return out;
    }
    for (int64_t e = 0; e < E; ++e) {
      const std::string p = "layers." + std::to_string(l) + ".ffn.experts." + std::to_string(e) + ".";
      out[e].gate = linear(p + "w1", I, H, "routed expert w1 (gate)");
      out[e].up = linear(p + "w3", I, H, "routed expert w3 (up)");
      out[e].down = linear(p + "w2", H, I, "routed expert w2 (down)");
    }
    return out;
  }
  std::vector<int32_t> tid2eid(const std::string& official) {
    const std::string name = resolve(official);
    DI_CHECK(!name.empty(), "tensor '", official, "' (hash routing table) is missing from ", r_->path());
    Tensor t = r_->tensor(name);
    const int64_t V = c_.base.vocab_size, k = c_.base.num_experts_per_tok, E = c_.base.n_routed_experts;
    check_dims(t, name, {V, k}, "hash routing table tid2eid [vocab_size, num_experts_per_tok]");
    DI_CHECK(t.dtype == DType::I64 || t.dtype == DType::I32, "tensor '", name, "' has dtype ",
             dtype_name(t.dtype), " but tid2eid must be I64 or I32");
    std::vector<int32_t> out(static_cast<size_t>(V * k));
    for (int64_t i = 0; i < V * k; ++i) {
      const int64_t id = t.dtype == DType::I64 ? t.ptr<const int64_t>()[i] : t.ptr<const int32_t>()[i];
      DI_CHECK(id >= 0 && id < E, "tensor '", name, "': token ", i / k, " slot ", i % k, " routes to expert ", id,
               ", outside [0, n_routed_experts = ", E, ")");
      out[i] = static_cast<int32_t>(id);
    }
    return out;
  }

 private:
  const DeepseekV4Config& c_;
  std::shared_ptr<const CheckpointReader> r_;
  V4Weights& w_;
};

}  // namespace

V4Weights load_v4_weights(const DeepseekV4Config& c, std::shared_ptr<const CheckpointReader> reader) {
  V4Weights w;
  w.owners.push_back(std::const_pointer_cast<void>(std::static_pointer_cast<const void>(reader)));
  Loader ld(c, reader, w);
  const int64_t H = c.base.hidden_size, V = c.base.vocab_size, heads = c.base.num_attention_heads;
  const int64_t D = c.head_dim, hc = c.hc_mult, mixes = (2 + hc) * hc;
  {
    Tensor e = ld.raw("embed.weight", "token embedding");
    ld.check_dims(e, "embed.weight", {V, H}, "token embedding [vocab, hidden]");
    DI_CHECK(e.dtype == DType::F32 || e.dtype == DType::BF16, "tensor 'embed.weight' must be F32 or BF16");
    w.embed = e;
  }
  w.norm = ld.f32("norm.weight", {H}, "final norm");
  w.head = ld.linear("head", V, H, "output head");
  w.hc_head = {ld.f32("hc_head_fn", {hc, hc * H}, "hc_head fn"), ld.f32("hc_head_base", {hc}, "hc_head base"),
               ld.f32("hc_head_scale", {1}, "hc_head scale")};
  for (int l = 0; l < c.num_layers(); ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    V4Layer L;
    L.kind = c.attention[static_cast<size_t>(l)];
    L.attn_norm = ld.f32(p + "attn_norm.weight", {H}, "attention norm");
    L.ffn_norm = ld.f32(p + "ffn_norm.weight", {H}, "ffn norm");
    L.hc_attn = {ld.f32(p + "hc_attn_fn", {mixes, hc * H}, "hyper-connection fn [(2+hc)*hc, hc*hidden]"),
                 ld.f32(p + "hc_attn_base", {mixes}, "hyper-connection base"),
                 ld.f32(p + "hc_attn_scale", {3}, "hyper-connection scale")};
    L.hc_ffn = {ld.f32(p + "hc_ffn_fn", {mixes, hc * H}, "hyper-connection fn [(2+hc)*hc, hc*hidden]"),
                ld.f32(p + "hc_ffn_base", {mixes}, "hyper-connection base"),
                ld.f32(p + "hc_ffn_scale", {3}, "hyper-connection scale")};
    const std::string a = p + "attn.";
    L.wq_a = ld.linear(a + "wq_a", c.base.q_lora_rank, H, "query down-projection");
    L.q_norm = ld.f32(a + "q_norm.weight", {c.base.q_lora_rank}, "query norm");
    L.wq_b = ld.linear(a + "wq_b", heads * D, c.base.q_lora_rank, "query up-projection");
    L.wkv = ld.linear(a + "wkv", D, H, "K=V projection");
    L.kv_norm = ld.f32(a + "kv_norm.weight", {D}, "K=V norm");
    L.wo_a = ld.linear(a + "wo_a", c.o_groups * c.o_lora_rank, heads * D / c.o_groups, "grouped output wo_a", true);
    L.wo_b = ld.linear(a + "wo_b", H, c.o_groups * c.o_lora_rank, "output wo_b");
    L.sinks = ld.f32(a + "attn_sink", {heads}, "attention sinks");
    if (L.kind == V4AttentionKind::Csa) {
      L.compressor = ld.compressor(a + "compressor.", 2 * D, D, c.csa_rate);
      L.index_compressor = ld.compressor(a + "indexer.compressor.", 2 * c.index_head_dim, c.index_head_dim, c.csa_rate);
      L.index_wq_b = ld.linear(a + "indexer.wq_b", c.index_n_heads * c.index_head_dim, c.base.q_lora_rank,
                               "indexer query projection");
      L.index_weights_proj = ld.linear(a + "indexer.weights_proj", c.index_n_heads, H, "indexer head weights");
    } else if (L.kind == V4AttentionKind::Hca) {
      L.compressor = ld.compressor(a + "compressor.", D, D, c.hca_rate);
    }
    const std::string f = p + "ffn.";
    L.hash = c.hash_moe[static_cast<size_t>(l)];
    L.gate = ld.linear(f + "gate", c.base.n_routed_experts, H, "router");
    if (L.hash) L.tid2eid = ld.tid2eid(f + "gate.tid2eid");
    else L.gate_bias = ld.f32(f + "gate.bias", {c.base.n_routed_experts}, "router selection bias");
    L.experts = ld.experts(l);
    if (c.base.n_shared_experts > 0) {
      const int64_t I = c.base.moe_intermediate_size;
      L.shared.gate = ld.linear(f + "shared_experts.w1", I, H, "shared expert w1 (gate)");
      L.shared.up = ld.linear(f + "shared_experts.w3", I, H, "shared expert w3 (up)");
      L.shared.down = ld.linear(f + "shared_experts.w2", H, I, "shared expert w2 (down)");
    }
    w.layers.push_back(std::move(L));
  }
  return w;
}

}  // namespace deepinfer
