// Decode through CUDA graphs and asynchronous scheduling gives the tokens of eager,
// one-step-at-a-time decode, on the tiny V3 model (tests/golden/fixtures/v3_tiny, its
// checkpoint weights, token-id prompts). DEEPINFER_ACCELERATOR=cuda runs it on the GPU
// (tools/gpu/run_all.sh, golden stage); on the CPU there are no graphs and it checks the
// asynchronous path on a real model.
//  - batch-invariant kernels: every configuration gives bit-identical logits, so equal
//    greedy and seeded-sampled tokens, with padded graph rows (3, 5, 7 sequences) and
//    sequences finishing at different lengths;
//  - default kernels: a batch that is a graph bucket (8, 1) runs the same kernels per row in
//    both forms, so the tokens are equal too;
//  - DeepSeek-V3.2 (v32_tiny): the indexer and sparse attention in decode graphs;
//  - speculative verify steps (1 + k tokens per sequence) through graphs, on the embedded
//    model with its MTP layer: batch-invariant, k = 1 and 3 with graphs give the tokens and
//    logprobs of eager k = 0 (on CUDA, most steps replay a verify graph).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "core/settings.h"
#include "deepinfer/engine.h"

namespace deepinfer {
namespace {

std::string accelerator() {
  return env_settings().get_string("DEEPINFER_ACCELERATOR") == "cuda" ? "cuda" : "cpu";
}

struct GenRun {
  std::vector<RequestOutput> outputs;
  EngineStats stats;
};

// The tests' engine: `model` under the source tree, on the accelerator.
EngineConfig test_config(const std::string& model, bool batch_invariant, bool eager) {
  EngineConfig cfg;
  cfg.model_dir = std::string(DEEPINFER_SOURCE_DIR) + "/" + model;
  cfg.backend = accelerator();
  cfg.num_threads = 2;
  cfg.batch_invariant = batch_invariant;
  cfg.enforce_eager = eager;
  cfg.kv_block_size = 16;
  cfg.max_num_seqs = 16;
  cfg.num_speculative_tokens = 0;  // graphs and async of plain decode (v3_tiny has an MTP layer)
  return cfg;
}

GenRun generate(bool batch_invariant, bool eager, bool async, const std::vector<Prompt>& prompts,
             const std::vector<SamplingParams>& params,
             const std::string& model = "tests/golden/fixtures/v3_tiny") {
  EngineConfig cfg = test_config(model, batch_invariant, eager);
  cfg.async_scheduling = async;
  Engine engine(cfg);
  GenRun r;
  r.outputs = engine.generate(prompts, params);
  r.stats = engine.stats();
  return r;
}

std::vector<Prompt> prompts(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Prompt> out;
  for (int i = 0; i < count; ++i) {
    std::vector<int32_t> ids(3 + rng() % 40);
    for (auto& t : ids) t = 2 + static_cast<int32_t>(rng() % 500);
    out.push_back(Prompt::from_tokens(ids));
  }
  return out;
}

void expect_same_tokens(const GenRun& want, const GenRun& got, const std::string& what) {
  ASSERT_EQ(want.outputs.size(), got.outputs.size());
  for (size_t i = 0; i < want.outputs.size(); ++i) {
    ASSERT_TRUE(want.outputs[i].error.empty()) << want.outputs[i].error;
    EXPECT_EQ(want.outputs[i].outputs[0].token_ids, got.outputs[i].outputs[0].token_ids)
        << what << ", request " << i;
  }
}

TEST(GraphDecode, BatchInvariantGraphsAndAsyncEqualEager) {
  for (int batch : {3, 5, 7}) {
    const auto ps = prompts(batch, 100 + batch);
    std::vector<SamplingParams> params;
    for (int i = 0; i < batch; ++i) {
      SamplingParams p;
      p.temperature = i == 1 ? 0.7f : 0.0f;  // one seeded sampled row (the logits path)
      p.seed = 77;
      p.max_tokens = 12 + 5 * i;  // finish at different steps: the batch shrinks
      p.ignore_eos = true;
      params.push_back(p);
    }
    const GenRun want = generate(true, true, false, ps, params);
    const GenRun graphs = generate(true, false, false, ps, params);
    const GenRun both = generate(true, false, true, ps, params);
    expect_same_tokens(want, graphs, "graphs, batch " + std::to_string(batch));
    expect_same_tokens(want, both, "graphs + async, batch " + std::to_string(batch));
    EXPECT_EQ(want.stats.num_graph_steps, 0);
    if (accelerator() == "cuda") {
      EXPECT_GT(graphs.stats.num_graph_steps, 10);
    }
    EXPECT_GT(both.stats.num_steps_ahead, 0);
  }
}

// DeepSeek-V3.2 (v32_tiny: index_topk 8, so decode drops positions from context 9 on): the
// indexer (scores over the paged key cache, top-k) and the sparse attention replay in decode
// graphs; batch-invariant kernels give eager's tokens with padded graph rows (5 sequences in
// bucket 8) and a shrinking batch.
TEST(GraphDecode, V32SparseAttentionGraphsEqualEager) {
  const std::string model = "tests/golden/fixtures/v32_tiny";
  const auto ps = prompts(5, 321);
  std::vector<SamplingParams> params;
  for (int i = 0; i < 5; ++i) {
    SamplingParams p;
    p.temperature = i == 2 ? 0.7f : 0.0f;
    p.seed = 11;
    p.max_tokens = 10 + 7 * i;
    p.ignore_eos = true;
    params.push_back(p);
  }
  const GenRun want = generate(true, true, false, ps, params, model);
  const GenRun graphs = generate(true, false, true, ps, params, model);
  expect_same_tokens(want, graphs, "v32 graphs + async");
  EXPECT_EQ(want.stats.num_graph_steps, 0);
  if (accelerator() == "cuda") {
    EXPECT_GT(graphs.stats.num_graph_steps, 20);
  }
}

TEST(GraphDecode, DefaultKernelsOnBucketBatchesEqualEager) {
  for (int batch : {1, 8}) {
    const auto ps = prompts(batch, 7 + batch);
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = 40;
    p.ignore_eos = true;
    const std::vector<SamplingParams> params(1, p);
    const GenRun want = generate(false, true, false, ps, params);
    const GenRun got = generate(false, false, true, ps, params);
    expect_same_tokens(want, got, "batch " + std::to_string(batch));
    if (accelerator() == "cuda") {
      EXPECT_GE(got.stats.num_graph_steps, 38);
    }
    EXPECT_GE(got.stats.num_steps_ahead, 30);
  }
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(GraphDecode, BatchInvariantVerifyGraphsEqualEagerDecode) {
  auto run = [](int k, bool eager, EngineStats* st, int varlen = 0) {
    EngineConfig cfg = test_config("models/deepseek-v3-tiny-code", true, eager);
    cfg.max_model_len = 512;
    cfg.num_speculative_tokens = k;
    cfg.spec_varlen = varlen;
    Engine engine(cfg);
    std::vector<Prompt> ps;
    for (const char* t : {"def fibonacci(n):\n", "import os\nimport sys\n", "for i in range(10):\n"})
      ps.push_back(Prompt::from_text(t));
    std::vector<SamplingParams> params;
    for (int i = 0; i < 3; ++i) {
      SamplingParams p;
      p.temperature = i == 1 ? 0.8f : 0.0f;  // one seeded sampled request
      p.seed = 5;
      p.max_tokens = 48;
      p.ignore_eos = true;
      p.logprobs = 1;
      params.push_back(p);
    }
    auto out = engine.generate(ps, params);
    *st = engine.stats();
    return out;
  };
  EngineStats st0;
  const auto want = run(0, true, &st0);
  for (int k : {1, 3}) {
    EngineStats st;
    const auto got = run(k, false, &st);
    ASSERT_EQ(want.size(), got.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(got[i].error.empty()) << got[i].error;
      const CompletionOutput &a = want[i].outputs[0], &b = got[i].outputs[0];
      ASSERT_EQ(a.token_ids, b.token_ids) << "k " << k << " request " << i;
      ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
      for (size_t t = 0; t < a.logprobs.size(); ++t)
        ASSERT_EQ(bits(a.logprobs[t].logprob), bits(b.logprobs[t].logprob)) << "k " << k << " request " << i << " token " << t;
    }
    EXPECT_GT(st.spec.num_accepted_tokens, 0) << "k " << k;
    // Drafts from graphed MTP passes (padded rows included) are the eager passes' drafts:
    // batch-invariant kernels, so the same acceptance position by position.
    EngineStats eager;
    run(k, true, &eager);
    EXPECT_EQ(st.spec.accepted_per_position, eager.spec.accepted_per_position) << "k " << k;
    EXPECT_EQ(st.spec.drafts_per_position, eager.spec.drafts_per_position) << "k " << k;
    EXPECT_EQ(eager.num_graph_steps, 0);
    if (accelerator() == "cuda") {
      // Steady steps have 1 + k tokens per sequence (3 sequences, bucket 4) and replay a
      // graph; eager: the prompt step, each shape's first step, and the tail where drafts
      // are cut by max_tokens unevenly.
      EXPECT_GT(st.num_graph_steps, st.num_steps / 3) << "k " << k << ": " << st.num_graph_steps << " of "
                                                      << st.num_steps << " steps replayed a graph";
    }
  }
  // Confidence-scheduled lengths from the step times measured at the first steps on the
  // graphed verify shapes, chained MTP passes issued without a host wait between them: the
  // same tokens and logprob bits again (whatever lengths and depths the table chose); also
  // for the engine's default (k and the length left unset: 3, scheduled).
  for (int k : {3, -1}) {
    EngineStats sv;
    const auto varlen = run(k, false, &sv, k < 0 ? -1 : 1);
    const std::string what = k < 0 ? "default" : "varlen";
    ASSERT_EQ(want.size(), varlen.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(varlen[i].error.empty()) << varlen[i].error;
      const CompletionOutput &a = want[i].outputs[0], &b = varlen[i].outputs[0];
      ASSERT_EQ(a.token_ids, b.token_ids) << what << " request " << i;
      ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
      for (size_t t = 0; t < a.logprobs.size(); ++t)
        ASSERT_EQ(bits(a.logprobs[t].logprob), bits(b.logprobs[t].logprob)) << what << " request " << i << " token " << t;
    }
    EXPECT_EQ(sv.num_speculative_tokens, 3) << what;
    EXPECT_EQ(sv.spec_varlen, 1) << what;
    ASSERT_FALSE(sv.spec_step_times.empty()) << what;
    EXPECT_EQ(sv.spec_step_times.max_tokens_per_seq, 4);
    EXPECT_EQ(sv.spec_step_times.mixed_s.empty(), accelerator() != "cuda");  // graphs: mixed steps measured
  }
}

}  // namespace
}  // namespace deepinfer

namespace deepinfer {
namespace {

// Drafts in flight (issue 13 item 2): with asynchronous scheduling, verify step N + 1 is issued
// before step N is read, its drafts made on the device (MTP passes graphed: the first one over
// 1 + k rows of every sequence) and its layout fixed up there. Batch-invariant: the tokens of
// eager synchronous k = 0, greedy and seeded sampled (sampled on the device), 7 sequences
// (a padded graph bucket), finishing at different lengths.
TEST(GraphDecode, BatchInvariantVerifyStepsAheadEqualEagerDecode) {
  auto run = [](int k, bool eager, bool async, EngineStats* st) {
    EngineConfig cfg = test_config("models/deepseek-v3-tiny-code", true, eager);
    cfg.max_model_len = 512;
    cfg.num_speculative_tokens = k;
    cfg.spec_varlen = 0;
    cfg.async_scheduling = async;
    Engine engine(cfg);
    std::vector<Prompt> ps;
    std::vector<SamplingParams> params;
    const char* texts[] = {"def fibonacci(n):\n", "import os\nimport sys\n", "for i in range(10):\n"};
    for (int i = 0; i < 7; ++i) {
      ps.push_back(Prompt::from_text(texts[i % 3]));
      SamplingParams p;
      p.temperature = i % 2 == 1 ? 0.8f : 0.0f;
      p.seed = 5 + static_cast<uint64_t>(i);
      p.max_tokens = 30 + 6 * i;
      p.ignore_eos = true;
      params.push_back(p);
    }
    auto out = engine.generate(ps, params);
    *st = engine.stats();
    return out;
  };
  EngineStats st0;
  const auto want = run(0, true, false, &st0);
  for (int k : {1, 3}) {
    EngineStats st, sync;
    const auto got = run(k, false, true, &st);
    run(k, false, false, &sync);
    ASSERT_EQ(want.size(), got.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(got[i].error.empty()) << got[i].error;
      EXPECT_EQ(want[i].outputs[0].token_ids, got[i].outputs[0].token_ids) << "k " << k << " request " << i;
    }
    EXPECT_GT(st.num_spec_steps_ahead, st.num_steps / 2) << "k " << k << ": " << st.num_spec_steps_ahead << " of "
                                                         << st.num_steps << " steps issued ahead";
    // The device's drafts are the synchronous engine's (batch-invariant kernels, graphed or not).
    EXPECT_EQ(st.spec.accepted_per_position, sync.spec.accepted_per_position) << "k " << k;
    if (accelerator() == "cuda") {
      EXPECT_GT(st.num_graph_steps, st.num_steps / 2) << "k " << k;
      EXPECT_GT(st.num_mtp_graph_runs, st.num_spec_steps_ahead / 2) << "k " << k << ": first MTP passes not graphed";
    }
  }
}

}  // namespace
}  // namespace deepinfer
