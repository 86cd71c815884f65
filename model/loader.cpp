// load_model / random_model: config.json -> the registered architecture
// (model/registry.h) builds the model.
#include "core/error.h"
#include "model/config.h"
#include "model/model.h"
#include "model/registry.h"

namespace deepinfer {
namespace {

std::unique_ptr<Model> build(ModelConfig config, const std::string& dir, Backend& backend,
                             const LoadOptions& options) {
  const Architecture& arch = find_architecture(config.model_type, config.source);
  DI_CHECK(arch.load != nullptr, config.source, ": model_type '", config.model_type, "' (",
           arch.description, "): its config reads, but this build has no forward for it yet");
  return arch.load(std::move(config), dir, backend, options);
}

}  // namespace

int64_t Model::mtp_hidden_size() const { return config().hidden_size; }

void Model::mtp_forward(const StepBatch&, std::span<Tensor>, const Tensor&, Tensor&, Tensor&) {
  fail("model: no MTP layer is loaded (the checkpoint has none, or LoadOptions::load_mtp is off)");
}

std::unique_ptr<Model> load_model(const std::string& dir, Backend& backend,
                                  const LoadOptions& options) {
  ModelConfig config = load_model_config(dir);
  return build(std::move(config), dir, backend, options);
}

std::unique_ptr<Model> random_model(const std::string& config_path, Backend& backend,
                                    const LoadOptions& options) {
  ModelConfig config = load_model_config(config_path);
  LoadOptions random = options;
  random.random_weights = true;
  return build(std::move(config), std::string(), backend, random);
}

}  // namespace deepinfer
