#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>

#include "engine_fixture.h"

namespace deepinfer::testing {
namespace {

TEST(Engine, GreedyMatchesReferenceAndStopsAtEos) {
  EngineConfig cfg;
  cfg.kv_block_size = 4;
  auto engine = make_fake_engine(cfg);
  std::vector<int32_t> prompt = {5, 6, 7};
  auto out = engine->generate({Prompt::from_tokens(prompt)}, {greedy(200)});
  ASSERT_EQ(out.size(), 1u);
  auto ref = reference_greedy(prompt, 200, kVocab, kEos);
  EXPECT_EQ(out[0].outputs[0].token_ids, ref);
  EXPECT_EQ(out[0].outputs[0].finish_reason,
            ref.back() == kEos ? FinishReason::Stop : FinishReason::Length);
  EXPECT_EQ(out[0].num_prompt_tokens, 3);
  EXPECT_TRUE(out[0].finished);
}

// 200 mixed-length requests in one batch give exactly their solo tokens.
TEST(Engine, BatchOf200EqualsSoloRuns) {
  std::mt19937 rng(11);
  std::vector<Prompt> prompts;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 200; ++i) {
    prompts.push_back(Prompt::from_tokens(random_tokens(rng, 1 + static_cast<int>(rng() % 300))));
    params.push_back(greedy(1 + static_cast<int>(rng() % 40)));
  }
  EngineConfig cfg;
  cfg.kv_block_size = 16;
  cfg.max_num_batched_tokens = 512;  // forces chunked prefill beside decodes
  cfg.max_num_seqs = 64;
  auto batched = make_fake_engine(cfg)->generate(prompts, params);
  auto solo_engine = make_fake_engine(cfg);
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto solo = solo_engine->generate({prompts[i]}, {params[i]});
    ASSERT_EQ(batched[i].outputs[0].token_ids, solo[0].outputs[0].token_ids) << "request " << i;
    ASSERT_EQ(batched[i].outputs[0].token_ids,
              reference_greedy(prompts[i].token_ids, params[i].max_tokens, kVocab, kEos))
        << "request " << i;
  }
}

// Plain greedy batches take the backend argmax path; asking for logprobs forces
// the host sampler. Both must give the same tokens.
TEST(Engine, ArgmaxPathEqualsSamplerPath) {
  std::mt19937 rng(15);
  std::vector<Prompt> prompts;
  for (int i = 0; i < 10; ++i) prompts.push_back(Prompt::from_tokens(random_tokens(rng, 1 + i * 7)));
  SamplingParams plain = greedy(20);
  SamplingParams with_logprobs = plain;
  with_logprobs.logprobs = 2;
  EngineConfig cfg;
  cfg.kv_block_size = 8;
  auto a = make_fake_engine(cfg)->generate(prompts, {plain});
  auto b = make_fake_engine(cfg)->generate(prompts, {with_logprobs});
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(a[i].outputs[0].token_ids, b[i].outputs[0].token_ids) << i;
    ASSERT_EQ(b[i].outputs[0].logprobs.size(), b[i].outputs[0].token_ids.size());
    EXPECT_EQ(b[i].outputs[0].logprobs[0].top[0].first, b[i].outputs[0].token_ids[0]);
  }
}

TEST(Engine, SharedPrefixReusesBlocksAndGivesIdenticalOutput) {
  std::mt19937 rng(12);
  auto prefix = random_tokens(rng, 1000);
  EngineConfig cfg;
  cfg.kv_block_size = 16;
  auto engine = make_fake_engine(cfg);
  auto first = engine->generate({Prompt::from_tokens(prefix)}, {greedy(8)});
  EXPECT_EQ(first[0].num_cached_tokens, 0);
  auto second_prompt = prefix;
  second_prompt.push_back(9);
  auto second = engine->generate({Prompt::from_tokens(second_prompt)}, {greedy(8)});
  EXPECT_EQ(second[0].num_cached_tokens, 992);  // 62 full blocks of 16
  EXPECT_EQ(second[0].outputs[0].token_ids, reference_greedy(second_prompt, 8, kVocab, kEos));
  // Same prompt again: all but the last block-aligned token come from the cache.
  auto again = engine->generate({Prompt::from_tokens(prefix)}, {greedy(8)});
  EXPECT_EQ(again[0].num_cached_tokens, 992);
  EXPECT_EQ(again[0].outputs[0].token_ids, first[0].outputs[0].token_ids);
  EXPECT_GE(engine->stats().num_cached_tokens, 1984);
}

TEST(Engine, SeededSamplingDoesNotDependOnTheBatch) {
  std::mt19937 rng(13);
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.max_tokens = 30;
  p.ignore_eos = true;
  p.seed = 1234;
  auto prompt = Prompt::from_tokens(random_tokens(rng, 17));
  EngineConfig cfg;
  cfg.kv_block_size = 8;
  auto alone = make_fake_engine(cfg)->generate({prompt}, {p});
  std::vector<Prompt> prompts;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 20; ++i) {
    prompts.push_back(Prompt::from_tokens(random_tokens(rng, 1 + static_cast<int>(rng() % 50))));
    SamplingParams q = p;
    q.seed = 99 + i;
    params.push_back(q);
  }
  prompts.insert(prompts.begin() + 7, prompt);
  params.insert(params.begin() + 7, p);
  auto batch = make_fake_engine(cfg)->generate(prompts, params);
  EXPECT_EQ(batch[7].outputs[0].token_ids, alone[0].outputs[0].token_ids);
  SamplingParams other = p;
  other.seed = 4321;
  auto reseeded = make_fake_engine(cfg)->generate({prompt}, {other});
  EXPECT_NE(reseeded[0].outputs[0].token_ids, alone[0].outputs[0].token_ids);
}

TEST(Engine, SamplesOfOneRequestShareThePromptBlocks) {
  std::mt19937 rng(14);
  auto prompt = random_tokens(rng, 100);
  SamplingParams p;
  p.n = 4;
  p.max_tokens = 10;
  p.seed = 7;
  p.ignore_eos = true;
  EngineConfig cfg;
  cfg.kv_block_size = 16;
  for (bool prefix_caching : {true, false}) {
    cfg.enable_prefix_caching = prefix_caching;
    auto engine = make_fake_engine(cfg);
    auto out = engine->generate({Prompt::from_tokens(prompt)}, {p});
    ASSERT_EQ(out[0].outputs.size(), 4u);
    EXPECT_EQ(out[0].num_cached_tokens, 99);  // samples 1..3 fork all but the last prompt token
    EXPECT_EQ(out[0].num_output_tokens, 40);
    std::set<std::vector<int32_t>> distinct;
    for (auto& c : out[0].outputs) distinct.insert(c.token_ids);
    EXPECT_GT(distinct.size(), 1u);  // different streams per sample
    // Prompt computed once, plus its last token once per other sample (its own first
    // token's logits); the partial block (tokens 96..99) is copied once per other sample.
    EXPECT_EQ(engine->stats().num_prompt_tokens_computed, 100 + 3);
    EXPECT_EQ(engine->stats().num_kv_block_copies, 3);
  }
}

// n = 4 with a seed: sample i draws from stream seq_seed + i, so it must give
// exactly what a solo request with seq_seed + i gives; the shared partial block
// and its copies must not change a token. Greedy: all four equal the reference.
TEST(Engine, ForkedSamplesEqualSoloRunsWithTheirSeeds) {
  std::mt19937 rng(16);
  for (int len : {1, 37, 48, 49, 130}) {
    auto prompt = random_tokens(rng, len);
    EngineConfig cfg;
    cfg.kv_block_size = 16;
    cfg.max_num_batched_tokens = 40;  // chunked prefill; samples join during decodes
    SamplingParams p;
    p.n = 4;
    p.max_tokens = 12;
    p.temperature = 0.8f;
    p.seed = 99;
    p.seq_seed = 5;
    p.ignore_eos = true;
    auto engine = make_fake_engine(cfg);
    // Another request in the batch, so forks happen beside unrelated work.
    auto out = engine->generate({Prompt::from_tokens(prompt), Prompt::from_tokens(random_tokens(rng, 20))},
                                {p, greedy(15)});
    ASSERT_EQ(out[0].outputs.size(), 4u);
    for (int i = 0; i < 4; ++i) {
      SamplingParams solo = p;
      solo.n = 1;
      solo.seq_seed = p.seq_seed + static_cast<uint64_t>(i);
      auto one = make_fake_engine(cfg)->generate({Prompt::from_tokens(prompt)}, {solo});
      EXPECT_EQ(out[0].outputs[i].token_ids, one[0].outputs[0].token_ids) << "len " << len << " sample " << i;
    }
    EXPECT_EQ(engine->stats().num_kv_block_copies, (len - 1) % 16 != 0 ? 3 : 0) << "len " << len;

    SamplingParams g = greedy(12);
    g.n = 4;
    g.ignore_eos = true;
    auto greedy_out = make_fake_engine(cfg)->generate({Prompt::from_tokens(prompt)}, {g});
    const auto ref = reference_greedy(prompt, 12, kVocab, kEos, /*ignore_eos=*/true);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(greedy_out[0].outputs[i].token_ids, ref) << "len " << len;
  }
}

TEST(Engine, BadRequestsFailAloneWhileOthersFinish) {
  EngineConfig cfg;
  cfg.kv_block_size = 4;
  auto engine = make_fake_engine(cfg, /*max_len=*/64);
  std::vector<Prompt> prompts = {Prompt::from_tokens({3, 4}), Prompt::from_tokens({}),
                                 Prompt::from_tokens(std::vector<int32_t>(64, 5)),
                                 Prompt::from_tokens({3, 4}), Prompt::from_tokens({3, 4}),
                                 Prompt::from_tokens({3, 4}), Prompt::from_tokens({3, 999}),
                                 Prompt::from_text("hello")};
  std::vector<SamplingParams> params(prompts.size(), greedy(5));
  params[3].max_tokens = 0;
  params[4].temperature = -1;
  params[5].top_p = 1.5f;
  auto out = engine->generate(prompts, params);
  EXPECT_EQ(out[0].outputs[0].token_ids, reference_greedy({3, 4}, 5, kVocab, kEos));
  const char* expect[] = {"", "empty prompt", "context is 64", "max_tokens", "temperature",
                          "top_p", "outside the vocabulary", "no tokenizer"};
  for (size_t i = 1; i < prompts.size(); ++i) {
    EXPECT_EQ(out[i].outputs[0].finish_reason, FinishReason::Error) << i;
    EXPECT_NE(out[i].error.find(expect[i]), std::string::npos) << i << ": " << out[i].error;
  }
}

TEST(Engine, StopTokenIdsMinTokensAndLength) {
  EngineConfig cfg;
  cfg.kv_block_size = 4;
  auto engine = make_fake_engine(cfg);
  std::vector<int32_t> prompt = {10, 11, 12};
  auto ref = reference_greedy(prompt, 50, kVocab, kEos, /*ignore_eos=*/true);
  SamplingParams stop_at = greedy(50);
  stop_at.ignore_eos = true;
  stop_at.stop_token_ids = {ref[4]};
  auto out = engine->generate({Prompt::from_tokens(prompt)}, {stop_at});
  size_t first = std::find(ref.begin(), ref.end(), ref[4]) - ref.begin();
  EXPECT_EQ(out[0].outputs[0].token_ids, std::vector<int32_t>(ref.begin(), ref.begin() + first + 1));
  EXPECT_EQ(out[0].outputs[0].finish_reason, FinishReason::Stop);
  EXPECT_EQ(out[0].outputs[0].stop_reason, std::to_string(ref[4]));
  // min_tokens masks the stop token: the first 6 tokens never contain it.
  SamplingParams minimum = stop_at;
  minimum.min_tokens = 6;
  out = engine->generate({Prompt::from_tokens(prompt)}, {minimum});
  auto& ids = out[0].outputs[0].token_ids;
  ASSERT_GE(ids.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_NE(ids[i], ref[4]);
  SamplingParams len = greedy(7);
  len.ignore_eos = true;
  out = engine->generate({Prompt::from_tokens(prompt)}, {len});
  EXPECT_EQ(out[0].outputs[0].token_ids, std::vector<int32_t>(ref.begin(), ref.begin() + 7));
  EXPECT_EQ(out[0].outputs[0].finish_reason, FinishReason::Length);
}

TEST(Engine, StreamingAddStepAbort) {
  EngineConfig cfg;
  cfg.kv_block_size = 4;
  auto engine = make_fake_engine(cfg);
  SamplingParams p = greedy(100);
  p.ignore_eos = true;
  std::string a = engine->add_request(Prompt::from_tokens({3, 4, 5}), p, "a");
  std::string b = engine->add_request(Prompt::from_tokens({6, 7}), greedy(3), "b");
  EXPECT_THROW(engine->add_request(Prompt::from_tokens({1}), p, "a"), Error);
  std::vector<int32_t> streamed_a;
  int steps = 0;
  bool b_done = false;
  while (engine->has_unfinished() && steps < 10) {
    for (auto& o : engine->step()) {
      if (o.request_id == "a") {
        streamed_a.insert(streamed_a.end(), o.outputs[0].delta_token_ids.begin(),
                          o.outputs[0].delta_token_ids.end());
        EXPECT_EQ(o.outputs[0].token_ids, streamed_a);
      }
      if (o.request_id == "b" && o.finished) b_done = true;
    }
    ++steps;
  }
  EXPECT_TRUE(b_done);
  EXPECT_EQ(streamed_a, reference_greedy({3, 4, 5}, 10, kVocab, kEos, true));
  EXPECT_TRUE(engine->abort("a"));
  EXPECT_FALSE(engine->abort("a"));
  EXPECT_FALSE(engine->has_unfinished());
}

// SamplingParams::delta_outputs: every update carries only what it adds (no copy that grows with
// the output), and the updates add up to the cumulative run's final output, logprobs included.
TEST(Engine, DeltaOutputsCarryOnlyTheNewPartAndAddUpToTheWhole) {
  EngineConfig cfg;
  cfg.kv_block_size = 4;
  SamplingParams p = greedy(40);
  p.ignore_eos = true;
  p.logprobs = 2;
  p.n = 2;
  p.temperature = 1.0f;  // the two samples differ
  p.seed = 7;
  SamplingParams d = p;
  d.delta_outputs = true;
  const Prompt prompt = Prompt::from_tokens({3, 4, 5, 6, 7});
  auto whole = make_fake_engine(cfg)->generate({prompt}, {p});
  ASSERT_TRUE(whole[0].error.empty()) << whole[0].error;

  auto engine = make_fake_engine(cfg);
  engine->add_request(prompt, d, "d");
  std::vector<std::vector<int32_t>> ids(2);
  std::vector<std::vector<TokenLogprob>> lps(2);
  size_t num_updates = 0, entries_copied = 0;
  bool finished = false;
  while (engine->has_unfinished()) {
    for (auto& o : engine->step()) {
      ++num_updates;
      EXPECT_TRUE(o.prompt_token_ids.empty());
      EXPECT_EQ(o.num_prompt_tokens, 5);
      ASSERT_EQ(o.outputs.size(), 2u);
      for (const CompletionOutput& c : o.outputs) {
        EXPECT_EQ(c.token_ids, c.delta_token_ids) << "update " << num_updates;
        EXPECT_EQ(c.text, c.delta_text);
        EXPECT_EQ(c.logprobs.size(), c.delta_token_ids.size()) << "update " << num_updates;
        entries_copied += c.logprobs.size();
        ids[c.index].insert(ids[c.index].end(), c.delta_token_ids.begin(), c.delta_token_ids.end());
        lps[c.index].insert(lps[c.index].end(), c.logprobs.begin(), c.logprobs.end());
      }
      finished = finished || o.finished;
    }
  }
  EXPECT_TRUE(finished);
  EXPECT_GT(num_updates, 10u);  // streamed, not one update
  EXPECT_EQ(entries_copied, 80u);  // each token's entry once (cumulative updates copy ~n^2 / 2)
  for (const CompletionOutput& w : whole[0].outputs) {
    EXPECT_EQ(ids[w.index], w.token_ids) << "sample " << w.index;
    ASSERT_EQ(lps[w.index].size(), w.logprobs.size());
    for (size_t i = 0; i < w.logprobs.size(); ++i) {
      EXPECT_EQ(lps[w.index][i].token_id, w.logprobs[i].token_id);
      EXPECT_EQ(lps[w.index][i].logprob, w.logprobs[i].logprob);
      EXPECT_EQ(lps[w.index][i].top, w.logprobs[i].top);
    }
  }
  EXPECT_NE(whole[0].outputs[0].token_ids, whole[0].outputs[1].token_ids);
}

// Checked before any weights load, so it is cheap; the message names the field.
TEST(Engine, RejectsGpuMemoryUtilizationOutsideZeroToOne) {
  for (double u : {0.0, 1.5, -0.1}) {
    EngineConfig cfg;
    cfg.random_weights_config = DEEPINFER_SOURCE_DIR "/tests/data/tiny_v3/config.json";
    cfg.gpu_memory_utilization = u;
    try {
      Engine engine(cfg);
      ADD_FAILURE() << "accepted gpu_memory_utilization " << u;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("gpu_memory_utilization"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace deepinfer::testing
