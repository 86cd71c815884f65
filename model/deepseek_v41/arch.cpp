#include "model/deepseek_v41/arch.h"

#include "core/error.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/info.h"
#include "model/deepseek_v41/kv_layout.h"
#include "model/deepseek_v41/model.h"
#include "model/deepseek_v41/truncation.h"
#include "model/deepseek_v41/weights.h"

namespace deepinfer {

namespace {

std::unique_ptr<Model> load(ModelConfig config, const std::string& dir, Backend& backend,
                            const LoadOptions& options) {
  DeepseekV41Config v41 = load_deepseek_v41_config(config.source);
  const V41PrefillTruncation trunc =
      v41_prefill_truncation(v41, options.prefill_truncation_mode, options.prefill_keep_tokens);
  if (trunc.active() && trunc.keep < trunc.exact_keep)
    log_warn(config.source, ": prefill truncation keeps the last ", trunc.keep,
             " rows of a prompt for layers ", trunc.first_layer, "-", trunc.num_layers - 1,
             ": longer prompts give outputs that differ from full prefill's (equal from "
             "DEEPINFER_YOCO_PREFILL_KEEP_TOKENS >= ",
             trunc.exact_keep, " = ", trunc.num_layers - trunc.first_layer,
             " truncated layers x (sliding_window - 1) + 1)");
  if (options.random_weights) {
    // V4.1-Flash's formats with F8_E4M3: FP8 dense with 32x32 E8M0 blocks (the config's), FP4
    // routed experts (random_fp4_experts); made on a device backend's device.
    const bool fp4 = options.random_weight_dtype == DType::F8_E4M3 && options.random_fp4_experts;
    V41Weights w = random_v41_weights(v41, options.seed, options.random_weight_dtype, fp4, &backend);
    return std::make_unique<DeepseekV41Model>(std::move(v41), std::move(w), backend, trunc);
  }
  auto reader = std::make_shared<const CheckpointReader>(CheckpointReader::open(dir));
  // FP4 experts stay packed on CUDA (mixq's tensor-core expert GEMM from 2 tokens, moe_fp4.cu's
  // kernel for one), a quarter of their BF16 size; the CPU reference reads them dequantized.
  V41Weights w = load_v41_weights(v41, reader, backend.device() == Device::CUDA);
  return std::make_unique<DeepseekV41Model>(std::move(v41), std::move(w), backend, trunc);
}

std::vector<KvGroupSpec> kv_groups(const ModelConfig& config) {
  return v41_kv_layout(load_deepseek_v41_config(config.source)).groups;
}

}  // namespace

Architecture deepseek_v41_architecture() {
  Architecture a;
  a.model_type = "deepseek_v41";
  a.description =
      "DeepSeek-V4.1-Flash (shared compressed KV, reused indexer, single-pass hyper-connections)";
  a.parse_config = parse_deepseek_v41_model_config;
  a.load = load;
  a.describe = describe_deepseek_v41;
  a.kv_groups = kv_groups;
  return a;
}

Architecture deepseek_v41_text_architecture() {
  Architecture a = deepseek_v41_architecture();
  a.model_type = "deepseek_v41_text";
  a.description = "DeepSeek-V4.1 text model as the transformers PR saves it (flat config)";
  return a;
}

}  // namespace deepinfer
