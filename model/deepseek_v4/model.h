// DeepSeek-V4 forward on the CPU reference backend, one sequence at a time, with its state
// in host memory (V4SequenceState): per layer the last sliding_window - 1 K=V rows, the
// compressed entries so far (CSA / HCA, and the indexer's keys on CSA layers), the rows
// waiting for their compression group to fill, and (CSA) the previous window's first halves
// for the overlap. step() appends any number of tokens, so one-shot prefill, chunked
// prefill and decode are the same code. The paged KV layer groups (kv/) are later work:
// forward() (the Model interface) runs whole sequences without cached context only.
#pragma once
#include <memory>
#include <vector>

#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/weights.h"
#include "model/model.h"

namespace deepinfer {

// The rows one compressor has emitted and the rows still waiting for their group.
struct V4CompressorState {
  std::vector<float> entries;  // [n_entries, d] after norm and RoPE
  int64_t n_entries = 0;
  std::vector<float> pending_kv, pending_gate;  // [n_pending, width] projections not yet pooled
  int64_t n_pending = 0;
  std::vector<float> prior_kv, prior_gate;      // overlap: [ratio, d] (gate + ape); empty before
};

struct V4LayerState {
  std::vector<float> window;  // [n_window, head_dim] the last <= sliding_window - 1 K=V rows
  int64_t n_window = 0;
  V4CompressorState compressor, indexer;
};

struct V4SequenceState {
  int64_t length = 0;  // tokens processed
  std::vector<V4LayerState> layers;
};

class DeepseekV4Model : public Model {
 public:
  DeepseekV4Model(DeepseekV4Config config, V4Weights weights, Backend& backend);
  const ModelConfig& config() const override { return config_.base; }
  const DeepseekV4Config& v4_config() const { return config_; }
  // The paged cache is not used yet (the state is V4SequenceState): one window group with
  // the K=V row width stands for it until the window / compressed groups are wired in.
  std::vector<KvGroupSpec> kv_groups() const override;
  int vocab_size() const override { return static_cast<int>(config_.base.vocab_size); }
  // Single sequence, no cached context (positions 0..T-1 in one step).
  void forward(const StepBatch& batch, KvCaches& kv, Tensor& logits, Tensor* hidden_out = nullptr) override;
  // logits F32 [T, vocab] at every position of `ids` (positions 0..T-1).
  void prefill(const std::vector<int32_t>& ids, Tensor& logits);
  // Appends `ids` at positions state.length ... to the sequence; logits F32 [ids.size(), vocab].
  void step(V4SequenceState& state, const std::vector<int32_t>& ids, Tensor& logits);

 private:
  DeepseekV4Config config_;
  V4Weights w_;
  Backend& be_;
};

}  // namespace deepinfer
