// Decode through CUDA graphs and asynchronous scheduling gives the tokens of eager,
// one-step-at-a-time decode, on the tiny V3 model (tests/golden/fixtures/v3_tiny, its
// checkpoint weights, token-id prompts). DEEPINFER_ACCELERATOR=cuda runs it on the GPU
// (tools/gpu/run_all.sh, golden stage); on the CPU there are no graphs and it checks the
// asynchronous path on a real model.
//  - batch-invariant kernels: every configuration gives bit-identical logits, so equal
//    greedy and seeded-sampled tokens, with padded graph rows (3, 5, 7 sequences) and
//    sequences finishing at different lengths;
//  - default kernels: a batch that is a graph bucket (8, 1) runs the same kernels per row in
//    both forms, so the tokens are equal too.
#include <gtest/gtest.h>

#include <cstdlib>
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

GenRun generate(bool batch_invariant, bool eager, bool async, const std::vector<Prompt>& prompts,
             const std::vector<SamplingParams>& params) {
  EngineConfig cfg;
  cfg.model_dir = std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/v3_tiny";
  cfg.backend = accelerator();
  cfg.num_threads = 2;
  cfg.batch_invariant = batch_invariant;
  cfg.enforce_eager = eager;
  cfg.async_scheduling = async;
  cfg.kv_block_size = 16;
  cfg.max_num_seqs = 16;
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

}  // namespace
}  // namespace deepinfer
