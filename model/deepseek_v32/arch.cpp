#include "model/deepseek_v32/arch.h"

#include "core/error.h"
#include "io/safetensors.h"
#include "model/deepseek_v32/config.h"
#include "model/deepseek_v32/weights.h"

namespace deepinfer {

namespace {

// Checks the checkpoint (V3's tensors and the indexer's), then refuses: running V3's
// dense forward would be wrong as soon as a context exceeds index_topk.
std::unique_ptr<Model> load(ModelConfig config, const std::string& dir, Backend&,
                            const LoadOptions& options) {
  if (!options.random_weights) {
    auto reader = std::make_shared<const CheckpointReader>(CheckpointReader::open(dir));
    load_weights(reader, config, options);
    load_indexer_weights(config, *reader);
  }
  fail(config.source, ": model_type 'deepseek_v32' (DeepSeek-V3.2): the config and weights read, "
       "but this build has no sparse-attention forward for it yet");
}

}  // namespace

Architecture deepseek_v32_architecture() {
  Architecture a;
  a.model_type = "deepseek_v32";
  a.description = "DeepSeek-V3.2 (V3 + lightning-indexer sparse attention)";
  a.parse_config = parse_deepseek_v32_config;
  a.load = load;
  a.check_extra_weights = [](const ModelConfig& config, const CheckpointReader& reader) {
    load_indexer_weights(config, reader);
  };
  return a;
}

}  // namespace deepinfer
