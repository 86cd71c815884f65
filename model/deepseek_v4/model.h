// DeepSeek-V4 forward on the CPU reference backend (prefill of one whole sequence: every
// prompt position's logits; decode by re-running prefill). The paged KV state (window
// rings, compressed rows, partial-group buffers) is later work: forward() refuses steps
// with cached context.
#pragma once
#include <memory>
#include <vector>

#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/weights.h"
#include "model/model.h"

namespace deepinfer {

class DeepseekV4Model : public Model {
 public:
  DeepseekV4Model(DeepseekV4Config config, V4Weights weights, Backend& backend);
  const ModelConfig& config() const override { return config_.base; }
  const DeepseekV4Config& v4_config() const { return config_; }
  int num_kv_layers() const override { return config_.num_layers(); }
  int kv_row_dim() const override { return static_cast<int>(config_.head_dim); }
  int vocab_size() const override { return static_cast<int>(config_.base.vocab_size); }
  // Single sequence, no cached context (positions 0..T-1 in one step).
  void forward(const StepBatch& batch, std::vector<Tensor>& kv_cache, Tensor& logits,
               Tensor* hidden_out = nullptr) override;
  // logits F32 [T, vocab] at every position of `ids` (positions 0..T-1).
  void prefill(const std::vector<int32_t>& ids, Tensor& logits);

 private:
  DeepseekV4Config config_;
  V4Weights w_;
  Backend& be_;
};

}  // namespace deepinfer
