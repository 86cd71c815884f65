#include "model/deepseek_v4/arch.h"

#include "core/error.h"
#include "core/settings.h"
#include "io/safetensors.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/info.h"
#include "model/deepseek_v4/model.h"
#include "model/deepseek_v4/weights.h"

namespace deepinfer {

namespace {

std::unique_ptr<Model> load(ModelConfig config, const std::string& dir, Backend& backend, const LoadOptions& options) {
  DeepseekV4Config v4 = load_deepseek_v4_config(config.source);
  if (options.random_weights) {
    // V4-Flash's formats with F8_E4M3: FP8 dense, FP4 routed experts (random_fp4_experts).
    const bool fp4 = options.random_weight_dtype == DType::F8_E4M3 && options.random_fp4_experts;
    const DType dense = backend.device() == Device::CPU && options.random_weight_dtype == DType::BF16
                            ? DType::F32  // the CPU reference computes in F32
                            : options.random_weight_dtype;
    V4Weights w = make_random_v4_weights(v4, options.seed, dense, fp4, backend);
    return std::make_unique<DeepseekV4Model>(std::move(v4), std::move(w), backend);
  }
  auto reader = std::make_shared<const CheckpointReader>(CheckpointReader::open(dir));
  // Packed FP4 experts only where a backend reads them (CUDA) and only when asked
  // (DEEPINFER_V4_FP4_PACKED): their golden test passes on the H200 (2026-12-02), but the kernel
  // (moe_fp4.cu) reads each pair's expert on CUDA cores, fit for decode, not for long prefills.
  const bool packed = backend.device() == Device::CUDA && env_settings().get_bool("DEEPINFER_V4_FP4_PACKED");
  V4Weights w = load_v4_weights(v4, reader, options.load_mtp, packed, options.mtp_optional);
  return std::make_unique<DeepseekV4Model>(std::move(v4), std::move(w), backend);
}

}  // namespace

Architecture deepseek_v4_architecture() {
  Architecture a;
  a.model_type = "deepseek_v4";
  a.description = "DeepSeek-V4-Flash (hyper-connections, window + compressed attention, sinks, FP4 experts)";
  a.parse_config = parse_deepseek_v4_model_config;
  a.load = load;
  a.describe = describe_deepseek_v4;
  return a;
}

}  // namespace deepinfer
