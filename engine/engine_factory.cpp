// Engine(EngineConfig): backend, model (checkpoint or random weights) and
// tokenizer from the configuration; DEEPINFER_* environment variables that
// concern the engine are honoured here.
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "engine/engine_impl.h"

namespace deepinfer {

Engine::Engine(const EngineConfig& config_in) {
  EngineConfig config = config_in;
  if (const char* v = std::getenv("DEEPINFER_BATCH_INVARIANT"); v && std::string(v) == "1")
    config.batch_invariant = true;
  if (config.model_dir.empty() && config.random_weights_config.empty())
    if (const char* v = std::getenv("DEEPINFER_HF_MODEL_DIR")) config.model_dir = v;
  DI_CHECK(!config.model_dir.empty() || !config.random_weights_config.empty(),
           "EngineConfig: set model_dir (a checkpoint) or random_weights_config (a config.json)");

  BackendOptions bo;
  bo.batch_invariant = config.batch_invariant;
  bo.num_threads = config.num_threads;
  std::unique_ptr<Backend> backend;
  if (config.backend == "cpu") {
    backend = make_cpu_backend(bo);
  } else if (config.backend == "cuda") {
    backend = make_cuda_backend(bo);
    DI_CHECK(backend != nullptr, "EngineConfig.backend: deepinfer was built without CUDA");
  } else {
    fail("EngineConfig.backend: expected cpu or cuda, got '", config.backend, "'");
  }

  LoadOptions lo;
  lo.load_mtp = false;  // no speculative decoding yet
  lo.seed = config.random_weights_seed;
  DI_CHECK(config.random_weights_dtype == "bf16" || config.random_weights_dtype == "fp8",
           "EngineConfig.random_weights_dtype: expected bf16 or fp8, got '",
           config.random_weights_dtype, "'");
  lo.random_weight_dtype = config.random_weights_dtype == "fp8" ? DType::F8_E4M3 : DType::BF16;
  std::unique_ptr<Model> model;
  if (!config.random_weights_config.empty()) {
    lo.random_weights = true;
    model = random_model(config.random_weights_config, *backend, lo);
  } else {
    model = load_model(config.model_dir, *backend, lo);
  }

  std::unique_ptr<Tokenizer> tokenizer;
  std::string tok_dir = !config.tokenizer_dir.empty() ? config.tokenizer_dir : config.model_dir;
  if (!tok_dir.empty() && std::filesystem::exists(std::filesystem::path(tok_dir) / "tokenizer.json"))
    tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_dir(tok_dir));
  else
    DI_CHECK(config.tokenizer_dir.empty(), "EngineConfig.tokenizer_dir: no tokenizer.json in ",
             config.tokenizer_dir);

  impl_ = std::make_unique<Impl>(config, std::move(backend), std::move(model), std::move(tokenizer));
}

}  // namespace deepinfer
