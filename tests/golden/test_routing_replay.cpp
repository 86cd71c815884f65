// RoutingReplayBackend on the CPU: the near-tie margin of a different expert choice, and a
// recorded forward replayed into a second model (no flips, same logits; a corrupted record
// is rejected).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

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

// Record on one CPU model, replay into another: the same logits, no flips; a record whose
// choice is far from the replaying backend's is an error.
TEST(RoutingReplay, ReplayOnCpu) {
  const std::string dir = std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/v3_tiny";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " is missing";
  auto cpu = make_cpu_backend();
  RoutingLog log;
  RoutingReplayBackend rec(*cpu, log, RoutingReplayBackend::Mode::Record);
  RoutingReplayBackend rep(*cpu, log, RoutingReplayBackend::Mode::Replay);
  auto a = load_model(dir, rec);
  auto b = load_model(dir, rep);
  PagedDriver da(*a, rec), db(*b, rep);
  const std::vector<int32_t> prompt = {5, 17, 300, 42, 7, 99, 256};
  const int sa = da.add_sequence(), sb = db.add_sequence();
  auto la = da.step({{sa, prompt, true}});
  ASSERT_EQ(log.calls.size(), 2u);  // two MoE layers
  auto lb = db.step({{sb, prompt, true}});
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
  PagedDriver dc(*b, rep);
  const int sc = dc.add_sequence();
  EXPECT_THROW(dc.step({{sc, prompt, true}}), Error);
}

}  // namespace
}  // namespace deepinfer::test
