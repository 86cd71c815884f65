#include "model/deepseek_v41/weights.h"

#include <cmath>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/deepseek_v4/tensor_loader.h"

namespace deepinfer {

namespace {

// The released name -> the PR's transformers name.
std::string pr_name(const std::string& official) {
  if (official == "head.weight") return "lm_head.weight";
  return "model." + official;
}

void load(const DeepseekV41Config& c, V4TensorLoader& ld, V41Weights& w) {
  const int64_t H = c.base.hidden_size, V = c.base.vocab_size;
  const int64_t heads = c.base.num_attention_heads, D = c.head_dim, ql = c.base.q_lora_rank;
  const int64_t E = c.base.n_routed_experts, nh = c.index_n_heads, di = c.index_head_dim;
  w.embed = ld.embedding();
  w.norm = ld.f32("norm.weight", {H}, "final norm");
  w.head = ld.linear("head", V, H, "output head");
  for (int l = 0; l < c.num_layers(); ++l) {
    const std::string p = "layers." + std::to_string(l) + ".", a = p + "attn.", f = p + "ffn.";
    V41Layer L;
    L.attn_norm = ld.f32(p + "attn_norm.weight", {H}, "attention norm");
    L.ffn_norm = ld.f32(p + "ffn_norm.weight", {H}, "ffn norm");
    L.hc_attn = ld.hc_site(p, "attn");
    L.hc_ffn = ld.hc_site(p, "ffn");
    L.wq_a = ld.linear(a + "wq_a", ql, H, "query down-projection");
    L.q_norm = ld.f32(a + "q_norm.weight", {ql}, "query norm");
    L.wq_b = ld.linear(a + "wq_b", heads * D, ql, "query up-projection");
    L.wkv = ld.linear(a + "wkv", D, H, "K=V projection");
    L.kv_norm = ld.f32(a + "kv_norm.weight", {D}, "K=V norm");
    L.wo_a = ld.linear(a + "wo_a", c.o_groups * c.o_lora_rank, heads * D / c.o_groups,
                       "grouped output wo_a", true);
    L.wo_b = ld.linear(a + "wo_b", H, c.o_groups * c.o_lora_rank, "output wo_b");
    L.sinks = ld.f32(a + "attn_sink", {heads}, "attention sinks");
    if (c.is_kv_source(l)) {
      L.comp_wkv = ld.linear(a + "compressor.wkv", D, H,
                             "compressor kv projection (a KV source layer)", true);
      if (c.ratio(l) > 1)
        L.comp_wgate = ld.linear(a + "compressor.wgate", D, H,
                                 "compressor gate (a KV source of ratio > 1)", true);
      L.comp_norm =
          ld.f32(a + "compressor.norm.weight", {D}, "compressor norm (a KV source layer)");
      L.index_wk = ld.linear(a + "indexer.wk", di, D, "indexer key projection (a KV source layer)");
      L.index_k_norm =
          ld.f32(a + "indexer.k_norm.weight", {di}, "indexer key norm (a KV source layer)");
    }
    if (c.is_index_source(l)) {
      L.index_wq_b = ld.linear(a + "indexer.wq_b", nh * di, ql,
                               "indexer query projection (an index source layer)");
      L.index_weights_proj = ld.linear(a + "indexer.weights_proj", nh, H,
                                       "indexer head weights (an index source layer)");
    }
    {  // router: logits / gate_temp folded into an F32 copy of the weight
      Weight g = ld.linear(f + "gate", E, H, "router", true);
      auto b = std::make_shared<HostBuffer>(DType::F32, std::vector<int64_t>{E, H});
      for (int64_t i = 0; i < E * H; ++i)
        b->ptr<float>()[i] = static_cast<float>(
            (g.w.dtype == DType::F32 ? g.w.ptr<const float>()[i]
                                     : bf16_to_float(g.w.ptr<const uint16_t>()[i])) /
            c.gate_temp);
      w.owners.push_back(b);
      L.gate.w = b->tensor();
    }
    L.gate_bias = ld.f32(f + "gate.bias", {E}, "router selection bias");
    L.gate_bias_vl =
        ld.f32(f + "gate.bias_vl", {E}, "router selection bias of image tokens (bias_vl)");
    L.experts = ld.expert_list(f, false);
    if (c.base.n_shared_experts > 0) L.shared = ld.shared_expert(f);
    w.layers.push_back(std::move(L));
  }
}

}  // namespace

V41Weights load_v41_weights(const DeepseekV41Config& c,
                            std::shared_ptr<const CheckpointReader> reader) {
  V41Weights w;
  w.owners.push_back(std::const_pointer_cast<void>(std::static_pointer_cast<const void>(reader)));
  V4TensorLoader ld(c, reader, w.owners, pr_name);
  load(c, ld, w);
  return w;
}

std::vector<TensorSpec> v41_random_specs(const DeepseekV41Config& c, DType weight_dtype) {
  RandomLayout lay(c.base, weight_dtype);
  const int64_t H = c.base.hidden_size, V = c.base.vocab_size, hc = c.hc_mult,
                mixes = (2 + hc) * hc;
  const int64_t heads = c.base.num_attention_heads, D = c.head_dim, ql = c.base.q_lora_rank;
  const int64_t E = c.base.n_routed_experts, I = c.base.moe_intermediate_size;
  const int64_t nh = c.index_n_heads, di = c.index_head_dim;
  const float fn_bound = static_cast<float>(std::sqrt(3.0 / static_cast<double>(hc * H)));
  lay.add("embed.weight", lay.dense_dtype(), {V, H}, {1.0f, 0.0f});
  lay.norm("norm.weight", H);
  lay.linear("head", V, H, false);
  for (int l = 0; l < c.num_layers(); ++l) {
    const std::string p = "layers." + std::to_string(l) + ".", a = p + "attn.", f = p + "ffn.";
    lay.norm(p + "attn_norm.weight", H);
    lay.norm(p + "ffn_norm.weight", H);
    for (const char* site : {"hc_attn_", "hc_ffn_"}) {
      lay.add(p + site + "fn", DType::F32, {mixes, hc * H}, {fn_bound, 0.0f});
      lay.add(p + site + "base", DType::F32, {mixes}, {0.5f, 0.0f});
      lay.add(p + site + "scale", DType::F32, {3}, {0.1f, 1.0f});
    }
    lay.linear(a + "wq_a", ql, H);
    lay.norm(a + "q_norm.weight", ql);
    lay.linear(a + "wq_b", heads * D, ql);
    lay.linear(a + "wkv", D, H);
    lay.norm(a + "kv_norm.weight", D);
    lay.linear(a + "wo_a", c.o_groups * c.o_lora_rank, heads * D / c.o_groups);
    lay.linear(a + "wo_b", H, c.o_groups * c.o_lora_rank);
    lay.add(a + "attn_sink", DType::F32, {heads}, {1.0f, 0.0f});
    if (c.is_kv_source(l)) {
      lay.linear(a + "compressor.wkv", D, H, false);
      if (c.ratio(l) > 1) lay.linear(a + "compressor.wgate", D, H, false);
      lay.norm(a + "compressor.norm.weight", D);
      lay.linear(a + "indexer.wk", di, D, false);
      lay.norm(a + "indexer.k_norm.weight", di);
    }
    if (c.is_index_source(l)) {
      lay.linear(a + "indexer.wq_b", nh * di, ql, false);
      lay.linear(a + "indexer.weights_proj", nh, H, false);
    }
    lay.linear(f + "gate", E, H, false);
    lay.add(f + "gate.bias", DType::F32, {E}, {0.1f, 0.0f});
    lay.add(f + "gate.bias_vl", DType::F32, {E}, {0.1f, 0.0f});
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = f + "experts." + std::to_string(e) + ".";
      lay.linear(x + "w1", I, H);
      lay.linear(x + "w3", I, H);
      lay.linear(x + "w2", H, I);
    }
    if (c.base.n_shared_experts > 0) {
      lay.linear(f + "shared_experts.w1", I, H);
      lay.linear(f + "shared_experts.w3", I, H);
      lay.linear(f + "shared_experts.w2", H, I);
    }
  }
  return lay.take();
}

V41Weights random_v41_weights(const DeepseekV41Config& c, uint64_t seed, DType weight_dtype) {
  RandomTensors t = make_random_tensors(v41_random_specs(c, weight_dtype), seed, 0, nullptr);
  V41Weights w;
  for (const std::shared_ptr<const void>& o : t.owners)
    w.owners.push_back(std::const_pointer_cast<void>(o));
  V4TensorLoader ld(c, t.source, "random weights (seed " + std::to_string(seed) + ")", w.owners,
                    pr_name);
  load(c, ld, w);
  return w;
}

}  // namespace deepinfer
