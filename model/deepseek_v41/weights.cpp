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

// One block under prefix p (`layers.N.` or a DSpark stage's `mtp.N.`): main layer l (its compressor
// and indexer where l is a KV / index source), or l < 0: a drafter stage (window attention only). Its
// routed experts are the loader's config's n_routed_experts.
V41Layer load_block(const DeepseekV41Config& c, V4TensorLoader& ld, const std::string& p, int l, int64_t E,
                    std::vector<std::shared_ptr<void>>& owners, bool packed_fp4 = false) {
  const int64_t H = c.base.hidden_size;
  const int64_t heads = c.base.num_attention_heads, D = c.head_dim, ql = c.base.q_lora_rank;
  const int64_t nh = c.index_n_heads, di = c.index_head_dim;
  const std::string a = p + "attn.", f = p + "ffn.";
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
  // wo_a is cut into its groups' rows (v4_family::grouped_output): FP8 where device formats are
  // asked for and the groups fall on whole scale blocks, else dequantized.
  const bool wo_a_fp8 = packed_fp4 && c.base.quantization.block_n > 0 && c.o_lora_rank % c.base.quantization.block_n == 0;
  L.wo_a = ld.linear(a + "wo_a", c.o_groups * c.o_lora_rank, heads * D / c.o_groups,
                     "grouped output wo_a", !wo_a_fp8);
  L.wo_b = ld.linear(a + "wo_b", H, c.o_groups * c.o_lora_rank, "output wo_b");
  L.sinks = ld.f32(a + "attn_sink", {heads}, "attention sinks");
  if (l >= 0 && c.is_kv_source(l)) {
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
  if (l >= 0 && c.is_index_source(l)) {
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
    owners.push_back(b);
    L.gate.w = b->tensor();
  }
  L.gate_bias = ld.f32(f + "gate.bias", {E}, "router selection bias");
  L.gate_bias_vl =
      ld.f32(f + "gate.bias_vl", {E}, "router selection bias of image tokens (bias_vl)");
  L.experts = ld.expert_list(f, packed_fp4);
  if (c.base.n_shared_experts > 0) L.shared = ld.shared_expert(f);
  return L;
}

// The DSpark drafter (dspark.h) under DeepSeek's names: stages `mtp.S.*` as window-only blocks of
// dc's (the drafter's) experts, `mtp.0.main_{proj,norm}`, and on the last stage `hc_head_*`, `norm`,
// `markov_head.markov_w{1,2}` and (optional) `confidence_head.proj`. packed_fp4: the stages' FP4
// experts and FP8 wo_a stay packed as the main layers' (load_block).
void load_dspark(const DeepseekV41Config& dc, V4TensorLoader& ld, V41Weights& w, bool packed_fp4) {
  DsparkWeights& d = w.dspark;
  const int S = dc.base.num_nextn_predict_layers;
  const int64_t H = dc.base.hidden_size, V = dc.base.vocab_size, hc = dc.hc_mult, r = dc.dspark_markov_rank;
  const int64_t taps = static_cast<int64_t>(dc.dspark_target_layers.size());
  for (int s = 0; s < S; ++s) {
    ld.set_note("DSpark drafter stage " + std::to_string(s));
    d.stages.push_back(
        load_block(dc, ld, "mtp." + std::to_string(s) + ".", -1, dc.base.n_routed_experts, w.owners, packed_fp4));
  }
  ld.set_note("");
  d.main_proj = ld.linear("mtp.0.main_proj", H, taps * H,
                          "DSpark target fuse main_proj [hidden, len(dspark_target_layer_ids) * hidden]", true);
  d.main_norm = ld.f32("mtp.0.main_norm.weight", {H}, "DSpark target fuse norm");
  const std::string last = "mtp." + std::to_string(S - 1) + ".";
  d.hc_head = {ld.f32(last + "hc_head_fn", {hc, hc * H}, "DSpark hc_head fn [hc, hc * hidden]"),
               ld.f32(last + "hc_head_base", {hc}, "DSpark hc_head base [hc]"),
               ld.f32(last + "hc_head_scale", {1}, "DSpark hc_head scale [1]")};
  d.norm = ld.f32(last + "norm.weight", {H}, "DSpark final norm");
  if (r > 0) {
    const std::string n1 = last + "markov_head.markov_w1.weight";
    Tensor t = ld.raw(n1, "DSpark Markov embedding");
    ld.check_dims(t, n1, {V, r}, "DSpark Markov embedding [vocab, dspark_markov_rank]");
    DI_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, "tensor '", ld.resolve(n1),
             "' (DSpark Markov embedding) is ", dtype_name(t.dtype), ", expected F32 or BF16");
    d.markov_w1 = t;
    d.markov_w2 = ld.linear(last + "markov_head.markov_w2", V, r, "DSpark Markov projection [vocab, rank]", true);
  }
  const std::string conf = last + "confidence_head.proj";
  if (dc.dspark_confidence_head && !ld.resolve(conf + ".weight").empty())
    d.confidence = ld.linear(conf, 1, H + (dc.dspark_confidence_with_markov ? r : 0),
                             "DSpark confidence head [1, hidden (+ dspark_markov_rank with the Markov embedding)]",
                             true);
}

// Whether the checkpoint carries the drafter the config declares.
bool has_dspark(const DeepseekV41Config& c, const V4TensorLoader& ld) {
  return c.base.num_nextn_predict_layers > 0 && !ld.resolve("mtp.0.main_proj.weight").empty();
}

void load(const DeepseekV41Config& c, V4TensorLoader& ld, V41Weights& w, bool packed_fp4) {
  const int64_t H = c.base.hidden_size, V = c.base.vocab_size, E = c.base.n_routed_experts;
  w.embed = ld.embedding();
  w.norm = ld.f32("norm.weight", {H}, "final norm");
  w.head = ld.linear("head", V, H, "output head");
  for (int l = 0; l < c.num_layers(); ++l)
    w.layers.push_back(load_block(c, ld, "layers." + std::to_string(l) + ".", l, E, w.owners, packed_fp4));
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
                            std::shared_ptr<const CheckpointReader> reader, bool packed_fp4) {
  V41Weights w;
  w.owners.push_back(std::const_pointer_cast<void>(std::static_pointer_cast<const void>(reader)));
  V4TensorLoader ld(c, reader, w.owners, pr_name);
  load(c, ld, w, packed_fp4);
  if (has_dspark(c, ld)) {
    const DeepseekV41Config dc = dspark_stage_config(c);
    V4TensorLoader dl(dc, reader, w.owners, pr_name);
    load_dspark(dc, dl, w, packed_fp4);
  }
  if (!c.engram_layers.empty()) w.engram_token_map = read_token_map(c, *reader);
  return w;
}

void load_dspark_weights(const DeepseekV41Config& c, std::shared_ptr<const CheckpointReader> reader,
                         V41Weights& w) {
  DI_CHECK(c.base.num_nextn_predict_layers > 0, c.base.source,
           ": field 'num_nextn_predict_layers' is 0: the config declares no DSpark drafter stages");
  w.owners.push_back(std::const_pointer_cast<void>(std::static_pointer_cast<const void>(reader)));
  const DeepseekV41Config dc = dspark_stage_config(c);
  V4TensorLoader dl(dc, reader, w.owners, pr_name);
  load_dspark(dc, dl, w, /*packed_fp4=*/false);
}

std::vector<TensorSpec> v41_random_specs(const DeepseekV41Config& c, DType weight_dtype, bool fp4_experts) {
  RandomLayout lay(c.base, weight_dtype);
  lay.set_v4_family(/*e8m0_scales=*/true);
  const bool fp4 = fp4_experts && lay.fp8();
  // wo_a is cut into its groups' rows: FP8 only where they fall on whole scale blocks. The drafter's
  // stages take the main layers' formats (FP4 experts, FP8 wo_a): the CUDA expert kernels take FP8
  // only in 128x128 blocks, so 32x32 FP8 experts could not run there.
  const bool wo_a_fp8 = c.o_lora_rank % lay.block_n() == 0;
  const int64_t H = c.base.hidden_size, V = c.base.vocab_size, hc = c.hc_mult,
                mixes = (2 + hc) * hc;
  const int64_t heads = c.base.num_attention_heads, D = c.head_dim, ql = c.base.q_lora_rank;
  const int64_t I = c.base.moe_intermediate_size;
  const int64_t nh = c.index_n_heads, di = c.index_head_dim;
  const float fn_bound = static_cast<float>(std::sqrt(3.0 / static_cast<double>(hc * H)));
  lay.add("embed.weight", lay.dense_dtype(), {V, H}, {1.0f, 0.0f});
  lay.norm("norm.weight", H);
  lay.linear("head", V, H, false);
  // Block specs under prefix p: main layer l, or l < 0 a drafter stage (E experts of width I).
  auto block = [&](const std::string& p, int l, int64_t experts) {
    const std::string a = p + "attn.", f = p + "ffn.";
    lay.norm(p + "attn_norm.weight", H);
    lay.norm(p + "ffn_norm.weight", H);
    for (const char* site : {"hc_attn_", "hc_ffn_"}) {
      lay.add(p + site + "fn", DType::F32, {mixes, hc * H}, {fn_bound, 0.0f}, true);
      lay.add(p + site + "base", DType::F32, {mixes}, {0.5f, 0.0f}, true);
      lay.add(p + site + "scale", DType::F32, {3}, {0.1f, 1.0f}, true);
    }
    lay.linear(a + "wq_a", ql, H);
    lay.norm(a + "q_norm.weight", ql);
    lay.linear(a + "wq_b", heads * D, ql);
    lay.linear(a + "wkv", D, H);
    lay.norm(a + "kv_norm.weight", D);
    lay.linear(a + "wo_a", c.o_groups * c.o_lora_rank, heads * D / c.o_groups, wo_a_fp8);
    lay.linear(a + "wo_b", H, c.o_groups * c.o_lora_rank);
    lay.add(a + "attn_sink", DType::F32, {heads}, {1.0f, 0.0f}, true);
    if (l >= 0 && c.is_kv_source(l)) {
      lay.linear(a + "compressor.wkv", D, H, false);
      if (c.ratio(l) > 1) lay.linear(a + "compressor.wgate", D, H, false);
      lay.norm(a + "compressor.norm.weight", D);
      lay.linear(a + "indexer.wk", di, D, false);
      lay.norm(a + "indexer.k_norm.weight", di);
    }
    if (l >= 0 && c.is_index_source(l)) {
      lay.linear(a + "indexer.wq_b", nh * di, ql, false);
      lay.linear(a + "indexer.weights_proj", nh, H, false);
    }
    lay.linear(f + "gate", experts, H, false, /*host=*/true);  // divided by gate_temp on the host
    lay.add(f + "gate.bias", DType::F32, {experts}, {0.1f, 0.0f}, true);
    lay.add(f + "gate.bias_vl", DType::F32, {experts}, {0.1f, 0.0f}, true);
    for (int64_t e = 0; e < experts; ++e) {
      const std::string x = f + "experts." + std::to_string(e) + ".";
      if (fp4) {
        lay.fp4_linear(x + "w1", I, H);
        lay.fp4_linear(x + "w3", I, H);
        lay.fp4_linear(x + "w2", H, I);
      } else {
        lay.linear(x + "w1", I, H);
        lay.linear(x + "w3", I, H);
        lay.linear(x + "w2", H, I);
      }
    }
    if (c.base.n_shared_experts > 0) {
      lay.linear(f + "shared_experts.w1", I, H);
      lay.linear(f + "shared_experts.w3", I, H);
      lay.linear(f + "shared_experts.w2", H, I);
    }
  };
  for (int l = 0; l < c.num_layers(); ++l) block("layers." + std::to_string(l) + ".", l, c.base.n_routed_experts);
  const EngramHashing hashing = make_engram_hashing(c, 0);
  for (size_t e = 0; e < c.engram_layers.size(); ++e) {
    const std::string g = "layers." + std::to_string(c.engram_layers[e]) + ".engram.";
    lay.add(g + "embed.weight", lay.dense_dtype(), {hashing.rows[e], c.engram_head_dim},
            {1.0f, 0.0f});
    lay.linear(g + "wkv", (hc + 1) * H, hashing.cols() * c.engram_head_dim, false);
    lay.add(g + "q_weight", DType::F32, {hc, H}, {0.3f, 1.0f}, true);
    lay.add(g + "k_weight", DType::F32, {hc, H}, {0.3f, 1.0f}, true);
  }
  if (c.base.num_nextn_predict_layers > 0) {  // the DSpark drafter (load_dspark's names; after
    // every other tensor, so theirs keep their random values)
    const int S = c.base.num_nextn_predict_layers;
    const int64_t r = c.dspark_markov_rank, taps = static_cast<int64_t>(c.dspark_target_layers.size());
    for (int s = 0; s < S; ++s) block("mtp." + std::to_string(s) + ".", -1, c.dspark_n_routed_experts);
    lay.linear("mtp.0.main_proj", H, taps * H, false);
    lay.norm("mtp.0.main_norm.weight", H);
    const std::string last = "mtp." + std::to_string(S - 1) + ".";
    lay.add(last + "hc_head_fn", DType::F32, {hc, hc * H}, {fn_bound, 0.0f}, true);
    lay.add(last + "hc_head_base", DType::F32, {hc}, {0.5f, 0.0f}, true);
    lay.add(last + "hc_head_scale", DType::F32, {1}, {0.1f, 1.0f}, true);
    lay.norm(last + "norm.weight", H);
    if (r > 0) {
      lay.add(last + "markov_head.markov_w1.weight", lay.dense_dtype(), {V, r}, {1.0f, 0.0f});
      lay.linear(last + "markov_head.markov_w2", V, r, false);
    }
    if (c.dspark_confidence_head)
      lay.linear(last + "confidence_head.proj", 1, H + (c.dspark_confidence_with_markov ? r : 0), false,
                 /*host=*/true);  // DsparkDrafter reads its row on the host
  }
  return lay.take();
}

V41Weights random_v41_weights(const DeepseekV41Config& c, uint64_t seed, DType weight_dtype, bool fp4_experts,
                              Backend* backend) {
  const bool device = backend != nullptr && backend->device() != Device::CPU;
  RandomTensors t =
      make_random_tensors(v41_random_specs(c, weight_dtype, fp4_experts), seed, 0, device ? backend : nullptr);
  V41Weights w;
  for (const std::shared_ptr<const void>& o : t.owners)
    w.owners.push_back(std::const_pointer_cast<void>(o));
  const std::string origin = "random weights (seed " + std::to_string(seed) + ")";
  V4TensorLoader ld(c, t.source, origin, w.owners, pr_name);
  load(c, ld, w, /*packed_fp4=*/device);
  if (has_dspark(c, ld)) {
    const DeepseekV41Config dc = dspark_stage_config(c);
    V4TensorLoader dl(dc, t.source, origin, w.owners, pr_name);
    load_dspark(dc, dl, w, /*packed_fp4=*/device);
  }
  for (int64_t i = 0; i < c.base.vocab_size && !c.engram_layers.empty(); ++i)
    w.engram_token_map.push_back(static_cast<int32_t>(i % c.engram_compressed_vocab_size));
  return w;
}

}  // namespace deepinfer
