// Speculative decoding on the embedded model (models/deepseek-v3-tiny-code, its trained MTP
// layer) on the CPU backend: with drafts (k = 1..5, MTP or n-gram) every request's token
// ids and logprobs are bitwise those of the non-speculative engine (greedy and seeded
// sampling, penalties, stop strings, min_tokens, mixed batches, chunked prompts, n > 1,
// preemption), drafts never pass max_tokens, and the MTP drafts are accepted often.
#include <gtest/gtest.h>

#include "core/error.h"
#include "deepinfer/engine.h"
#include "tests/unit/spec/spec_fixture.h"

namespace deepinfer {
namespace {

using namespace spec_test;  // NOLINT(google-build-using-namespace)

EngineConfig config(int k, const std::string& speculator = "mtp") {
  EngineConfig c;
  c.model_dir = kModelDir;
  c.num_threads = 2;
  c.kv_block_size = 16;
  c.max_model_len = 512;
  c.num_speculative_tokens = k;
  c.speculator = speculator;
  c.spec_varlen = 0;
  return c;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.logprobs = 2;
  return p;
}

SamplingParams sampled(int max_tokens, uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.95f;
  p.max_tokens = max_tokens;
  p.seed = seed;
  p.logprobs = 1;
  return p;
}

TEST(SpecEngine, GreedyMtpEqualsNoSpeculationForK1To5) {
  const auto base = run(config(0), prompts(), {greedy(40)});
  for (int k = 1; k <= 5; ++k) {
    EngineStats st;
    const auto spec = run(config(k), prompts(), {greedy(40)}, &st);
    expect_same(base, spec, "k=" + std::to_string(k));
    EXPECT_EQ(st.num_speculative_tokens, k);
    EXPECT_GT(st.spec.num_draft_tokens, 0);
    // The trained MTP layer: most first drafts survive along greedy decodes.
    ASSERT_GE(st.spec.accepted_per_position.size(), 1u);
    EXPECT_GT(static_cast<double>(st.spec.accepted_per_position[0]) / st.spec.drafts_per_position[0], 0.5)
        << "k=" << k;
    EXPECT_LT(st.num_steps, static_cast<int64_t>(4 * 40)) << "k=" << k;
    // Per request counts add up to the run's.
    int64_t drafts = 0;
    for (const auto& o : spec) drafts += o.spec.num_draft_tokens;
    EXPECT_EQ(drafts, st.spec.num_draft_tokens);
  }
}

TEST(SpecEngine, SeededSamplingWithProcessorsEqualsNoSpeculation) {
  std::vector<SamplingParams> sp;
  for (int i = 0; i < 4; ++i) sp.push_back(sampled(32, 100 + i));
  sp[1].repetition_penalty = 1.3f;
  sp[1].frequency_penalty = 0.2f;
  sp[2].stop = {"\n\n"};
  sp[2].min_tokens = 6;
  sp[3].top_k = 5;
  sp[3].n = 2;
  const auto base = run(config(0), prompts(), sp);
  for (int k : {1, 3, 5}) expect_same(base, run(config(k), prompts(), sp), "sampled k=" + std::to_string(k));
}

TEST(SpecEngine, MixedBatchChunkedPromptsAndPreemptionEqualNoSpeculation) {
  EngineConfig c0 = config(0);
  c0.batch_invariant = true;  // one attention form whatever the chunking
  c0.max_num_batched_tokens = 24;  // prompts arrive in chunks beside running verify steps
  c0.num_kv_blocks = 12;           // and the cache is short: preemption
  std::vector<Prompt> p = prompts();
  p.push_back(p[2]);  // a prefix hit
  std::vector<SamplingParams> sp = {greedy(48), sampled(48, 7), greedy(48), sampled(48, 9), greedy(20)};
  EngineStats st0, st3;
  const auto base = run(c0, p, sp, &st0);
  EngineConfig c3 = c0;
  c3.num_speculative_tokens = 3;
  expect_same(base, run(c3, p, sp, &st3), "mixed k=3");
  EXPECT_GT(st3.num_preemptions, 0);
  EXPECT_GT(st3.spec.num_accepted_tokens, 0);
}

// The CPU backend is batch-invariant, so a request's MTP drafts (and so its acceptance,
// position by position) are the same alone and inside a batch: each chained draft reads its
// own sequence's hidden state, whatever else the MTP pass holds.
TEST(SpecEngine, DraftsOfARequestDoNotDependOnItsBatch) {
  EngineStats st;
  const auto batch = run(config(3), prompts(), {greedy(40)}, &st);
  ASSERT_EQ(batch.size(), kPrompts.size());
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    const auto alone = run(config(3), {Prompt::from_text(kPrompts[i])}, {greedy(40)});
    EXPECT_EQ(alone[0].outputs[0].token_ids, batch[i].outputs[0].token_ids) << "request " << i;
    EXPECT_EQ(alone[0].spec.drafts_per_position, batch[i].spec.drafts_per_position) << "request " << i;
    EXPECT_EQ(alone[0].spec.accepted_per_position, batch[i].spec.accepted_per_position) << "request " << i;
  }
}

TEST(SpecEngine, NgramProposerEqualsNoSpeculation) {
  const auto base = run(config(0), prompts(), {greedy(40)});
  EngineStats st;
  expect_same(base, run(config(4, "ngram"), prompts(), {greedy(40)}, &st), "ngram k=4");
  EXPECT_GT(st.spec.num_accepted_tokens, 0);  // the tiny model repeats itself
}

TEST(SpecEngine, DraftsNeverPassMaxTokens) {
  for (int max_tokens : {1, 2, 3, 7}) {
    EngineStats st;
    auto out = run(config(5), prompts(), {greedy(max_tokens)}, &st);
    for (const auto& o : out) {
      EXPECT_EQ(static_cast<int>(o.outputs[0].token_ids.size()), max_tokens);
      EXPECT_EQ(o.outputs[0].finish_reason, FinishReason::Length);
    }
  }
}

TEST(SpecEngine, BadConfigurationsAreClearErrors) {
  EngineConfig c = config(17);
  try {
    Engine e(c);
    FAIL() << "k = 17 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_speculative_tokens"), std::string::npos) << e.what();
  }
  c = config(2, "eagle");
  EXPECT_THROW(Engine{c}, Error);
  // A checkpoint without an MTP layer: MTP speculation is refused, n-gram runs.
  EngineConfig no_mtp;
  no_mtp.random_weights_config = DEEPINFER_SOURCE_DIR "/tests/data/tiny_v3/config.json";
  no_mtp.num_threads = 2;
  no_mtp.num_speculative_tokens = 2;
  try {
    Engine e(no_mtp);
    FAIL() << "MTP speculation without an MTP layer accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no MTP layer"), std::string::npos) << e.what();
  }
  no_mtp.speculator = "ngram";
  Engine e(no_mtp);
  auto out = e.generate({Prompt::from_tokens({5, 6, 7, 5, 6, 7, 5, 6})}, {greedy(6)});
  EXPECT_EQ(out[0].outputs[0].token_ids.size(), 6u);
}

// Left unset, k is 3 with the scheduled length on a checkpoint with an MTP layer (the
// embedded model), 0 on one without (v3_fp8_yarn) and on random weights; the output is k = 0's. The step-time table is measured lazily:
// nothing at construction, batch 1 for one request, the batches up to 4 for four.
TEST(SpecEngine, DefaultIsThreeScheduledDraftsWhereTheCheckpointHasAnMtpLayer) {
  EngineConfig c = config(0);
  c.num_speculative_tokens = -1;
  c.spec_varlen = -1;
  const std::vector<SamplingParams> sp = {greedy(24)};
  const auto base = run(config(0), prompts(), sp);
  {
    Engine e(c);
    EXPECT_EQ(e.stats().num_speculative_tokens, 3);
    EXPECT_EQ(e.stats().spec_varlen, 1);
    EXPECT_TRUE(e.stats().spec_step_times.empty());
    expect_same(base, e.generate(prompts(), sp), "default speculation");
    const EngineStats& st = e.stats();
    EXPECT_GT(st.spec.num_verify_steps, 0);
    ASSERT_FALSE(st.spec_step_times.empty());
    EXPECT_EQ(st.spec_step_times.batches.front(), 1);
    EXPECT_LE(st.spec_step_times.batches.back(), 4);
    EXPECT_EQ(st.spec_step_times.max_tokens_per_seq, 4);
  }
  {
    Engine e(c);
    const auto one = e.generate({prompts()[0]}, sp);
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(one[0].outputs[0].token_ids, base[0].outputs[0].token_ids);
    EXPECT_EQ(e.stats().spec_step_times.batches, std::vector<int>{1});
  }
  EngineConfig fixed = c;
  fixed.spec_varlen = 0;  // the default k with fixed lengths
  {
    Engine e(fixed);
    EXPECT_EQ(e.stats().spec_varlen, 0);
    EXPECT_EQ(e.stats().num_speculative_tokens, 3);
  }
  EngineConfig set_k = config(2);  // a k that is set: fixed lengths unless asked
  set_k.spec_varlen = -1;
  EXPECT_EQ(Engine(set_k).stats().spec_varlen, 0);
  EngineConfig without = c;
  without.model_dir = DEEPINFER_SOURCE_DIR "/tests/golden/fixtures/v3_fp8_yarn";
  without.max_model_len = 0;  // the fixture's
  EXPECT_EQ(Engine(without).stats().num_speculative_tokens, 0);
  EngineConfig random = c;
  random.model_dir.clear();
  random.random_weights_config = kModelDir + "/config.json";  // an MTP layer, but random
  EXPECT_EQ(Engine(random).stats().num_speculative_tokens, 0);
}

}  // namespace
}  // namespace deepinfer

namespace deepinfer {
namespace {

TEST(SpecEngine, ConfidenceScheduledLengthsNeverChangeOutput) {
  std::vector<SamplingParams> sp = {greedy(40), sampled(40, 3), greedy(40), sampled(40, 5)};
  const auto base = run(config(0), prompts(), sp);
  EngineConfig c = config(4);
  c.spec_varlen = 2;  // confidences: each draft's softmax probability
  EngineStats st2;
  expect_same(base, run(c, prompts(), sp, &st2), "scheduled k<=4, draft probabilities");
  c.spec_varlen = 1;  // confidences: the acceptance history
  EngineStats st;
  expect_same(base, run(c, prompts(), sp, &st), "scheduled k<=4");
  EXPECT_GT(st.spec.num_verify_steps + st2.spec.num_verify_steps, 0);
  // The table it chose from: measured at the first steps on verify shapes of 1..5 tokens per
  // sequence from batch 1, with the MTP passes (no mixed entries: the CPU has no graphs).
  const SpecStepTimes& t = st.spec_step_times;
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(t.batches[0], 1);
  EXPECT_EQ(t.max_tokens_per_seq, 5);
  EXPECT_EQ(t.verify_s.size(), t.batches.size() * 5);
  EXPECT_EQ(t.mtp_first_s.size(), t.batches.size());
  EXPECT_TRUE(t.mixed_s.empty());
  EXPECT_GT(t.measure_s, 0.0);  // (no bound on it: wall time is not asserted in tests; the ASan
                                // build on a loaded 2-core box took 17 s)
}

// A table on which drafting pays at batch <= 2 only (verify steps of 4 sequences cost 10x
// a decode step). With 4 requests the engine first drafts nothing and runs as k = 0 does
// (decode steps issued ahead, the MTP layer skipped); as requests finish it drafts again
// over a cache whose MTP rows have gaps. Output stays bitwise that of k = 0.
SpecStepTimes small_batch_table() {
  SpecStepTimes t;
  t.batches = {1, 2, 4};
  t.max_tokens_per_seq = 4;
  t.verify_s = {1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-2, 1e-2, 1e-2};
  t.decode_ahead_s = {1e-3, 1e-3, 1e-3};
  t.mtp_first_s = {1e-5, 1e-5, 1e-5};
  t.mtp_chain_s = {1e-5, 1e-5, 1e-5};
  return t;
}

TEST(SpecEngine, DraftingOffWhereItDoesNotPayThenOnAgainEqualsNoSpeculation) {
  std::vector<SamplingParams> sp = {greedy(40), sampled(40, 3), greedy(12), sampled(20, 5)};
  const auto base = run(config(0), prompts(), sp);
  EngineConfig c = config(3);
  c.spec_varlen = 1;
  c.spec_step_times = small_batch_table();
  EngineStats st;
  expect_same(base, run(c, prompts(), sp, &st), "depth 0 then drafting");
  EXPECT_GT(st.num_steps_without_drafts, 8);      // 4 and 3 requests: no drafts
  EXPECT_GT(st.spec.num_verify_steps, 0);          // 2 and 1: drafts again
  EXPECT_GT(st.spec.num_accepted_tokens, 0);
  EXPECT_EQ(st.spec_step_times.batches, c.spec_step_times.batches);  // given, not measured
}

// Greedy requests without logprobs: at batch 4 the engine with k = 3 and the table above
// never drafts, issues decode steps ahead as k = 0 does, and takes as many steps.
TEST(SpecEngine, WhereDraftingDoesNotPayTheStepsAreThoseOfNoSpeculation) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 24;
  EngineStats st0, st3;
  const auto base = run(config(0), prompts(), {p}, &st0);
  EngineConfig c = config(3);
  c.spec_varlen = 1;
  c.spec_step_times = small_batch_table();
  for (size_t i : {1, 2, 3, 5, 6, 7}) c.spec_step_times.verify_s[i] = 1e-2;  // batch 1 and 2 do not pay either
  expect_same(base, run(c, prompts(), {p}, &st3), "never drafting");
  EXPECT_EQ(st3.spec.num_draft_tokens, 0);
  EXPECT_GT(st0.num_steps_ahead, 0);
  // k = 0 may issue ahead of the prompts' step too; k = 3 first gives the prompts their MTP rows.
  EXPECT_GE(st3.num_steps_ahead, st0.num_steps_ahead - 1);
  EXPECT_EQ(st3.num_steps, st0.num_steps);
  EXPECT_GT(st3.num_steps_without_drafts, 0);
}

}  // namespace
}  // namespace deepinfer

namespace deepinfer {
namespace {

// The MTP layer's latent rows are one more KV layer: the same bytes hold 5/6 as many blocks
// (5 main layers + 1 MTP layer of the embedded model).
TEST(SpecEngine, KvSizingCountsTheMtpLayer) {
  EngineConfig off = config(0), on = config(3), ngram = config(3, "ngram");
  for (EngineConfig* c : {&off, &on, &ngram}) c->kv_cache_num_bytes = int64_t{120} * 5 * 16 * 160 * 4;
  EXPECT_EQ(Engine(off).stats().num_kv_blocks, 120);
  EXPECT_EQ(Engine(on).stats().num_kv_blocks, 100);
  EXPECT_EQ(Engine(ngram).stats().num_kv_blocks, 120);  // no MTP layer, no extra KV
}

}  // namespace
}  // namespace deepinfer
