// load_model / random_model: config.json + weights -> a Model on a backend.
// On the CPU backend the weights are the mmapped (or random host) tensors themselves
// (zero copy); on other backends they are uploaded once.
#include "model/deepseek_v3.h"
#include "model/model.h"

namespace deepinfer {
namespace {

std::unique_ptr<Model> build(ModelConfig config, ModelWeights host, Backend& backend) {
  // Derived absorbed-MLA weights come from the host view, before any upload.
  std::vector<MlaAbsorbedWeights> absorbed = make_absorbed_weights(config, host, backend);
  ModelWeights weights =
      backend.device() == Device::CPU ? std::move(host) : upload_weights(host, backend);
  return std::make_unique<DeepseekV3Model>(std::move(config), std::move(weights),
                                           std::move(absorbed), backend);
}

void check_model_type(const ModelConfig& config) {
  DI_CHECK(config.model_type == "deepseek_v3" || config.model_type == "deepseek_v2",
           config.source, ": model_type '", config.model_type,
           "' is not supported by this forward (expected deepseek_v3 or deepseek_v2)");
}

}  // namespace

std::unique_ptr<Model> load_model(const std::string& dir, Backend& backend,
                                  const LoadOptions& options) {
  ModelConfig config = load_model_config(dir);
  check_model_type(config);
  if (options.random_weights) {
    ModelWeights host = make_random_weights(config, options.seed, options.random_weight_dtype,
                                            options.load_mtp);
    return build(std::move(config), std::move(host), backend);
  }
  ModelWeights host = load_weights(dir, config, options);
  return build(std::move(config), std::move(host), backend);
}

std::unique_ptr<Model> random_model(const std::string& config_path, Backend& backend,
                                    const LoadOptions& options) {
  ModelConfig config = load_model_config(config_path);
  check_model_type(config);
  ModelWeights host =
      make_random_weights(config, options.seed, options.random_weight_dtype, options.load_mtp);
  return build(std::move(config), std::move(host), backend);
}

}  // namespace deepinfer
