#include "model/deepseek_v4/weights.h"

#include <utility>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/deepseek_v4/tensor_loader.h"

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

class Loader : public V4TensorLoader {
 public:
  Loader(const DeepseekV4Config& c, std::shared_ptr<const CheckpointReader> r, V4Weights& w, bool packed_fp4)
      : V4TensorLoader(c, r, w.owners, hf_name), c_(c), r_(std::move(r)), packed_fp4_(packed_fp4) {}

  V4Compressor compressor(const std::string& p, int64_t width, int64_t d, int ratio) {
    V4Compressor out;
    out.wkv = linear(p + "wkv", width, c_.base.hidden_size, "compressor kv projection");
    out.wgate = linear(p + "wgate", width, c_.base.hidden_size, "compressor gate projection");
    out.ape = f32(p + "ape", {ratio, width}, "compressor position bias (ape) [ratio, width]");
    out.norm = f32(p + "norm.weight", {d}, "compressor norm");
    return out;
  }
  std::vector<ExpertWeights> experts(const std::string& block) {
    const int64_t E = c_.base.n_routed_experts, I = c_.base.moe_intermediate_size, H = c_.base.hidden_size;
    std::vector<ExpertWeights> out(static_cast<size_t>(E));
    std::string fused = hf_name(block + "ffn.experts.x");  // model.layers.N.mlp.experts.x
    fused.pop_back();
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
    return expert_list(block + "ffn.", packed_fp4_);
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

  // One V4 block under prefix p ("layers.N." or "mtp.N."); why: appended to every
  // tensor's description (which MTP block), "" for main layers.
  V4Layer layer(const std::string& p, V4AttentionKind kind, bool hash, const std::string& why) {
    set_note(why);
    const int64_t H = c_.base.hidden_size, heads = c_.base.num_attention_heads, D = c_.head_dim;
    V4Layer L;
    L.kind = kind;
    L.attn_norm = f32(p + "attn_norm.weight", {H}, w("attention norm"));
    L.ffn_norm = f32(p + "ffn_norm.weight", {H}, w("ffn norm"));
    L.hc_attn = hc_site(p, "attn");
    L.hc_ffn = hc_site(p, "ffn");
    const std::string a = p + "attn.";
    L.wq_a = linear(a + "wq_a", c_.base.q_lora_rank, H, w("query down-projection"));
    L.q_norm = f32(a + "q_norm.weight", {c_.base.q_lora_rank}, w("query norm"));
    L.wq_b = linear(a + "wq_b", heads * D, c_.base.q_lora_rank, w("query up-projection"));
    L.wkv = linear(a + "wkv", D, H, w("K=V projection"));
    L.kv_norm = f32(a + "kv_norm.weight", {D}, w("K=V norm"));
    L.wo_a = linear(a + "wo_a", c_.o_groups * c_.o_lora_rank, heads * D / c_.o_groups, w("grouped output wo_a"), true);
    L.wo_b = linear(a + "wo_b", H, c_.o_groups * c_.o_lora_rank, w("output wo_b"));
    L.sinks = f32(a + "attn_sink", {heads}, w("attention sinks"));
    if (L.kind == V4AttentionKind::Csa) {
      L.compressor = compressor(a + "compressor.", 2 * D, D, c_.csa_rate);
      L.index_compressor = compressor(a + "indexer.compressor.", 2 * c_.index_head_dim, c_.index_head_dim, c_.csa_rate);
      L.index_wq_b = linear(a + "indexer.wq_b", c_.index_n_heads * c_.index_head_dim, c_.base.q_lora_rank,
                            w("indexer query projection"));
      L.index_weights_proj = linear(a + "indexer.weights_proj", c_.index_n_heads, H, w("indexer head weights"));
    } else if (L.kind == V4AttentionKind::Hca) {
      L.compressor = compressor(a + "compressor.", D, D, c_.hca_rate);
    }
    const std::string f = p + "ffn.";
    L.hash = hash;
    L.gate = linear(f + "gate", c_.base.n_routed_experts, H, w("router"));
    if (L.hash) L.tid2eid = tid2eid(f + "gate.tid2eid");
    else L.gate_bias = f32(f + "gate.bias", {c_.base.n_routed_experts}, w("router selection bias"));
    L.experts = experts(p);
    if (c_.base.n_shared_experts > 0) L.shared = shared_expert(f);
    set_note("");
    return L;
  }

 private:
  const DeepseekV4Config& c_;
  std::shared_ptr<const CheckpointReader> r_;
  bool packed_fp4_;  // routed experts: keep FP4 packed (load_v4_weights)
};

}  // namespace

V4Weights load_v4_weights(const DeepseekV4Config& c, std::shared_ptr<const CheckpointReader> reader, bool load_mtp,
                          bool packed_fp4, bool mtp_optional) {
  V4Weights w;
  w.owners.push_back(std::const_pointer_cast<void>(std::static_pointer_cast<const void>(reader)));
  Loader ld(c, reader, w, packed_fp4);
  const int64_t H = c.base.hidden_size, V = c.base.vocab_size, hc = c.hc_mult;
  w.embed = ld.embedding();
  w.norm = ld.f32("norm.weight", {H}, "final norm");
  w.head = ld.linear("head", V, H, "output head");
  w.hc_head = {ld.f32("hc_head_fn", {hc, hc * H}, "hc_head fn"), ld.f32("hc_head_base", {hc}, "hc_head base"),
               ld.f32("hc_head_scale", {1}, "hc_head scale")};
  for (int l = 0; l < c.num_layers(); ++l)
    w.layers.push_back(ld.layer("layers." + std::to_string(l) + ".", c.attention[static_cast<size_t>(l)],
                                c.hash_moe[static_cast<size_t>(l)], ""));
  if (load_mtp) {
    for (int m = 0; m < c.base.num_nextn_predict_layers; ++m) {
      const std::string p = "mtp." + std::to_string(m) + ".";
      if (mtp_optional && ld.resolve(p + "e_proj.weight").empty()) break;  // no such block: none after it
      const std::string why = " of MTP block " + std::to_string(m) + " (config num_nextn_predict_layers = " +
                              std::to_string(c.base.num_nextn_predict_layers) + ")";
      V4MtpBlock B;
      B.block = ld.layer(p, V4AttentionKind::Window, false, why);
      const std::string e = "MTP e_proj" + why, h = "MTP h_proj" + why;
      B.e_proj = ld.linear(p + "e_proj", H, H, e.c_str());
      B.h_proj = ld.linear(p + "h_proj", H, H, h.c_str());
      B.enorm = ld.f32(p + "enorm.weight", {H}, ("MTP enorm" + why).c_str());
      B.hnorm = ld.f32(p + "hnorm.weight", {H}, ("MTP hnorm" + why).c_str());
      B.norm = ld.f32(p + "norm.weight", {H}, ("MTP norm" + why).c_str());
      B.hc_head = {ld.f32(p + "hc_head_fn", {hc, hc * H}, ("MTP hc_head fn" + why).c_str()),
                   ld.f32(p + "hc_head_base", {hc}, ("MTP hc_head base" + why).c_str()),
                   ld.f32(p + "hc_head_scale", {1}, ("MTP hc_head scale" + why).c_str())};
      w.mtp.push_back(std::move(B));
    }
  }
  return w;
}

}  // namespace deepinfer
