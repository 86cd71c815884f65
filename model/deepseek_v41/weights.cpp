#include "model/deepseek_v41/weights.h"

#include <cmath>

#include <filesystem>
#include <set>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/deepseek_v41/engram_hash.h"
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
  const EngramHashing hashing = make_engram_hashing(c, 0);
  const int64_t hc = c.hc_mult, hd = c.engram_head_dim;
  for (size_t e = 0; e < c.engram_layers.size(); ++e) {
    const int l = c.engram_layers[e];
    const std::string g = "layers." + std::to_string(l) + ".engram.";
    V41Layer& L = w.layers[static_cast<size_t>(l)];
    const int64_t rows = hashing.rows[e];
    DI_CHECK(c.engram_num_embeddings[e] == rows, c.base.source,
             ": field 'engram_num_embeddings': Engram layer ", l, " has ",
             c.engram_num_embeddings[e], " rows but its bucket primes (engram_vocab_size ",
             c.engram_vocab_size, ", ", c.engram_max_ngram_size - 1, " n-gram sizes x ",
             c.engram_n_heads, " heads) address ", rows);
    const std::string tname = g + "embed.weight";
    Tensor t = ld.raw(tname, "Engram table");
    ld.check_dims(t, tname, {rows, hd}, "Engram table [sum of the layer's bucket primes, engram_head_dim]");
    DI_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16 || t.dtype == DType::F8_E4M3,
             "tensor '", ld.resolve(tname), "' (Engram table) is ", dtype_name(t.dtype),
             ", expected F32, BF16 or F8_E4M3 (with an E8M0 scale per 32 channels)");
    L.engram_table = t;
    if (t.dtype == DType::F8_E4M3) {  // its scales, mapped as they are (E8M0 bytes or F32)
      const std::string sname = g + "embed.scale";
      Tensor s = ld.raw(sname, "Engram table scales");
      ld.check_dims(s, sname, {rows, hd / 32}, "Engram table scales [rows, engram_head_dim / 32]");
      DI_CHECK(s.dtype == DType::F8_E8M0 || s.dtype == DType::U8 || s.dtype == DType::F32,
               "tensor '", ld.resolve(sname), "' (Engram table scales) is ", dtype_name(s.dtype),
               ", expected F8_E8M0, U8 (E8M0 bytes) or F32");
      L.engram_scale = s;
    }
    L.engram_wkv = ld.linear(g + "wkv", (hc + 1) * H, hashing.cols() * hd, "Engram key/value projection",
                             true);
    Tensor q = ld.f32(g + "q_weight", {hc, H}, "Engram q_weight [hc, hidden]");
    Tensor k = ld.f32(g + "k_weight", {hc, H}, "Engram k_weight [hc, hidden]");
    auto b = std::make_shared<HostBuffer>(DType::F32, std::vector<int64_t>{hc, H});
    for (int64_t i = 0; i < hc * H; ++i)
      b->ptr<float>()[i] = q.ptr<const float>()[i] * k.ptr<const float>()[i];
    w.owners.push_back(b);
    L.engram_weight = b->tensor();
  }
}

// Checks `map` (vocab_size ids) against the config; `what` names its source.
void check_token_map(const DeepseekV41Config& c, const std::vector<int32_t>& map,
                     const std::string& what) {
  DI_CHECK(static_cast<int64_t>(map.size()) == c.base.vocab_size, what, " has ", map.size(),
           " entries, expected vocab_size ", c.base.vocab_size);
  std::set<int32_t> distinct;
  for (int32_t v : map) {
    DI_CHECK(v >= 0 && v < c.engram_compressed_vocab_size, what, ": compressed id ", v,
             " outside [0, engram_compressed_vocab_size ", c.engram_compressed_vocab_size, ")");
    distinct.insert(v);
  }
  DI_CHECK(static_cast<int64_t>(distinct.size()) == c.engram_compressed_vocab_size, what, " has ",
           distinct.size(), " distinct compressed ids but engram_compressed_vocab_size is ",
           c.engram_compressed_vocab_size, " (the hash multipliers derive from it)");
}

std::vector<int32_t> read_token_map(const DeepseekV41Config& c, const CheckpointReader& main) {
  auto read = [&](const CheckpointReader& r, const std::string& name) {
    const Tensor t = r.tensor(name);
    const std::string what = "tensor '" + name + "' of " + r.path();
    DI_CHECK(t.ndim == 1 && (t.dtype == DType::I32 || t.dtype == DType::I64), what,
             " (the Engram token map) must be I32/I64 [vocab_size], got ", t.describe());
    std::vector<int32_t> map(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i)
      map[static_cast<size_t>(i)] = t.dtype == DType::I32
                                        ? t.ptr<const int32_t>()[i]
                                        : static_cast<int32_t>(t.ptr<const int64_t>()[i]);
    check_token_map(c, map, what);
    return map;
  };
  if (main.has("engram.token_map")) return read(main, "engram.token_map");
  namespace fs = std::filesystem;
  fs::path dir(main.path());
  if (!fs::is_directory(dir)) dir = dir.parent_path();
  const fs::path side = dir / "engram_token_map.safetensors";
  DI_CHECK(fs::exists(side), main.path(),
           ": Engram layers need the compressed token map: neither tensor 'engram.token_map' nor ",
           side.string(), " (tensor 'token_map', I32 [vocab_size]) exists");
  const CheckpointReader r = CheckpointReader::open(side.string());
  return read(r, "token_map");
}

}  // namespace

V41Weights load_v41_weights(const DeepseekV41Config& c,
                            std::shared_ptr<const CheckpointReader> reader) {
  V41Weights w;
  w.owners.push_back(std::const_pointer_cast<void>(std::static_pointer_cast<const void>(reader)));
  V4TensorLoader ld(c, reader, w.owners, pr_name);
  load(c, ld, w);
  if (!c.engram_layers.empty()) w.engram_token_map = read_token_map(c, *reader);
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
  const EngramHashing hashing = make_engram_hashing(c, 0);
  for (size_t e = 0; e < c.engram_layers.size(); ++e) {
    const std::string g = "layers." + std::to_string(c.engram_layers[e]) + ".engram.";
    lay.add(g + "embed.weight", lay.dense_dtype(), {hashing.rows[e], c.engram_head_dim},
            {1.0f, 0.0f});
    lay.linear(g + "wkv", (hc + 1) * H, hashing.cols() * c.engram_head_dim, false);
    lay.add(g + "q_weight", DType::F32, {hc, H}, {0.3f, 1.0f});
    lay.add(g + "k_weight", DType::F32, {hc, H}, {0.3f, 1.0f});
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
  for (int64_t i = 0; i < c.base.vocab_size && !c.engram_layers.empty(); ++i)
    w.engram_token_map.push_back(static_cast<int32_t>(i % c.engram_compressed_vocab_size));
  return w;
}

}  // namespace deepinfer
