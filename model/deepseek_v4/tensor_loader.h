// Reading V4-family checkpoint tensors (V4 and V4.1, model/deepseek_v41/): each tensor under its
// DeepSeek name or the one alternate spelling a model maps it to, checked against the config,
// converted the way the CPU reference and the device upload read them:
//  - small tensors (norms, hc, sinks, bias): F32 copies (from F32 or BF16);
//  - linears [n, k]: F32/BF16 as they are; FP8 e4m3 with F32 block scales (E8M0 converted;
//    blocks quantization_config.weight_block_size, square); FP4 e2m1 (I8/U8 [n, k/2] with E8M0
//    or F32 scales [n, k/32]) dequantized to F32, or kept packed when asked.
// Errors name the tensor, the checkpoint and what the config expects.
#pragma once
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/weights.h"
#include "model/weights.h"

namespace deepinfer {

class CheckpointReader;

class V4TensorLoader {
 public:
  // alternate(official): the other spelling of a tensor (transformers'); owners keeps the
  // converted copies alive. The tensors come from a checkpoint or any named source (random
  // weights: model/weights.h's make_random_tensors), `origin` naming it in messages.
  V4TensorLoader(const V4FamilyConfig& c, std::shared_ptr<const CheckpointReader> r,
                 std::vector<std::shared_ptr<void>>& owners,
                 std::string (*alternate)(const std::string&));
  V4TensorLoader(const V4FamilyConfig& c, TensorSource source, std::string origin,
                 std::vector<std::shared_ptr<void>>& owners,
                 std::string (*alternate)(const std::string&));

  // The checkpoint's name for `official` (it, else its alternate); "" when absent.
  std::string resolve(const std::string& official) const;
  Tensor raw(const std::string& official, const char* what) const;
  void check_dims(const Tensor& t, const std::string& name, const std::vector<int64_t>& dims,
                  const char* what) const;
  Tensor f32(const std::string& official, const std::vector<int64_t>& dims, const char* what);
  Tensor scale_of(const std::string& prefix, const std::vector<int64_t>& dims,
                  const char* what) const;
  // dequantize: FP8 to F32 too; packed: FP4 with E8M0 scale bytes stays packed (block 1 x 32).
  Weight linear_from(const Tensor& t, const std::string& prefix, int64_t n, int64_t k,
                     const char* what, bool dequantize = false, bool packed = false);
  Weight linear(const std::string& prefix, int64_t n, int64_t k, const char* what,
                bool dequantize = false, bool packed = false);
  // Routed experts `<ffn>experts.E.w{1,3,2}` (gate, up, down), E < n_routed_experts.
  std::vector<ExpertWeights> expert_list(const std::string& ffn, bool packed);
  // `embed.weight` [V, H], F32 or BF16, as it is.
  Tensor embedding();
  // A block's hyper-connection site `<block>hc_<site>_{fn, base, scale}` (site "attn" or "ffn").
  V4HyperConnection hc_site(const std::string& block, const std::string& site);
  // Shared expert `<ffn>shared_experts.w{1,3,2}`.
  ExpertWeights shared_expert(const std::string& ffn);
  // `base` + the current block's note (set_note), kept alive for the messages built from it.
  const char* w(const char* base);
  void set_note(std::string note) { why_ = std::move(note); }

 private:
  bool has(const std::string& name) const { return source_.find(name).has_value(); }

  const V4FamilyConfig& c_;
  TensorSource source_;
  std::string origin_;
  std::vector<std::shared_ptr<void>>& owners_;
  std::string (*alternate_)(const std::string&);
  std::string why_;
  std::deque<std::string> notes_;
};

}  // namespace deepinfer
