// DeepSeek-V4 through the engine (scheduler, block manager, runner) like V3: its attention
// state in KV layer groups (model/deepseek_v4/kv_layout.h), on the tiny fixtures (the first two
// tests also on V4.1's, V41Fixtures).
//  - several sequences of different lengths batched in one step with chunked prefill give
//    the tokens and logprob bits of each run alone in one shot, and the fixture prompt gives
//    the oracle's 32 greedy tokens;
//  - a prefix hit (a multiple of ratio x block size tokens in every compressed group, the
//    window groups' blocks still cached) gives the bits of recomputing the whole prompt;
//  - window blocks are freed as the window moves: a sequence far longer than the window
//    groups' pools runs without preemption;
//  - preemption (a short cache), forked samples (n > 1) and n-gram speculative decoding
//    (verify steps, rejected drafts) keep each output's bits;
//  - MTP speculative decoding (fixtures/v4_mtp: the V4 MTP block drafting k = 1..3 tokens
//    from the target's hyper-connection streams, its K=V rows one more layer of the window
//    group) keeps each output's bits too;
//  - random weights (--random-weights: FP8 dense, FP4 experts) run through the engine;
//  - on CUDA (DEEPINFER_ACCELERATOR=cuda) the same engine path with batch-invariant kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "core/settings.h"
#include "deepinfer/engine.h"

namespace deepinfer {
namespace {

std::string fixture(const std::string& name) {
  return std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/" + name;
}

EngineConfig v4_config(const std::string& name) {
  EngineConfig c;
  c.model_dir = fixture(name);
  c.backend = "cpu";
  c.num_threads = 2;
  c.kv_block_size = 4;
  c.max_model_len = 512;
  return c;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.logprobs = 3;
  return p;
}

std::vector<int32_t> random_ids(std::mt19937& rng, int len) {
  std::vector<int32_t> ids(static_cast<size_t>(len));
  for (int32_t& t : ids) t = 2 + static_cast<int32_t>(rng() % 250);
  return ids;
}

// Same tokens and the same logprob bits (sampled token and its top alternatives).
void expect_same(const CompletionOutput& a, const CompletionOutput& b, const std::string& what) {
  ASSERT_EQ(a.token_ids, b.token_ids) << what;
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << what;
  for (size_t i = 0; i < a.logprobs.size(); ++i) {
    EXPECT_EQ(a.logprobs[i].token_id, b.logprobs[i].token_id) << what << " position " << i;
    EXPECT_EQ(a.logprobs[i].logprob, b.logprobs[i].logprob) << what << " position " << i;
    EXPECT_EQ(a.logprobs[i].top, b.logprobs[i].top) << what << " position " << i;
  }
}

class EngineV4 : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineV4, BatchedChunkedPrefillEqualsEachAlone) {
  std::ifstream in(fixture(GetParam()) + "/reference.json");
  const nlohmann::json ref = nlohmann::json::parse(in);
  const auto oracle_prompt = ref.at("prompt_ids").get<std::vector<int32_t>>();
  const auto oracle_greedy = ref.at("greedy_ids").get<std::vector<int32_t>>();
  std::mt19937 rng(16);
  std::vector<Prompt> prompts = {Prompt::from_tokens(oracle_prompt)};
  for (int len : {3, 11, 29, 47, 70}) prompts.push_back(Prompt::from_tokens(random_ids(rng, len)));
  std::vector<SamplingParams> params(prompts.size(), greedy(20));
  params[0] = greedy(static_cast<int>(oracle_greedy.size()));

  EngineConfig batched = v4_config(GetParam());
  batched.max_num_seqs = 4;
  batched.max_num_batched_tokens = 13;  // prefill in chunks, beside other sequences' decodes
  batched.enable_prefix_caching = false;
  Engine engine(batched);
  const std::vector<RequestOutput> out = engine.generate(prompts, params);
  ASSERT_EQ(out.size(), prompts.size());
  EXPECT_EQ(out[0].outputs[0].token_ids, oracle_greedy) << GetParam() << ": the oracle's greedy tokens";

  EngineConfig alone_cfg = v4_config(GetParam());
  alone_cfg.max_num_seqs = 1;
  alone_cfg.max_num_batched_tokens = 512;  // the whole prompt in one step
  alone_cfg.enable_prefix_caching = false;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Engine alone(alone_cfg);
    const std::vector<RequestOutput> one = alone.generate({prompts[i]}, {params[i]});
    ASSERT_TRUE(one[0].error.empty() && out[i].error.empty()) << one[0].error << out[i].error;
    expect_same(one[0].outputs[0], out[i].outputs[0], GetParam() + ": request " + std::to_string(i));
  }
}

// Engine::prompt_logprobs (one prefill step on a runner of its own, every group's blocks)
// against the log-softmax of the oracle's logits.
TEST_P(EngineV4, PromptLogprobsMatchTheOracle) {
  std::ifstream in(fixture(GetParam()) + "/reference.json");
  const nlohmann::json ref = nlohmann::json::parse(in);
  const auto prompt = ref.at("prompt_ids").get<std::vector<int32_t>>();
  const auto logits = ref.at("logits").get<std::vector<std::vector<double>>>();
  Engine engine(v4_config(GetParam()));
  const std::vector<double> got = engine.prompt_logprobs(Prompt::from_tokens(prompt));
  ASSERT_EQ(got.size() + 1, prompt.size());
  for (size_t i = 0; i < got.size(); ++i) {
    double mx = -INFINITY, sum = 0.0;
    for (double v : logits[i]) mx = std::max(mx, v);
    for (double v : logits[i]) sum += std::exp(v - mx);
    const double want = logits[i][static_cast<size_t>(prompt[i + 1])] - mx - std::log(sum);
    EXPECT_NEAR(got[i], want, 1e-4 * std::max(1.0, std::fabs(want))) << GetParam() << " position " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineV4, ::testing::Values("v4_tiny", "v4_fp8_fp4"));
// DeepSeek-V4.1 (model/deepseek_v41: per-layer window rings, compressed rows only at KV sources,
// packed U8 groups) through the same engine; its oracle is the unmerged transformers PR
// (tools/golden/v41_golden.py).
INSTANTIATE_TEST_SUITE_P(V41Fixtures, EngineV4, ::testing::Values("v41_tiny", "v41_fp8_fp4"));

// v4_tiny (CSA ratio 4, HCA ratio 8, window 6), blocks of 4 tokens: a hit is a multiple of
// 8 x 4 = 32 tokens; for a 75-token prompt 64, the window groups' blocks of tokens 56..63
// freed by the first request but still cached.
TEST(EngineV4Prefix, PrefixHitEqualsRecompute) {
  std::mt19937 rng(17);
  const std::vector<int32_t> prefix = random_ids(rng, 70);
  std::vector<int32_t> longer = prefix;
  for (int32_t t : {5, 9, 13, 17, 21}) longer.push_back(t);
  EngineConfig cached_cfg = v4_config("v4_tiny");
  Engine cached(cached_cfg);
  const auto first = cached.generate({Prompt::from_tokens(prefix)}, {greedy(8)});
  EXPECT_EQ(first[0].num_cached_tokens, 0);
  const auto second = cached.generate({Prompt::from_tokens(longer)}, {greedy(12)});
  EXPECT_EQ(second[0].num_cached_tokens, 64);

  EngineConfig plain_cfg = v4_config("v4_tiny");
  plain_cfg.enable_prefix_caching = false;
  Engine plain(plain_cfg);
  const auto want = plain.generate({Prompt::from_tokens(longer)}, {greedy(12)});
  EXPECT_EQ(want[0].num_cached_tokens, 0);
  expect_same(want[0].outputs[0], second[0].outputs[0], "prefix hit vs recompute");
}

// DeepSeek-V4.1's prefill truncation through the engine (model/deepseek_v41/truncation.h). On
// v41_tiny (window 8, layers 5-6 above the last KV source, DSpark blocks of 5) every accepted keep
// (>= 8 + 2 x 6 = 20) is at least the exact keep 2 x 7 + 1 = 15, so compact must give off's
// tokens and logprob bits: prompts of 45-104 tokens in chunks of 13 beside other sequences'
// decodes, a continuation of a cached prompt (a prefix hit of 88 tokens in both modes: the window
// blocks from the reuse floor 94 - 24 + 7 = 77 on are cached), a prompt sharing only 64 tokens
// (off hits 64; compact none, its window blocks there lie below the reuse floor), and prompt
// logprobs (such a request runs untruncated).
TEST(EngineV41Truncation, CompactEqualsOffWhereTheKeepIsExact) {
  std::mt19937 rng(23);
  const std::vector<int32_t> a = random_ids(rng, 94);
  std::vector<int32_t> d = a, e(a.begin(), a.begin() + 64);
  for (int32_t t : random_ids(rng, 10)) d.push_back(t);
  for (int32_t t : random_ids(rng, 30)) e.push_back(t);
  // After `a` alone: d and e (prefix hits, taken at admission), beside two fresh prompts.
  const std::vector<Prompt> second = {Prompt::from_tokens(d), Prompt::from_tokens(e),
                                      Prompt::from_tokens(random_ids(rng, 45)),
                                      Prompt::from_tokens(random_ids(rng, 100))};
  const Prompt scored_prompt = Prompt::from_tokens(random_ids(rng, 60));
  SamplingParams scored = greedy(4);
  scored.prompt_logprobs = 2;
  std::vector<std::vector<RequestOutput>> outs;
  for (const char* mode : {"off", "compact"}) {
    EngineConfig cfg = v4_config("v41_tiny");
    cfg.max_num_seqs = 16;  // window pools of 84 blocks: a's freed blocks stay cached
    cfg.max_num_batched_tokens = 13;
    cfg.prefill_truncation_mode = mode;
    cfg.prefill_keep_tokens = 24;
    Engine engine(cfg);
    std::vector<RequestOutput> got = engine.generate({Prompt::from_tokens(a)}, {greedy(12)});
    for (RequestOutput& r : engine.generate(second, std::vector<SamplingParams>(4, greedy(12))))
      got.push_back(std::move(r));
    got.push_back(engine.generate({scored_prompt}, {scored})[0]);
    for (const RequestOutput& r : got) ASSERT_TRUE(r.error.empty()) << mode << ": " << r.error;
    EXPECT_EQ(got[1].num_cached_tokens, 88) << mode;
    EXPECT_EQ(got[2].num_cached_tokens, std::string(mode) == "off" ? 64 : 0) << mode;
    outs.push_back(std::move(got));
  }
  for (size_t i = 0; i < outs[0].size(); ++i)
    expect_same(outs[0][i].outputs[0], outs[1][i].outputs[0], "request " + std::to_string(i));
  ASSERT_EQ(outs[0][5].prompt_logprobs.size(), outs[1][5].prompt_logprobs.size());
  for (size_t i = 0; i < outs[0][5].prompt_logprobs.size(); ++i)
    EXPECT_EQ(outs[0][5].prompt_logprobs[i].logprob, outs[1][5].prompt_logprobs[i].logprob) << i;
  // A keep below the floor is refused when the engine loads the model.
  EngineConfig bad = v4_config("v41_tiny");
  bad.prefill_truncation_mode = "compact";
  bad.prefill_keep_tokens = 19;
  EXPECT_THROW(Engine{bad}, std::exception);
}

// Below the exact keep (v41_tiny with DSpark blocks of 1: floor 8 + 4 = 12 < 15, in a copy of the
// fixture): compact differs from off (the truncation is on in the engine), and its batched,
// chunked run gives each prompt's tokens and logprob bits of that prompt alone in one step.
TEST(EngineV41Truncation, BelowTheExactKeepChunkedAndBatchedEqualAlone) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "v41_tiny_dspark1";
  fs::create_directories(dir);
  {
    std::ifstream in(fixture("v41_tiny") + "/config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    cfg["text_config"]["dspark_block_size"] = 1;
    std::ofstream(dir / "config.json") << cfg.dump(2);
    fs::copy_file(fixture("v41_tiny") + "/model.safetensors", dir / "model.safetensors",
                  fs::copy_options::overwrite_existing);
  }
  std::mt19937 rng(29);
  std::vector<Prompt> prompts;
  for (int len : {80, 33, 11, 61}) prompts.push_back(Prompt::from_tokens(random_ids(rng, len)));
  const std::vector<SamplingParams> params(prompts.size(), greedy(10));
  auto config = [&](const char* mode, int seqs, int tokens) {
    EngineConfig c = v4_config("v41_tiny");
    c.model_dir = dir.string();
    c.max_num_seqs = seqs;
    c.max_num_batched_tokens = tokens;
    c.prefill_truncation_mode = mode;
    c.prefill_keep_tokens = 12;
    return c;
  };
  Engine batched(config("compact", 4, 13));
  const std::vector<RequestOutput> got = batched.generate(prompts, params);
  Engine off(config("off", 1, 512));
  const std::vector<RequestOutput> full = off.generate({prompts[0]}, {params[0]});
  EXPECT_NE(full[0].outputs[0].logprobs[0].logprob, got[0].outputs[0].logprobs[0].logprob)
      << "keep 12 of 80 below the exact 15: the first token's logprob moves";
  for (size_t i = 0; i < prompts.size(); ++i) {
    Engine alone(config("compact", 1, 512));
    const std::vector<RequestOutput> one = alone.generate({prompts[i]}, {params[i]});
    ASSERT_TRUE(one[0].error.empty() && got[i].error.empty()) << one[0].error << got[i].error;
    expect_same(one[0].outputs[0], got[i].outputs[0], "request " + std::to_string(i));
  }
  fs::remove_all(dir);
}

// One sequence, steps of at most 8 tokens: the window groups' pools hold 7 blocks (28
// tokens; kv/kv_groups.h), the sequence reaches 208 tokens. Without freeing it could not
// run; with it, no preemption and the tokens of a roomy cache.
TEST(EngineV4Window, WindowBlocksAreFreedAsTheWindowMoves) {
  std::mt19937 rng(18);
  const Prompt prompt = Prompt::from_tokens(random_ids(rng, 8));
  EngineConfig tight = v4_config("v4_tiny");
  tight.max_num_seqs = 1;
  tight.max_num_batched_tokens = 8;
  tight.num_kv_blocks = 64;
  tight.enable_prefix_caching = false;
  Engine engine(tight);
  const auto out = engine.generate({prompt}, {greedy(200)});
  ASSERT_TRUE(out[0].error.empty()) << out[0].error;
  EXPECT_EQ(engine.stats().num_preemptions, 0);

  EngineConfig roomy = v4_config("v4_tiny");
  roomy.enable_prefix_caching = false;
  Engine reference(roomy);
  const auto want = reference.generate({prompt}, {greedy(200)});
  expect_same(want[0].outputs[0], out[0].outputs[0], "tight window pools vs roomy");
}

// A cache too small for every sequence at once: the compressed groups' pools run short,
// sequences are preempted and recomputed, and every output keeps the bits of its run alone.
TEST(EngineV4Preemption, ShortCacheBatchWithPreemptionEqualsAlone) {
  std::mt19937 rng(19);
  std::vector<Prompt> prompts;
  for (int len : {41, 37, 44, 30, 50, 39}) prompts.push_back(Prompt::from_tokens(random_ids(rng, len)));
  const std::vector<SamplingParams> params(prompts.size(), greedy(30));
  EngineConfig tight = v4_config("v4_tiny");
  tight.max_num_seqs = 4;
  tight.max_num_batched_tokens = 13;
  tight.num_kv_blocks = 24;  // csa_entries: 24 / 4 + 4 = 10 blocks of 16 tokens, four sequences of ~70 need 20
  Engine engine(tight);
  const auto out = engine.generate(prompts, params);
  EXPECT_GT(engine.stats().num_preemptions, 0);
  EngineConfig alone_cfg = v4_config("v4_tiny");
  alone_cfg.max_num_seqs = 1;
  alone_cfg.enable_prefix_caching = false;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Engine alone(alone_cfg);
    const auto want = alone.generate({prompts[i]}, {params[i]});
    ASSERT_TRUE(out[i].error.empty()) << out[i].error;
    expect_same(want[0].outputs[0], out[i].outputs[0], "request " + std::to_string(i));
  }
}

// n = 3 samples of one prompt: samples 1..2 fork sample 0's blocks in every group and copy
// shared blocks on first write (46 tokens: the window of the fork point, tokens 40.., is
// still held when they are admitted), or take the prefix cache when sample 0's window has
// moved past the fork point (45 tokens: it freed tokens 36..39 as its first decode began);
// greedy, every sample gives the bits of n = 1.
TEST(EngineV4Fork, SamplesSharingThePromptEqualOneSample) {
  for (int len : {45, 46}) {
    std::mt19937 rng(20);
    const Prompt prompt = Prompt::from_tokens(random_ids(rng, len));
    SamplingParams p = greedy(16);
    EngineConfig cfg = v4_config("v4_tiny");
    Engine single(cfg);
    const auto want = single.generate({prompt}, {p});
    p.n = 3;
    Engine engine(cfg);
    const auto out = engine.generate({prompt}, {p});
    ASSERT_EQ(out[0].outputs.size(), 3u);
    if (len == 46) {
      EXPECT_EQ(out[0].num_cached_tokens, 45) << "forked";
      EXPECT_GT(engine.stats().num_kv_block_copies, 0);
    } else {
      EXPECT_EQ(out[0].num_cached_tokens, 32) << "prefix cache";
    }
    for (const CompletionOutput& c : out[0].outputs)
      expect_same(want[0].outputs[0], c, std::to_string(len) + " tokens, sample " + std::to_string(c.index));
  }
}

// Speculative decoding with n-gram drafts: verify steps of 1 + k tokens per sequence write
// window rows, pending rows and (when a draft completes a group) compressed entries that a
// rejected draft leaves behind; the next step rewrites them, so the tokens and logprob bits
// are those of decoding without drafts. Repetitive prompts make the drafts hit.
TEST(EngineV4Spec, NgramDraftsKeepTheTokens) {
  std::mt19937 rng(21);
  std::vector<Prompt> prompts;
  for (int i = 0; i < 4; ++i) {
    const std::vector<int32_t> motif = random_ids(rng, 3 + i);
    std::vector<int32_t> ids;
    while (ids.size() < 40) ids.insert(ids.end(), motif.begin(), motif.end());
    prompts.push_back(Prompt::from_tokens(ids));
  }
  const std::vector<SamplingParams> params(prompts.size(), greedy(24));
  EngineConfig plain_cfg = v4_config("v4_tiny");
  plain_cfg.num_speculative_tokens = 0;
  Engine plain(plain_cfg);
  const auto want = plain.generate(prompts, params);
  EngineConfig spec_cfg = v4_config("v4_tiny");
  spec_cfg.num_speculative_tokens = 3;
  spec_cfg.speculator = "ngram";
  Engine spec(spec_cfg);
  const auto got = spec.generate(prompts, params);
  const SpecDecodeStats& st = spec.stats().spec;
  EXPECT_GT(st.num_accepted_tokens, 0);                    // drafts kept
  EXPECT_GT(st.num_draft_tokens, st.num_accepted_tokens);  // and drafts rejected
  for (size_t i = 0; i < prompts.size(); ++i)
    expect_same(want[i].outputs[0], got[i].outputs[0], "request " + std::to_string(i));
}

// MTP drafts: verification is exact, so k = 1..3 give the tokens and logprob bits of k = 0;
// drafts are made and verified (the fixture's MTP block is random: few or none are accepted,
// so accepted-draft verify steps are covered by NgramDraftsKeepTheTokens).
TEST(EngineV4Spec, MtpDraftsKeepTheTokens) {
  std::mt19937 rng(22);
  std::vector<Prompt> prompts;
  for (int len : {5, 19, 33}) prompts.push_back(Prompt::from_tokens(random_ids(rng, len)));
  const std::vector<SamplingParams> params(prompts.size(), greedy(20));
  EngineConfig plain_cfg = v4_config("v4_mtp");
  plain_cfg.num_speculative_tokens = 0;
  Engine plain(plain_cfg);
  const auto want = plain.generate(prompts, params);
  int64_t accepted = 0, drafted = 0;
  for (int k = 1; k <= 3; ++k) {
    EngineConfig spec_cfg = v4_config("v4_mtp");
    spec_cfg.num_speculative_tokens = k;
    spec_cfg.speculator = "mtp";
    Engine spec(spec_cfg);
    const auto got = spec.generate(prompts, params);
    const SpecDecodeStats& st = spec.stats().spec;
    EXPECT_GT(st.num_draft_tokens, 0) << "k = " << k;
    accepted += st.num_accepted_tokens;
    drafted += st.num_draft_tokens;
    for (size_t i = 0; i < prompts.size(); ++i)
      expect_same(want[i].outputs[0], got[i].outputs[0], "k = " + std::to_string(k) + ", request " + std::to_string(i));
  }
  std::printf("[golden v4] mtp drafts over k = 1..3: %lld verified, %lld accepted\n", static_cast<long long>(drafted),
              static_cast<long long>(accepted));
}

// Random V4 weights (model/deepseek_v4/weights_random.cpp) through the engine, on `backend`:
// v4_fp8_fp4's config with FP8 dense linears and FP4 routed experts (the CPU reference
// dequantizes them per step). Every output has its tokens and finite logprobs; the same seed
// gives the same bits batched (chunked prefill beside decodes) and alone.
void random_weights_run(const std::string& backend) {
  EngineConfig c;
  c.random_weights_config = fixture("v4_fp8_fp4") + "/config.json";
  c.random_weights_dtype = "fp8";
  c.random_weights_seed = 7;
  c.backend = backend;
  c.batch_invariant = backend == "cuda";
  c.num_threads = 2;
  c.kv_block_size = 4;
  c.max_model_len = 256;
  c.num_kv_blocks = 256;
  c.enable_prefix_caching = false;
  std::mt19937 rng(23);
  std::vector<Prompt> prompts;
  for (int len : {9, 40, 150}) prompts.push_back(Prompt::from_tokens(random_ids(rng, len)));
  const std::vector<SamplingParams> params(prompts.size(), greedy(24));
  EngineConfig batched = c;
  batched.max_num_seqs = 3;
  batched.max_num_batched_tokens = 17;
  Engine engine(batched);
  const auto out = engine.generate(prompts, params);
  EngineConfig alone_cfg = c;
  alone_cfg.max_num_seqs = 1;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(out[i].error.empty()) << out[i].error;
    const CompletionOutput& o = out[i].outputs[0];
    ASSERT_EQ(o.token_ids.size(), 24u) << backend << " request " << i;
    for (const auto& lp : o.logprobs) EXPECT_TRUE(std::isfinite(lp.logprob)) << backend << " request " << i;
    Engine alone(alone_cfg);
    const auto want = alone.generate({prompts[i]}, {params[i]});
    expect_same(want[0].outputs[0], o, backend + " random weights: request " + std::to_string(i));
  }
}

TEST(EngineV4Random, FpEightFpFourWeightsRunBatchedAsAlone) { random_weights_run("cpu"); }

// --- The engine on CUDA (DEEPINFER_ACCELERATOR=cuda, skipped otherwise). Batch-invariant
// kernels make bits comparable: continuous batching with chunked prefill beside decodes,
// decode steps the runner pads to its graph buckets and replays as CUDA graphs, and MTP
// drafts made from the hyper-connection streams, F32 on CUDA too (Model::mtp_hidden_dtype;
// the runner's hidden rows were BF16 there before, which V4's forward refuses).
bool engine_on_cuda() { return env_settings().get_string("DEEPINFER_ACCELERATOR") == "cuda"; }

EngineConfig v4_cuda_config(const std::string& name) {
  EngineConfig c = v4_config(name);
  c.backend = "cuda";
  c.batch_invariant = true;
  c.num_kv_blocks = 256;
  return c;
}

TEST(EngineV4Cuda, BatchedChunkedPrefillEqualsEachAlone) {
  if (!engine_on_cuda()) GTEST_SKIP() << "DEEPINFER_ACCELERATOR is not cuda";
  for (const std::string name : {"v4_tiny", "v4_fp8_fp4"}) {
    std::mt19937 rng(24);
    std::vector<Prompt> prompts;
    for (int len : {3, 11, 29, 47, 70, 140}) prompts.push_back(Prompt::from_tokens(random_ids(rng, len)));
    const std::vector<SamplingParams> params(prompts.size(), greedy(20));
    EngineConfig batched = v4_cuda_config(name);
    batched.max_num_seqs = 4;
    batched.max_num_batched_tokens = 13;
    batched.enable_prefix_caching = false;
    Engine engine(batched);
    const auto out = engine.generate(prompts, params);
    EngineConfig alone_cfg = v4_cuda_config(name);
    alone_cfg.max_num_seqs = 1;
    alone_cfg.max_num_batched_tokens = 512;
    alone_cfg.enable_prefix_caching = false;
    for (size_t i = 0; i < prompts.size(); ++i) {
      Engine alone(alone_cfg);
      const auto one = alone.generate({prompts[i]}, {params[i]});
      ASSERT_TRUE(one[0].error.empty() && out[i].error.empty()) << one[0].error << out[i].error;
      expect_same(one[0].outputs[0], out[i].outputs[0], name + " on cuda: request " + std::to_string(i));
    }
  }
}

TEST(EngineV4Cuda, MtpDraftsKeepTheTokens) {
  if (!engine_on_cuda()) GTEST_SKIP() << "DEEPINFER_ACCELERATOR is not cuda";
  std::mt19937 rng(25);
  std::vector<Prompt> prompts;
  for (int len : {5, 19, 33}) prompts.push_back(Prompt::from_tokens(random_ids(rng, len)));
  const std::vector<SamplingParams> params(prompts.size(), greedy(20));
  EngineConfig plain_cfg = v4_cuda_config("v4_mtp");
  plain_cfg.num_speculative_tokens = 0;
  Engine plain(plain_cfg);
  const auto want = plain.generate(prompts, params);
  EngineConfig spec_cfg = v4_cuda_config("v4_mtp");
  spec_cfg.num_speculative_tokens = 2;
  spec_cfg.speculator = "mtp";
  Engine spec(spec_cfg);
  const auto got = spec.generate(prompts, params);
  EXPECT_GT(spec.stats().spec.num_draft_tokens, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(got[i].error.empty()) << got[i].error;
    expect_same(want[i].outputs[0], got[i].outputs[0], "mtp k = 2 on cuda: request " + std::to_string(i));
  }
}

// V4 decode steps replay CUDA graphs (their row lists built on the device, padded to the
// runner's batch and context buckets): the same tokens and logprob bits as eager decode, on
// every layer kind (window-only, CSA ratio 4, HCA ratio 8 in v4_tiny and 128 in v4_fp8_fp4, a
// hash-routed first layer), with contexts crossing compression-group boundaries while decoding
// (past 4, 8, 128 and 256 tokens) and a batch padded with filler sequences (6 -> 8).
TEST(EngineV4Cuda, GraphDecodeEqualsEagerDecode) {
  if (!engine_on_cuda()) GTEST_SKIP() << "DEEPINFER_ACCELERATOR is not cuda";
  for (const std::string name : {"v4_tiny", "v4_fp8_fp4"}) {
    std::mt19937 rng(26);
    std::vector<Prompt> prompts;
    for (int len : {3, 11, 29, 118, 125, 250}) prompts.push_back(Prompt::from_tokens(random_ids(rng, len)));
    const std::vector<SamplingParams> params(prompts.size(), greedy(24));
    EngineConfig eager_cfg = v4_cuda_config(name);
    eager_cfg.max_num_seqs = 8;
    eager_cfg.enable_prefix_caching = false;
    eager_cfg.enforce_eager = true;
    Engine eager(eager_cfg);
    const auto want = eager.generate(prompts, params);
    EXPECT_EQ(eager.stats().num_graph_steps, 0);
    EngineConfig graph_cfg = eager_cfg;
    graph_cfg.enforce_eager = false;
    Engine graphed(graph_cfg);
    const auto got = graphed.generate(prompts, params);
    EXPECT_GT(graphed.stats().num_graph_steps, 10) << name;
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(want[i].error.empty() && got[i].error.empty()) << want[i].error << got[i].error;
      expect_same(want[i].outputs[0], got[i].outputs[0], name + " graphs vs eager: request " + std::to_string(i));
    }
  }
}

TEST(EngineV4Cuda, RandomWeightsRunBatchedAsAlone) {
  if (!engine_on_cuda()) GTEST_SKIP() << "DEEPINFER_ACCELERATOR is not cuda";
  random_weights_run("cuda");
}

}  // namespace
}  // namespace deepinfer
