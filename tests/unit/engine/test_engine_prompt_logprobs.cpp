// SamplingParams::prompt_logprobs through the scheduler and runner: every value equals the
// log-softmax of the fake model's logits of that prefix, computed here prefix by prefix
// without the engine (an independent computation), with chunked prefill, batch mates, n > 1,
// a prefix-cache warm engine and preemption.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/error.h"
#include "engine_fixture.h"

namespace deepinfer::testing {
namespace {

// The prompt logprobs of `prompt`, one prefix at a time: entry p scores token p + 1.
std::vector<PromptLogprob> reference_prompt_logprobs(const std::vector<int32_t>& prompt, int k) {
  std::vector<PromptLogprob> out;
  std::vector<float> x(kVocab);
  for (size_t p = 0; p + 1 < prompt.size(); ++p) {
    FakeModel::context_logits(std::vector<int32_t>(prompt.begin(), prompt.begin() + static_cast<long>(p) + 1),
                              kVocab, x.data());
    double mx = -INFINITY, sum = 0.0;
    for (float v : x) mx = std::max(mx, static_cast<double>(v));
    for (float v : x) sum += std::exp(static_cast<double>(v) - mx);
    const double log_z = std::log(sum);
    PromptLogprob e;
    e.token_id = prompt[p + 1];
    e.logprob = static_cast<double>(x[static_cast<size_t>(e.token_id)]) - mx - log_z;
    std::vector<int32_t> ids(kVocab);
    for (int v = 0; v < kVocab; ++v) ids[static_cast<size_t>(v)] = v;
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
    for (int j = 0; j < k; ++j) e.top.emplace_back(ids[j], static_cast<double>(x[ids[j]]) - mx - log_z);
    out.push_back(std::move(e));
  }
  return out;
}

void expect_prompt_logprobs(const RequestOutput& out, const std::vector<int32_t>& prompt, int k,
                            const std::string& what) {
  const std::vector<PromptLogprob> want = reference_prompt_logprobs(prompt, k);
  ASSERT_EQ(out.prompt_logprobs.size(), want.size()) << what;
  for (size_t p = 0; p < want.size(); ++p) {
    const PromptLogprob& got = out.prompt_logprobs[p];
    ASSERT_EQ(got.token_id, want[p].token_id) << what << " position " << p;
    ASSERT_EQ(got.logprob, want[p].logprob) << what << " position " << p;  // same formula: same bits
    ASSERT_EQ(got.top, want[p].top) << what << " position " << p;
  }
}

SamplingParams with_prompt_logprobs(int max_tokens, int k) {
  SamplingParams p = greedy(max_tokens);
  p.prompt_logprobs = k;
  return p;
}

TEST(EnginePromptLogprobs, EqualPrefixByPrefixLogitsWithChunksAndBatchMates) {
  std::mt19937 rng(21);
  std::vector<Prompt> prompts;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 24; ++i) {
    prompts.push_back(Prompt::from_tokens(random_tokens(rng, 1 + static_cast<int>(rng() % 70))));
    SamplingParams p = i % 3 == 2 ? greedy(6) : with_prompt_logprobs(6, i % 4);  // mates without them
    if (i % 5 == 0) p.n = 2;
    params.push_back(p);
  }
  EngineConfig cfg;
  cfg.kv_block_size = 4;
  cfg.max_num_batched_tokens = 24;  // prompts of up to 70 tokens: chunks of every size beside decodes
  cfg.max_num_seqs = 8;
  auto engine = make_fake_engine(cfg);
  const std::vector<RequestOutput> outs = engine->generate(prompts, params);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string what = "request " + std::to_string(i);
    ASSERT_TRUE(outs[i].error.empty()) << what << ": " << outs[i].error;
    if (params[i].prompt_logprobs < 0) EXPECT_TRUE(outs[i].prompt_logprobs.empty()) << what;
    else expect_prompt_logprobs(outs[i], prompts[i].token_ids, params[i].prompt_logprobs, what);
    for (const CompletionOutput& c : outs[i].outputs)  // the extra logits rows change no token
      EXPECT_EQ(c.token_ids, reference_greedy(prompts[i].token_ids, 6, kVocab, kEos)) << what;
  }
}

TEST(EnginePromptLogprobs, APrefixCacheWarmEngineRecomputesTheCachedPositions) {
  std::mt19937 rng(22);
  const std::vector<int32_t> prompt = random_tokens(rng, 50);
  EngineConfig cfg;
  cfg.kv_block_size = 4;
  auto engine = make_fake_engine(cfg);
  const RequestOutput warm = engine->generate({Prompt::from_tokens(prompt)}, {greedy(4)})[0];
  EXPECT_EQ(warm.num_cached_tokens, 0);
  const RequestOutput cold = engine->generate({Prompt::from_tokens(prompt)}, {greedy(4)})[0];
  EXPECT_EQ(cold.num_cached_tokens, 48);  // the cache is warm
  const RequestOutput scored = engine->generate({Prompt::from_tokens(prompt)}, {with_prompt_logprobs(4, 2)})[0];
  EXPECT_EQ(scored.num_cached_tokens, 0);  // no cached block for a position that needs logits
  expect_prompt_logprobs(scored, prompt, 2, "warm engine");
  EXPECT_EQ(scored.outputs[0].token_ids, warm.outputs[0].token_ids);
  // Its samples 1.. fork its blocks as usual; and the cache still serves the next request.
  SamplingParams two = with_prompt_logprobs(4, 1);
  two.n = 3;
  const RequestOutput forked = engine->generate({Prompt::from_tokens(prompt)}, {two})[0];
  expect_prompt_logprobs(forked, prompt, 1, "n = 3");
  EXPECT_EQ(engine->generate({Prompt::from_tokens(prompt)}, {greedy(4)})[0].num_cached_tokens, 48);
}

TEST(EnginePromptLogprobs, PreemptedRequestsKeepEveryValue) {
  std::mt19937 rng(23);
  std::vector<Prompt> prompts;
  for (int i = 0; i < 16; ++i) prompts.push_back(Prompt::from_tokens(random_tokens(rng, 20 + static_cast<int>(rng() % 40))));
  EngineConfig cfg;
  cfg.kv_block_size = 4;
  cfg.num_kv_blocks = 48;  // far fewer than 16 sequences need: preemption and recompute
  cfg.max_num_batched_tokens = 32;
  SamplingParams p = with_prompt_logprobs(24, 1);
  p.ignore_eos = true;
  auto engine = make_fake_engine(cfg);
  const std::vector<RequestOutput> outs = engine->generate(prompts, {p});
  EXPECT_GT(engine->stats().num_preemptions, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(outs[i].error.empty()) << outs[i].error;
    expect_prompt_logprobs(outs[i], prompts[i].token_ids, 1, "request " + std::to_string(i));
    EXPECT_EQ(outs[i].outputs[0].token_ids, reference_greedy(prompts[i].token_ids, 24, kVocab, kEos, true));
  }
}

TEST(EnginePromptLogprobs, StreamedInTheFirstUpdateWithATokenAndInTheLast) {
  std::mt19937 rng(24);
  const std::vector<int32_t> prompt = random_tokens(rng, 30);
  EngineConfig cfg;
  cfg.kv_block_size = 4;
  cfg.max_num_batched_tokens = 8;  // four prefill steps before the first token
  auto engine = make_fake_engine(cfg);
  SamplingParams p = with_prompt_logprobs(5, 0);
  p.ignore_eos = true;
  const std::string id = engine->add_request(Prompt::from_tokens(prompt), p);
  std::vector<RequestOutput> updates;
  while (engine->has_unfinished())
    for (RequestOutput& o : engine->step()) updates.push_back(std::move(o));
  ASSERT_EQ(updates.size(), 5u);  // one per token
  for (size_t u = 0; u < updates.size(); ++u) {
    if (u == 0 || u + 1 == updates.size()) expect_prompt_logprobs(updates[u], prompt, 0, "update " + std::to_string(u));
    else EXPECT_TRUE(updates[u].prompt_logprobs.empty()) << "update " << u;
  }
  // A one-token prompt has no position to score; the field is bounded like logprobs.
  const RequestOutput one = engine->generate({Prompt::from_tokens({7})}, {p})[0];
  EXPECT_TRUE(one.error.empty()) << one.error;
  EXPECT_TRUE(one.prompt_logprobs.empty());
  p.prompt_logprobs = SamplingParams::kMaxLogprobs + 1;
  EXPECT_THROW(engine->add_request(Prompt::from_tokens(prompt), p), Error);
}

TEST(EnginePromptLogprobs, PromptLogprobsOfTheEngineApiEqualTheRequestField) {
  std::mt19937 rng(25);
  const std::vector<int32_t> prompt = random_tokens(rng, 40);
  EngineConfig cfg;
  cfg.kv_block_size = 4;
  auto engine = make_fake_engine(cfg);
  const std::vector<double> lp = engine->prompt_logprobs(Prompt::from_tokens(prompt));
  const std::vector<PromptLogprob> want = reference_prompt_logprobs(prompt, 0);
  ASSERT_EQ(lp.size(), want.size());
  for (size_t p = 0; p < lp.size(); ++p) EXPECT_EQ(lp[p], want[p].logprob) << "position " << p;
  EXPECT_FALSE(engine->has_unfinished());
}

}  // namespace
}  // namespace deepinfer::testing
