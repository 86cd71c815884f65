// The deepseek_v32 registry entry: config.json + weights -> a DeepseekV32Model on any backend
// with the DeepSeek sparse attention ops (CPU, CUDA).
#include "model/deepseek_v32/arch.h"

#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "model/deepseek_v3/model.h"
#include "model/deepseek_v32/config.h"
#include "model/deepseek_v32/model.h"
#include "model/deepseek_v32/weights.h"
#include "model/weight_check.h"

namespace deepinfer {

namespace {

// scale_fmt "ue8m0" (V3.1 / V3.2): every block scale is a power of two (DeepSeek's
// fast_round_scale); a checkpoint that says so but holds another value is refused, naming
// the tensor, since kernels may store the scales as bare exponents.
void check_ue8m0_scales(const ModelConfig& c, const CheckpointReader& reader) {
  if (c.quantization.scale_fmt != "ue8m0") return;
  for (const std::string& name : reader.names()) {
    if (name.size() < 10 || name.compare(name.size() - 10, 10, "_scale_inv") != 0) continue;
    const Tensor t = reader.tensor(name);
    if (t.dtype != DType::F32) continue;  // the weight loaders name a wrong dtype
    const float* v = t.ptr<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      int e = 0;
      const float m = std::frexp(v[i], &e);
      DI_CHECK(std::isfinite(v[i]) && m == 0.5f, "tensor '", name, "' in ", reader.info(name).file,
               " holds block scale ", v[i], " at element ", i, ", not a power of two, but config ",
               c.source, " says quantization_config.scale_fmt = 'ue8m0'");
    }
  }
}

// The absorbed MLA weights come from `weights` (host view, or a host copy of kv_b_proj for
// weights made on the device); host weights then go to a device backend once (the CPU keeps
// them: mmapped views, zero copy).
std::unique_ptr<Model> build(ModelConfig config, ModelWeights weights,
                             std::vector<IndexerWeights> indexer, Backend& backend) {
  std::vector<MlaAbsorbedWeights> absorbed = make_absorbed_weights(config, weights, backend);
  if (backend.device() != Device::CPU && weights.embed_tokens.device == Device::CPU) {
    ModelWeights device = upload_weights(weights, backend);
    indexer = upload_indexer_weights(indexer, backend, device.owners);
    weights = std::move(device);
  }
  return std::make_unique<DeepseekV32Model>(std::move(config), std::move(weights),
                                            std::move(absorbed), std::move(indexer), backend);
}

// Random weights (bench, tests): V3's tensors (MTP blocks with options.load_mtp), then the
// indexers', from the seed; made on a device backend directly for BF16 / FP8 (as V3's random
// weights are), else on the host.
std::unique_ptr<Model> build_random(ModelConfig config, const LoadOptions& options, Backend& backend) {
  const DType dt = options.random_weight_dtype;
  const bool on_device = backend.device() != Device::CPU && (dt == DType::BF16 || dt == DType::F8_E4M3);
  ModelWeights weights = on_device ? make_random_weights(config, options.seed, dt, options.load_mtp, backend)
                                   : make_random_weights(config, options.seed, dt, options.load_mtp);
  std::vector<IndexerWeights> indexer =
      make_random_indexer_weights(config, options.seed, dt, on_device ? &backend : nullptr, weights.owners,
                                  static_cast<int>(weights.mtp.size()));
  return build(std::move(config), std::move(weights), std::move(indexer), backend);
}

std::unique_ptr<Model> load(ModelConfig config, const std::string& dir, Backend& backend,
                            const LoadOptions& options) {
  if (options.random_weights) return build_random(std::move(config), options, backend);
  auto reader = std::make_shared<const CheckpointReader>(CheckpointReader::open(dir));
  ModelWeights weights = load_weights(reader, config, options);  // weights.owners keeps the reader
  // The MTP blocks loaded (those the checkpoint has) carry an indexer too (model.h).
  const int num_mtp = static_cast<int>(weights.mtp.size());
  std::vector<IndexerWeights> indexer = load_indexer_weights(config, *reader, num_mtp);
  if (options.check_finite) {
    std::vector<NamedTensor> tensors;
    for (int l = 0; l < config.num_hidden_layers + num_mtp; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".self_attn.indexer.";
      for (const char* n : {"wq_b.weight", "wq_b.weight_scale_inv", "wk.weight", "wk.weight_scale_inv",
                            "k_norm.weight", "k_norm.bias", "weights_proj.weight",
                            "weights_proj.weight_scale_inv"}) {
        if (reader->has(p + n)) tensors.push_back({p + n, reader->info(p + n).file, reader->tensor(p + n)});
      }
    }
    check_weights_finite(tensors, default_thread_pool());
  }
  check_ue8m0_scales(config, *reader);
  return build(std::move(config), std::move(weights), std::move(indexer), backend);
}

}  // namespace

Architecture deepseek_v32_architecture() {
  Architecture a;
  a.model_type = "deepseek_v32";
  a.description = "DeepSeek-V3.2 (V3 + lightning-indexer sparse attention)";
  a.parse_config = parse_deepseek_v32_config;
  a.load = load;
  a.check_extra_weights = [](const ModelConfig& config, const CheckpointReader& reader) {
    int num_mtp = 0;  // the MTP blocks the checkpoint holds (V3's rule: eh_proj present)
    while (num_mtp < config.num_nextn_predict_layers &&
           reader.has("model.layers." + std::to_string(config.num_hidden_layers + num_mtp) + ".eh_proj.weight"))
      ++num_mtp;
    load_indexer_weights(config, reader, num_mtp);
    check_ue8m0_scales(config, reader);
  };
  a.kv_groups = deepseek_v32_kv_groups;
  return a;
}

}  // namespace deepinfer
