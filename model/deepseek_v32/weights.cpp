#include "model/deepseek_v32/weights.h"

#include "core/error.h"
#include "io/safetensors.h"
#include "model/deepseek_v32/config.h"

namespace deepinfer {

namespace {

Tensor checked(const TensorSource& src, const ModelConfig& c, const std::string& name,
               const std::vector<int64_t>& dims, std::initializer_list<DType> dtypes,
               const char* what) {
  std::optional<Tensor> t = src.find(name);
  DI_CHECK(t.has_value(), "tensor '", name, "' (", what, ") is missing from ", src.describe(name));
  DI_CHECK(t->dims() == dims, "tensor '", name, "' in ", src.describe(name), " has shape ",
           shape_string(t->dims()), " but config ", c.source, " expects ", shape_string(dims), " (",
           what, ")");
  for (DType d : dtypes)
    if (t->dtype == d) return *t;
  fail("tensor '", name, "' in ", src.describe(name), " has dtype ", dtype_name(t->dtype),
       " which ", what, " cannot be");
}

Weight linear(const TensorSource& src, const ModelConfig& c, const std::string& prefix, int64_t n,
              int64_t k, const char* what) {
  Weight w;
  w.w = checked(src, c, prefix + ".weight", {n, k}, {DType::F32, DType::BF16, DType::F8_E4M3}, what);
  if (w.w.dtype == DType::F8_E4M3) {
    const int64_t bn = c.quantization.block_n, bk = c.quantization.block_k;
    DI_CHECK(c.quantization.is_fp8(), "tensor '", prefix, ".weight' is F8_E4M3 but config ",
             c.source, " has no fp8 quantization_config");
    w.block_n = static_cast<int>(bn);
    w.block_k = static_cast<int>(bk);
    w.scale_inv = checked(src, c, prefix + ".weight_scale_inv", {(n + bn - 1) / bn, (k + bk - 1) / bk},
                          {DType::F32}, "FP8 block scales");
  }
  return w;
}

}  // namespace

std::vector<IndexerWeights> assemble_indexer_weights(const ModelConfig& c, const TensorSource& src, int num_mtp) {
  const IndexerDims& d = deepseek_v32_indexer(c);
  std::vector<IndexerWeights> out(static_cast<size_t>(c.num_hidden_layers + num_mtp));
  for (int l = 0; l < c.num_hidden_layers + num_mtp; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.indexer.";
    IndexerWeights& w = out[static_cast<size_t>(l)];
    w.wq_b = linear(src, c, p + "wq_b", d.n_heads * d.head_dim, c.q_lora_rank,
                    "indexer query [index_n_heads * index_head_dim, q_lora_rank]");
    w.wk = linear(src, c, p + "wk", d.head_dim, c.hidden_size, "indexer key [index_head_dim, hidden]");
    w.k_norm = checked(src, c, p + "k_norm.weight", {d.head_dim}, {DType::F32, DType::BF16},
                       "indexer key LayerNorm weight [index_head_dim]");
    w.k_norm_bias = checked(src, c, p + "k_norm.bias", {d.head_dim}, {DType::F32, DType::BF16},
                            "indexer key LayerNorm bias [index_head_dim]");
    w.weights_proj = linear(src, c, p + "weights_proj", d.n_heads, c.hidden_size,
                            "indexer head weights [index_n_heads, hidden]");
  }
  return out;
}

std::vector<IndexerWeights> load_indexer_weights(const ModelConfig& config,
                                                 const CheckpointReader& reader, int num_mtp) {
  const CheckpointReader* r = &reader;
  TensorSource source;
  source.find = [r](const std::string& name) -> std::optional<Tensor> {
    if (!r->has(name)) return std::nullopt;
    return r->tensor(name);
  };
  source.describe = [r](const std::string& name) {
    return r->has(name) ? r->info(name).file : r->path();
  };
  return assemble_indexer_weights(config, source, num_mtp);
}

std::vector<IndexerWeights> upload_indexer_weights(const std::vector<IndexerWeights>& host,
                                                   Backend& backend,
                                                   std::vector<std::shared_ptr<const void>>& owners) {
  std::vector<IndexerWeights> out = host;
  auto upload = [&](Tensor& t) {
    if (!t.defined() || t.device == backend.device()) return;
    DI_CHECK(t.is_contiguous(), "upload_indexer_weights: tensor ", t.describe(), " is not contiguous");
    auto buffer = std::make_shared<DeviceBuffer>(backend.alloc(t.dtype, t.dims()));
    backend.copy(t, buffer->tensor());
    t = buffer->tensor();
    owners.push_back(std::move(buffer));
  };
  for (IndexerWeights& w : out) {
    for (Weight* lin : {&w.wq_b, &w.wk, &w.weights_proj}) {
      upload(lin->w);
      upload(lin->scale_inv);
    }
    upload(w.k_norm);
    upload(w.k_norm_bias);
  }
  backend.synchronize();
  return out;
}

std::vector<IndexerWeights> make_random_indexer_weights(const ModelConfig& c, uint64_t seed,
                                                        DType weight_dtype, Backend* backend,
                                                        std::vector<std::shared_ptr<const void>>& owners,
                                                        int num_mtp) {
  const IndexerDims& d = deepseek_v32_indexer(c);
  RandomLayout layout(c, weight_dtype);
  for (int l = 0; l < c.num_hidden_layers + num_mtp; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.indexer.";
    layout.linear(p + "wq_b", d.n_heads * d.head_dim, c.q_lora_rank);
    layout.linear(p + "wk", d.head_dim, c.hidden_size);
    layout.norm(p + "k_norm.weight", d.head_dim);
    layout.norm(p + "k_norm.bias", d.head_dim, {0.1f, 0.0f});
    layout.linear(p + "weights_proj", d.n_heads, c.hidden_size, /*quantizable=*/false);
  }
  // After every tensor of the checkpoint with its MTP layers, whether those are made or not: a
  // layer's indexer weights do not depend on num_mtp.
  const uint64_t first = checkpoint_layout(c, weight_dtype, true).size();
  RandomTensors t = make_random_tensors(layout.take(), seed, first, backend);
  std::vector<IndexerWeights> out = assemble_indexer_weights(c, t.source, num_mtp);
  for (auto& o : t.owners) owners.push_back(std::move(o));
  return out;
}

}  // namespace deepinfer
