// The architecture registry: model_type (config.json) -> how to read the config
// and build the forward. Each architecture lives in its folder (model/<arch>/)
// and adds one line to registry.cpp; nothing else names architectures.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/model.h"

namespace deepinfer {

class CheckpointReader;  // io/safetensors.h

struct Architecture {
  std::string model_type;   // config.json "model_type"
  std::string description;  // e.g. "DeepSeek-V3, R1, V3.1"
  // Reads and validates the config.json object. Throws Error naming the field.
  ModelConfig (*parse_config)(const nlohmann::json& root, const std::string& source) = nullptr;
  // Builds the model from checkpoint `dir` (options.random_weights: from the seed
  // instead). nullptr: config reading only, no forward yet (load_model refuses).
  std::unique_ptr<Model> (*load)(ModelConfig config, const std::string& dir, Backend& backend,
                                 const LoadOptions& options) = nullptr;
  // Checks the checkpoint's tensors that ModelWeights (load_weights) does not hold, e.g.
  // V3.2's indexer; throws Error naming the tensor. nullptr: nothing beyond ModelWeights.
  void (*check_extra_weights)(const ModelConfig& config, const CheckpointReader& reader) = nullptr;
  // `deepinfer info` for an architecture whose facts the shared ModelConfig does not hold
  // (V4: layer kinds, windows, compressors, hyper-connections): loads every weight of `dir`
  // against its config (throws naming the tensor) and fills `out` with "summary" (text),
  // "parameters" {total, active_per_token, embedding, mtp_total, mtp_active_per_token} and
  // its own fields. nullptr: ModelConfig::summary / parameter_count and load_weights.
  void (*describe)(const std::string& dir, std::shared_ptr<const CheckpointReader> reader,
                   nlohmann::json& out) = nullptr;
  // The KV layer groups a model of `config` declares (what its Model::kv_groups returns),
  // without loading weights (deepinfer info). nullptr: only a loaded model says.
  std::vector<KvGroupSpec> (*kv_groups)(const ModelConfig& config) = nullptr;
};

// Every registered architecture, in registry order.
const std::vector<Architecture>& architectures();
// The entry for `model_type`; throws Error naming `source`, the model_type and
// the known ones when none is registered.
const Architecture& find_architecture(const std::string& model_type, const std::string& source);
// "'deepseek_v2', 'deepseek_v3', ..." (for messages).
std::string known_model_types();

}  // namespace deepinfer
