#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "core/error.h"
#include "sample/sampler.h"

namespace deepinfer {
namespace {

SampleRow row_for(const SamplingParams& p, int64_t position, uint64_t seed = 1) {
  SampleRow r;
  r.params = &p;
  r.seed = seed;
  r.position = position;
  return r;
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  std::vector<double> p(logits.size());
  double m = *std::max_element(logits.begin(), logits.end()), s = 0;
  for (size_t i = 0; i < p.size(); ++i) s += p[i] = std::exp((logits[i] - m) / temperature);
  for (auto& x : p) x /= s;
  return p;
}

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  Sampler s(5);
  SamplingParams p;
  p.temperature = 0;
  std::vector<float> logits = {0.1f, 3.0f, -1.0f, 3.0f, 2.0f};
  EXPECT_EQ(s.sample(logits.data(), row_for(p, 0)).token_id, 1);
}

TEST(Sampler, FrequenciesFollowSoftmaxWithTemperature) {
  const int vocab = 6, n = 60000;
  Sampler s(vocab);
  SamplingParams p;
  p.temperature = 0.7f;
  std::vector<float> logits = {1.0f, 0.5f, -0.3f, 2.0f, 0.0f, 1.5f};
  auto expected = softmax(logits, 0.7);
  std::vector<int> counts(vocab);
  for (int i = 0; i < n; ++i) counts[s.sample(logits.data(), row_for(p, i)).token_id]++;
  for (int v = 0; v < vocab; ++v) {
    double sigma = std::sqrt(n * expected[v] * (1 - expected[v]));
    EXPECT_NEAR(counts[v], n * expected[v], 5 * sigma + 1) << "token " << v;
  }
}

TEST(Sampler, TopKTopPMinPRestrictTheSupport) {
  const int vocab = 8;
  Sampler s(vocab);
  std::vector<float> logits = {0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f};
  auto probs = softmax(logits, 1.0);
  SamplingParams k;
  k.top_k = 3;
  SamplingParams tp;
  tp.top_p = 0.8f;  // mass of {7}: .63, {7,6}: .86 -> support {7, 6}
  SamplingParams mp;
  mp.min_p = 0.3f;  // p6/p7 = e^-1 = .37 kept, p5/p7 = .135 dropped
  std::set<int> seen_k, seen_p, seen_m;
  for (int i = 0; i < 3000; ++i) {
    seen_k.insert(s.sample(logits.data(), row_for(k, i)).token_id);
    seen_p.insert(s.sample(logits.data(), row_for(tp, i)).token_id);
    seen_m.insert(s.sample(logits.data(), row_for(mp, i)).token_id);
  }
  EXPECT_EQ(seen_k, (std::set<int>{5, 6, 7}));
  EXPECT_EQ(seen_p, (std::set<int>{6, 7}));
  EXPECT_EQ(seen_m, (std::set<int>{6, 7}));
  ASSERT_NEAR(probs[7], 0.632, 0.01);
}

TEST(Sampler, SameSeedAndPositionGiveTheSameTokenWhateverElseIsSampled) {
  const int vocab = 50;
  std::mt19937 rng(3);
  std::vector<std::vector<float>> rows(20, std::vector<float>(vocab));
  for (auto& r : rows)
    for (auto& x : r) x = std::uniform_real_distribution<float>(-3, 3)(rng);
  SamplingParams p;
  p.temperature = 1.3f;
  p.top_p = 0.9f;
  // Alone, one sampler per row.
  std::vector<int> alone;
  for (size_t i = 0; i < rows.size(); ++i) {
    Sampler s(vocab);
    alone.push_back(s.sample(rows[i].data(), row_for(p, 100 + i, 7 + i)).token_id);
  }
  // Batched in reverse order through one sampler (shared scratch), with other draws between.
  Sampler s(vocab);
  for (size_t j = rows.size(); j-- > 0;) {
    s.sample(rows[(j + 1) % rows.size()].data(), row_for(p, 5, 99));
    EXPECT_EQ(s.sample(rows[j].data(), row_for(p, 100 + j, 7 + j)).token_id, alone[j]);
  }
  // Another seed changes at least one of them.
  int diff = 0;
  for (size_t i = 0; i < rows.size(); ++i)
    diff += s.sample(rows[i].data(), row_for(p, 100 + i, 1000 + i)).token_id != alone[i];
  EXPECT_GT(diff, 0);
}

TEST(Sampler, PenaltiesFollowTheirDefinitions) {
  Sampler s(4);
  SamplingParams p;
  p.temperature = 0;
  std::vector<float> logits = {2.0f, 1.9f, -1.0f, -1.05f};
  std::vector<int32_t> prompt = {0};
  std::vector<int32_t> output = {};
  SampleRow r = row_for(p, 0);
  r.prompt_tokens = prompt;
  r.output_tokens = output;
  EXPECT_EQ(s.sample(logits.data(), r).token_id, 0);
  p.repetition_penalty = 1.1f;  // 2.0 / 1.1 = 1.82 < 1.9
  EXPECT_EQ(s.sample(logits.data(), r).token_id, 1);
  p.repetition_penalty = 1.0f;
  std::vector<int32_t> out2 = {0, 0};
  r.output_tokens = out2;
  p.frequency_penalty = 0.04f;  // 2.0 - 0.08 = 1.92 > 1.9
  EXPECT_EQ(s.sample(logits.data(), r).token_id, 0);
  p.frequency_penalty = 0.06f;  // 1.88 < 1.9
  EXPECT_EQ(s.sample(logits.data(), r).token_id, 1);
  p.frequency_penalty = 0.0f;
  p.presence_penalty = 0.11f;  // once, whatever the count
  EXPECT_EQ(s.sample(logits.data(), r).token_id, 1);
  // Repetition penalty multiplies negative logits: -1.0 * 1.1 = -1.1 < -1.05.
  std::vector<float> neg = {-1.0f, -1.05f, -5.0f, -5.0f};
  std::vector<int32_t> none;
  r.output_tokens = none;
  p.presence_penalty = 0;
  p.repetition_penalty = 1.1f;
  EXPECT_EQ(s.sample(neg.data(), r).token_id, 1);
}

TEST(Sampler, BitmaskAndBannedTokensAreNeverSampled) {
  const int vocab = 70;
  Sampler s(vocab);
  std::vector<float> logits(vocab, 0.0f);
  logits[3] = 10.0f;
  std::vector<uint32_t> mask(3, 0);
  for (int v : {3, 33, 65}) mask[v >> 5] |= 1u << (v & 31);
  std::vector<int32_t> banned = {3};
  SamplingParams p;
  for (int i = 0; i < 500; ++i) {
    SampleRow r = row_for(p, i);
    r.allowed_bitmask = mask.data();
    r.banned_tokens = banned;
    int t = s.sample(logits.data(), r).token_id;
    EXPECT_TRUE(t == 33 || t == 65) << t;
  }
  SamplingParams g;
  g.temperature = 0;
  SampleRow r = row_for(g, 0);
  r.allowed_bitmask = mask.data();
  EXPECT_EQ(s.sample(logits.data(), r).token_id, 3);
  std::vector<uint32_t> none(3, 0);
  r = row_for(p, 0);
  r.allowed_bitmask = none.data();
  // Nothing allowed: no token, and the row's error says so (the engine ends that request).
  const SampleResult nothing = s.sample(logits.data(), r);
  EXPECT_EQ(nothing.token_id, -1);
  EXPECT_NE(nothing.error.find("masked"), std::string::npos) << nothing.error;
}

TEST(Sampler, LogprobsComeFromRawLogits) {
  Sampler s(4);
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 2;
  p.repetition_penalty = 2.0f;  // does not change the reported logprobs
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.0f};
  auto probs = softmax(logits, 1.0);
  SampleResult r = s.sample(logits.data(), row_for(p, 0));
  EXPECT_EQ(r.token_id, 1);
  EXPECT_NEAR(r.logprob, std::log(probs[1]), 1e-5);
  ASSERT_EQ(r.top_logprobs.size(), 2u);
  EXPECT_EQ(r.top_logprobs[0].first, 1);
  EXPECT_EQ(r.top_logprobs[1].first, 2);
  EXPECT_NEAR(r.top_logprobs[1].second, std::log(probs[2]), 1e-5);
}

TEST(SamplingParams, ValidateNamesTheField) {
  auto message = [](auto mutate) {
    SamplingParams p;
    mutate(p);
    try {
      p.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("ok");
  };
  EXPECT_EQ(message([](SamplingParams&) {}), "ok");
  EXPECT_EQ(message([](SamplingParams& p) { p.max_tokens = 0; }).rfind("max_tokens", 0), 0u);
  EXPECT_EQ(message([](SamplingParams& p) { p.temperature = -0.1f; }).rfind("temperature", 0), 0u);
  EXPECT_EQ(message([](SamplingParams& p) { p.top_p = 0.0f; }).rfind("top_p", 0), 0u);
  EXPECT_EQ(message([](SamplingParams& p) { p.top_p = 1.5f; }).rfind("top_p", 0), 0u);
  EXPECT_EQ(message([](SamplingParams& p) { p.n = 0; }).rfind("n:", 0), 0u);
  EXPECT_EQ(message([](SamplingParams& p) { p.min_p = 2; }).rfind("min_p", 0), 0u);
  EXPECT_EQ(message([](SamplingParams& p) { p.so_args.kind = "xml"; }).rfind("so_args", 0), 0u);
  // The documented upper bounds (one request cannot exhaust memory).
  using SP = SamplingParams;
  EXPECT_EQ(message([](SamplingParams& p) { p.n = SP::kMaxN; }), "ok");
  EXPECT_EQ(message([](SamplingParams& p) { p.n = SP::kMaxN + 1; }).rfind("n:", 0), 0u);
  EXPECT_EQ(message([](SamplingParams& p) { p.max_tokens = SP::kMaxTokens + 1; }).rfind("max_tokens", 0), 0u);
  EXPECT_EQ(message([](SamplingParams& p) { p.top_k = SP::kMaxTopK + 1; }).rfind("top_k", 0), 0u);
  EXPECT_EQ(message([](SamplingParams& p) { p.logprobs = SP::kMaxLogprobs + 1; }).rfind("logprobs", 0), 0u);
  EXPECT_EQ(message([](SamplingParams& p) { p.stop.assign(SP::kMaxStops + 1, "x"); }).rfind("stop:", 0), 0u);
  EXPECT_EQ(message([](SamplingParams& p) { p.stop = {std::string(SP::kMaxStopBytes + 1, 'x')}; }).rfind("stop:", 0),
            0u);
  EXPECT_EQ(message([](SamplingParams& p) { p.stop_token_ids.assign(SP::kMaxStopTokenIds + 1, 1); })
                .rfind("stop_token_ids", 0),
            0u);
}

}  // namespace
}  // namespace deepinfer
