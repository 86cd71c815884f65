// RoutingReplayBackend on the CPU: the near-tie margin of a different expert choice (and of a
// different V3.2 indexer top-k), and a recorded forward replayed into a second model (no flips,
// same logits; a corrupted record is rejected).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "model/model.h"
#include "paged_driver.h"
#include "routing_replay.h"

namespace deepinfer::test {
namespace {

// logit of sigmoid score s
float logit(double s) { return static_cast<float>(std::log(s / (1 - s))); }

TEST(RoutingReplay, FlipMarginSigmoidWithGroups) {
  RoutingLog::Call call;
  call.routing.scoring = MoeRouting::Scoring::Sigmoid;
  call.routing.num_experts = 4;
  call.routing.top_k = 1;
  call.routing.num_groups = 2;
  call.routing.top_k_groups = 1;
  call.routing.group_limited = true;
  call.routing.use_bias = false;
  call.num_tokens = 1;
  // scores 0.60 0.10 | 0.59 0.30: group max 0.60 vs 0.59; expert 0 chosen.
  call.logits = {logit(0.60), logit(0.10), logit(0.59), logit(0.30)};
  call.ids = {0};
  call.weights = {1.0f};
  const int32_t same[] = {0}, near[] = {2}, far[] = {3}, low[] = {1};
  EXPECT_EQ(routing_flip_margin(call, 0, same), 0.0);
  EXPECT_NEAR(routing_flip_margin(call, 0, near), 0.01, 1e-6);  // expert and group gap 0.01
  EXPECT_NEAR(routing_flip_margin(call, 0, far), 0.30, 1e-6);   // expert gap 0.30
  EXPECT_NEAR(routing_flip_margin(call, 0, low), 0.50, 1e-6);   // expert gap 0.50, same group
}

TEST(RoutingReplay, FlipMarginSoftmax) {
  RoutingLog::Call call;
  call.routing.scoring = MoeRouting::Scoring::Softmax;
  call.routing.num_experts = 3;
  call.routing.top_k = 2;
  call.num_tokens = 1;
  call.logits = {0.0f, std::log(2.0f), std::log(1.9f)};  // probs 1/4.9, 2/4.9, 1.9/4.9
  call.ids = {1, 2};
  call.weights = {0.4f, 0.39f};
  const int32_t swapped[] = {2, 1}, flip[] = {1, 0};
  EXPECT_EQ(routing_flip_margin(call, 0, swapped), 0.0);
  EXPECT_NEAR(routing_flip_margin(call, 0, flip), 0.9 / 4.9, 1e-6);
}

// One fixture loaded twice on the CPU: the first model's backend records, the second's replays.
struct CpuReplay {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  RoutingLog log;
  RoutingReplayBackend rec{*cpu, log, RoutingReplayBackend::Mode::Record};
  RoutingReplayBackend rep{*cpu, log, RoutingReplayBackend::Mode::Replay};
  std::unique_ptr<Model> a, b;
  explicit CpuReplay(const std::string& dir) : a(load_model(dir, rec)), b(load_model(dir, rep)) {}
  // The prompt's prefill recorded on a then replayed on b: both logits.
  std::pair<std::vector<std::vector<float>>, std::vector<std::vector<float>>> prefill(
      const std::vector<int32_t>& prompt) {
    PagedDriver da(*a, rec), db(*b, rep);
    const int sa = da.add_sequence(), sb = db.add_sequence();
    auto la = da.step({{sa, prompt, true}});
    auto lb = db.step({{sb, prompt, true}});
    return {la, lb};
  }
};

// Record on one CPU model, replay into another: the same logits, no flips; a record whose
// choice is far from the replaying backend's is an error.
TEST(RoutingReplay, ReplayOnCpu) {
  const std::string dir = std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/v3_tiny";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " is missing";
  CpuReplay r(dir);
  RoutingLog& log = r.log;
  const std::vector<int32_t> prompt = {5, 17, 300, 42, 7, 99, 256};
  const auto [la, lb] = r.prefill(prompt);
  ASSERT_EQ(log.calls.size(), 2u);  // two MoE layers
  EXPECT_EQ(la, lb);
  EXPECT_EQ(log.next, log.calls.size());
  EXPECT_EQ(log.compared_tokens, 2 * static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(log.flipped_tokens, 0);

  // Rewrite the record of token 3 in the first MoE layer: other experts, now the clear best
  // (logit 8 vs -8), so the replaying backend's own choice falls ~1 below it: a routing bug.
  log.next = 0;
  log.compared_tokens = 0;
  RoutingLog::Call& call = log.calls[0];
  const int E = call.routing.num_experts, K = call.routing.top_k;
  for (int e = 0; e < E; ++e) call.logits[3 * E + e] = -8.0f;
  for (int j = 0; j < K; ++j) {
    call.ids[3 * K + j] = (call.ids[3 * K + j] + 1) % E;
    call.logits[3 * E + call.ids[3 * K + j]] = 8.0f;
  }
  PagedDriver dc(*r.b, r.rep);
  const int sc = dc.add_sequence();
  EXPECT_THROW(dc.step({{sc, prompt, true}}), Error);
}

// Top-k margins relative to the row's largest |score|: the reference kept positions 0 and 2
// (scores 1.0, 0.5); keeping 3 (0.49) instead is a near-tie, 1 (-1.0) is not; padding must
// agree.
TEST(RoutingReplay, TopkFlipMargin) {
  RoutingLog::TopkCall call;
  call.num_tokens = 1;
  call.num_cols = 5;
  call.k = 3;
  call.scores = {1.0f, -1.0f, 0.5f, 0.49f, -INFINITY};
  call.indices = {0, 2, -1};  // as if the context were 3 wide at k 3: padded
  const int32_t same[] = {0, 2, -1}, near[] = {0, 3, -1}, far[] = {0, 1, -1}, unpadded[] = {0, 2, 4};
  EXPECT_EQ(topk_flip_margin(call, 0, same), 0.0);
  EXPECT_NEAR(topk_flip_margin(call, 0, near), 0.01, 1e-6);
  EXPECT_NEAR(topk_flip_margin(call, 0, far), 1.5, 1e-6);
  EXPECT_THROW(topk_flip_margin(call, 0, unpadded), Error);
}

// V3.2: the indexer top-k is recorded and replayed too (two MoE layers, three indexer layers
// of v32_tiny); a record that keeps other positions than the replaying backend's by a wide
// margin is an error.
TEST(RoutingReplay, IndexerReplayOnCpu) {
  const std::string dir = std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/v32_tiny";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " is missing";
  CpuReplay r(dir);
  RoutingLog& log = r.log;
  std::vector<int32_t> prompt(20);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(7 + 23 * i);
  const auto [la, lb] = r.prefill(prompt);
  ASSERT_EQ(log.topk_calls.size(), 3u);  // one per layer
  EXPECT_EQ(la, lb);
  EXPECT_EQ(log.next_topk, log.topk_calls.size());
  EXPECT_EQ(log.compared_rows, 3 * static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(log.flipped_rows, 0);
  // Row 19 of layer 0 (context 20 > k 8): make the reference's worst kept position the clear
  // best of the row and everything it did not keep much worse: the replaying backend's own
  // choice now falls far below the record's k-th.
  log.next = 0;
  log.next_topk = 0;
  RoutingLog::TopkCall& call = log.topk_calls[0];
  const int64_t t = 19, K = call.k, N = call.num_cols;
  std::vector<bool> kept(static_cast<size_t>(N), false);
  for (int64_t j = 0; j < K; ++j) kept[call.indices[t * K + j]] = true;
  int32_t outside = -1;
  for (int64_t j = 0; j < 20; ++j) {
    if (!kept[j]) {
      outside = static_cast<int32_t>(j);
      call.scores[t * N + j] = -100.0f;
    } else {
      call.scores[t * N + j] = 100.0f;
    }
  }
  ASSERT_GE(outside, 0);
  const int32_t dropped = call.indices[t * K + 0];
  call.indices[t * K + 0] = outside;  // the record keeps `outside` instead of `dropped`
  call.scores[t * N + outside] = 100.0f;
  call.scores[t * N + dropped] = -100.0f;
  PagedDriver dc(*r.b, r.rep);
  const int sc = dc.add_sequence();
  EXPECT_THROW(dc.step({{sc, prompt, true}}), Error);
}

}  // namespace
}  // namespace deepinfer::test
