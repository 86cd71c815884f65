// RoutingReplayBackend: a Backend that runs every op on an inner backend, and either records
// the MoE routing decisions (the fp32 CPU reference) or replays them into another backend's
// forward (CUDA), so a bf16 golden run is checked op for op without expert flips at near-ties.
//
// Why: with BF16 activations a token whose fp32 routing is a near-tie (choice-score gap ~1e-3
// between the k-th and the next expert) can pick the other expert; that moves its logits by
// 2-4 (v3_tiny token 5 layer 2: gap 0.0023, flipping it in the fp32 oracle changes position 5
// by 3.33; v2_lite token 11 layer 1: softmax gap 1e-4, HF's own bf16 run is off by 0.40 there).
// Such a flip is not an error of the backend, but a logit tolerance cannot tell it from one.
// In replay mode each routing call still runs on the inner backend; its choice is compared
// with the recorded one token by token: a token may differ only when the recorded (fp32) scores
// make the difference a near-tie (every expert it chose instead scores within max_margin of the
// recorded k-th choice, and its group within max_margin of the kept groups'); such tokens then
// take the recorded ids and weights so the rest of the forward is comparable. A larger
// difference throws (a routing bug). The V3.2 indexer's top-k is replayed likewise: a row may
// keep other positions than the fp32 reference only where each one it kept instead scores
// (in the recorded fp32 scores) within max_topk_margin of the reference's k-th, relative to
// the row's largest |score| (the fixtures' cut margins go down to 1.5e-4; BF16 scores carry
// ~1e-2), and then takes the recorded positions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "forwarding_backend.h"

namespace deepinfer::test {

// The routing calls of one or more forward steps, in call order (layer by layer).
struct RoutingLog {
  struct Call {
    MoeRouting routing;
    bool sqrt_softplus = false;  // V4's moe_routing_sqrt_softplus (choice = sqrt(softplus(l)) + bias)
    int64_t num_tokens = 0;
    std::vector<float> logits;   // [T, E] router logits of the recording backend
    std::vector<float> bias;     // [E] when routing.use_bias
    std::vector<int32_t> ids;    // [T, k]
    std::vector<float> weights;  // [T, k]
  };
  std::vector<Call> calls;
  size_t next = 0;  // next call to replay
  // Replay statistics.
  int64_t compared_tokens = 0;
  int64_t flipped_tokens = 0;
  double max_flip_margin = 0;  // largest accepted near-tie gap (choice-score units)

  // DeepSeek-V3.2's indexer top-k (Backend::indexer_topk over the paged keys), the same way:
  // the recording backend's scores and chosen positions per call.
  struct TopkCall {
    int64_t num_tokens = 0, num_cols = 0, k = 0;
    std::vector<float> scores;    // [T, num_cols]
    std::vector<int32_t> indices;  // [T, k]
  };
  std::vector<TopkCall> topk_calls;
  size_t next_topk = 0;
  // DeepSeek-V4.1's candidate source (Backend::candidate_blocks): the recording backend's scores
  // and 0 / -inf bias per call; a replayed row may keep other blocks only where each one it kept
  // instead has a block score (its max, in the recorded scores) within max_topk_margin of the
  // reference's k-th kept block, relative to the row's largest |finite block score|.
  struct BlockCall {
    int64_t num_tokens = 0, num_cols = 0, topk_blocks = 0, block_size = 0;
    int ratio = 1;
    std::vector<float> scores, bias;  // [T, num_cols]
    std::vector<int32_t> positions;   // [T]
  };
  std::vector<BlockCall> block_calls;
  size_t next_block = 0;
  int64_t compared_rows = 0;
  int64_t flipped_rows = 0;
  double max_topk_margin = 0;  // largest accepted gap, relative to the row's largest |score|

  void clear_calls() {
    calls.clear();
    next = 0;
    topk_calls.clear();
    next_topk = 0;
    block_calls.clear();
    next_block = 0;
  }
};

class RoutingReplayBackend final : public ForwardingBackend {
 public:
  enum class Mode { Record, Replay };
  // max_margin: the largest choice-score gap a replayed token may differ by.
  RoutingReplayBackend(Backend& inner, RoutingLog& log, Mode mode, double max_margin = 0.02,
                       double max_topk_margin = 0.05)
      : ForwardingBackend(inner), log_(log), mode_(mode), max_margin_(max_margin),
        max_topk_margin_(max_topk_margin) {}

  void moe_routing(const Tensor& logits, const Tensor& bias, const MoeRouting& routing,
                   Tensor& topk_ids, Tensor& topk_weights) override;
  void indexer_topk(const Tensor& scores, const PagedKV& kv, Tensor& indices) override;
  // DeepSeek-V4: routing and the CSA indexer's top-k recorded / replayed as above (the recorded
  // indexer scores are recomputed on the host from the recording backend's inputs); the
  // other V4 ops run on the inner backend.
  void moe_routing_sqrt_softplus(const Tensor& logits, const Tensor& bias, const Tensor& hash_ids, int top_k,
                                 float scaling, Tensor& topk_ids, Tensor& topk_weights) override;
  void indexer_topk(const Tensor& q, const Tensor& keys, const Tensor& weights, const Tensor& positions, int ratio,
                    float softmax_scale, float weights_scale, Tensor& out) override;
  // DeepSeek-V4.1: topk_finite (its indexer's top-k) recorded / replayed as the paged
  // indexer_topk (best first: ordered = false), candidate_blocks as BlockCall says; the other V4.1
  // ops run on the inner backend.
  void topk_finite(const Tensor& scores, Tensor& out) override;
  void candidate_blocks(const Tensor& scores, const Tensor& positions, int ratio, int64_t topk_blocks,
                        int64_t block_size, Tensor& bias) override;

 private:
  template <typename T>
  std::vector<T> download(const Tensor& t);
  template <typename T>
  void upload(const std::vector<T>& values, Tensor& t);
  // The paged indexer_topk and topk_finite (ordered: the kept positions ascending, else best
  // first): record the scores and indices, or replay them (op names the call in errors).
  void topk_of_scores(const Tensor& scores, Tensor& indices, bool ordered, const char* op);
  // Replay of one top-k call (both indexer forms): rows of `got` that differ from the recorded
  // ones by a near-tie take the recorded positions (uploaded into indices).
  void replay_topk(const RoutingLog::TopkCall& want, std::vector<int32_t>& got, Tensor& indices, bool ordered);
  // Replay of one routing call: likewise for experts (and their weights).
  void replay_routing(const RoutingLog::Call& want, int64_t T, int64_t K, Tensor& topk_ids, Tensor& topk_weights);

  RoutingLog& log_;
  Mode mode_;
  double max_margin_;
  double max_topk_margin_;
};

// Gap by which `chosen` (k positions of row t, -1 = none) falls short of the recorded top-k of
// `call`, relative to the row's largest |score| (0 when they are the same set). Exposed for tests.
double topk_flip_margin(const RoutingLog::TopkCall& call, int64_t t, const int32_t* chosen);

// Choice-score gap by which `chosen` (k experts of token t) falls short of the recorded choice
// of `call` (0 when they are the same set): max over experts chosen instead of the expert gap
// (recorded k-th choice score - its score) and, group-limited, the group gap. Exposed for tests.
double routing_flip_margin(const RoutingLog::Call& call, int64_t t, const int32_t* chosen);

}  // namespace deepinfer::test
