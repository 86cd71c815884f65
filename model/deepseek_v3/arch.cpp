// The deepseek_v3 / deepseek_v2 registry entries: config.json + weights -> a
// DeepseekV3Model on a backend. On the CPU backend the weights are the mmapped (or
// random host) tensors themselves (zero copy); on other backends they are uploaded once.
#include "model/deepseek_v3/arch.h"

#include <nlohmann/json.hpp>

#include "model/deepseek_v3/config.h"
#include "model/deepseek_v3/model.h"
#include "model/layers/mla.h"
#include "model/model.h"
#include "model/parallel.h"

namespace deepinfer {
namespace {

// Several processes: the rank's shard of the host weights (model/parallel.h) is what the model
// gets; absorbed MLA weights come from its heads.
std::unique_ptr<Model> build(ModelConfig config, ModelWeights host, Backend& backend,
                             const LoadOptions& options) {
  ParallelPlan plan;
  std::vector<std::vector<ExpertWeights>> eplb_experts;  // every logical expert: EPLB re-placement
  std::vector<std::shared_ptr<const void>> eplb_owners;  // their host memory (device backends upload)
  if (options.parallel != nullptr) {
    plan = *options.parallel;
    plan.block_aligned = backend.device() != Device::CPU;
    if (plan.experts_split && plan.eplb_interval > 0) {
      for (const LayerWeights& l : host.layers) eplb_experts.push_back(l.is_moe ? l.moe.experts : std::vector<ExpertWeights>{});
      if (backend.device() != Device::CPU) eplb_owners = host.owners;
    }
    host = shard_weights(host, config, plan);
  }
  // Derived absorbed-MLA weights come from the host view, before any upload.
  std::vector<MlaAbsorbedWeights> absorbed =
      make_absorbed_weights(local_model_config(config, plan), host, backend);
  ModelWeights weights =
      backend.device() == Device::CPU ? std::move(host) : upload_weights(host, backend);
  return std::make_unique<DeepseekV3Model>(std::move(config), std::move(weights),
                                           std::move(absorbed), backend, plan, std::move(eplb_experts),
                                           std::move(eplb_owners));
}

// Random weights on a device backend: made there from the seed (fill_random kernels for the big
// tensors, BF16 or FP8 e4m3; the small F32 scale/norm tensors on the host), bit-identical to
// make_random_weights + upload_weights without a host pass over the weights (FP8 bench model:
// 172 s of host quantization before). make_absorbed_weights reads kv_b_proj from a host copy.
std::unique_ptr<Model> build_random_on_device(ModelConfig config, const LoadOptions& options,
                                              Backend& backend) {
  ModelWeights weights = make_random_weights(config, options.seed, options.random_weight_dtype,
                                             options.load_mtp, backend);
  std::vector<MlaAbsorbedWeights> absorbed = make_absorbed_weights(config, weights, backend);
  return std::make_unique<DeepseekV3Model>(std::move(config), std::move(weights),
                                           std::move(absorbed), backend);
}

std::unique_ptr<Model> build_random(ModelConfig config, const LoadOptions& options,
                                    Backend& backend) {
  const DType dt = options.random_weight_dtype;
  // Several processes shard host weights (the device path makes every tensor on the device).
  const bool sharded = options.parallel != nullptr && options.parallel->any();
  if (backend.device() != Device::CPU && (dt == DType::BF16 || dt == DType::F8_E4M3) && !sharded)
    return build_random_on_device(std::move(config), options, backend);
  ModelWeights host = make_random_weights(config, options.seed, dt, options.load_mtp);
  return build(std::move(config), std::move(host), backend, options);
}

std::unique_ptr<Model> load(ModelConfig config, const std::string& dir, Backend& backend,
                            const LoadOptions& options) {
  if (options.random_weights) return build_random(std::move(config), options, backend);
  ModelWeights host = load_weights(dir, config, options);
  return build(std::move(config), std::move(host), backend, options);
}

}  // namespace

Architecture deepseek_v3_architecture() {
  Architecture a{"deepseek_v3", "DeepSeek-V3, R1, V3.1 (MLA, sigmoid group-limited MoE, MTP)",
                 [](const nlohmann::json& root, const std::string& source) {
                   return parse_deepseek_v3_config(root, source, DeepseekV3Family::V3);
                 },
                 load};
  a.kv_groups = deepseek_v3_kv_groups;
  return a;
}

Architecture deepseek_v2_architecture() {
  Architecture a{"deepseek_v2", "DeepSeek-V2, V2-Lite (MLA, softmax MoE)",
                 [](const nlohmann::json& root, const std::string& source) {
                   return parse_deepseek_v3_config(root, source, DeepseekV3Family::V2);
                 },
                 load};
  a.kv_groups = deepseek_v3_kv_groups;
  return a;
}

}  // namespace deepinfer
