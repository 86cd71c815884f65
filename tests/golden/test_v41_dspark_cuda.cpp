// DeepSeek-V4.1's DSpark drafter on CUDA (issue 19 item 4; model/deepseek_v41/dspark.h). Skipped
// unless DEEPINFER_ACCELERATOR=cuda. The same tiny random V4.1 with its drafter
// (fixtures/v41_dspark/config.json: 4 layers, window 8, 3 drafter stages of 4 experts top 2, block of
// 5, Markov rank 8, confidence head, vocab 64) on the CPU reference and on CUDA (BF16 activations):
//  - V41DsparkCuda.ProposalsMatchTheCpu: two sequences (21 and 9 tokens, prefilled in chunks, one past
//    the window) write their drafter context rows through the target's steps on both backends, then
//    one propose_blocks each. MoE routing and the indexer's top-k are recorded on the CPU and replayed
//    on CUDA where a near-tie flipped (routing_replay.h, the V4.1 goldens' margins). Compared: the
//    base logits within kToleranceBf16 of the CPU's (max |diff| / max |cpu|: the V4.1 CUDA goldens'
//    BF16 tolerance, the drafter's blocks being V4.1 blocks); each block's drafts equal the CPU's up
//    to a first difference, which must be a near-tie of the CPU's Markov sums (the gap between the two
//    ids at most kDraftTieMargin x the row's largest |sum|: each side may move by the logits'
//    tolerance); the drafts after a difference are conditioned on another token and not compared;
//    the confidences up to and including that position within kConfidenceTol.
//  - SpecEngineV41DsparkCuda.GreedyAndSeededSamplingEqualNoSpeculation: the engine on CUDA with the
//    batch-invariant kernels (verify steps of k + 1 rows then give the bits of k = 0's one-row steps):
//    token ids and logprob bits of k = 5, k = 2 and confidence-scheduled lengths equal k = 0's,
//    greedy and seeded sampling, batch of four prompts chunked by 16.
// The parity of the drafter's two heads (markov_argmax, dspark_confidence) is tests/ops/
// test_ops_dspark.cpp, compiled into this binary too (one binary for a device run).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/settings.h"
#include "cuda_golden.h"
#include "deepinfer/engine.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/model.h"
#include "model/deepseek_v41/weights.h"
#include "paged_driver.h"
#include "routing_replay.h"
#include "tests/unit/spec/spec_fixture.h"

namespace deepinfer {
namespace {

const std::string kDir = std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/v41_dspark";

// The V4.1 CUDA goldens' (test_golden_v41.cpp: measured on the H200, 2026-12-03).
constexpr double kToleranceBf16 = 6e-2, kTopkMargin = 0.5, kRoutingMargin = 0.05;
constexpr double kDraftTieMargin = 2 * kToleranceBf16;
// A probability: sigmoid's slope is at most 1/4, so this allows the confidence logit to move by 0.2,
// BF16 h rows through three V4.1 blocks (not a derived bound; the run prints the largest seen).
constexpr double kConfidenceTol = 0.05;

TEST(V41DsparkCuda, ProposalsMatchTheCpu) {
  if (!test::cuda_goldens_wanted()) GTEST_SKIP() << "DEEPINFER_ACCELERATOR is not cuda";
  const DeepseekV41Config c = load_deepseek_v41_config(kDir);
  BackendOptions o;
  o.cuda = cuda_options(env_settings());
  o.cuda.fp8_act_min_rows = std::numeric_limits<int64_t>::max();
  std::unique_ptr<Backend> gpu = make_cuda_backend(o), cpu = make_cpu_backend();
  ASSERT_NE(gpu, nullptr) << "DEEPINFER_ACCELERATOR=cuda but deepinfer was built without CUDA";
  test::RoutingLog log;
  test::RoutingReplayBackend rec(*cpu, log, test::RoutingReplayBackend::Mode::Record);
  test::RoutingReplayBackend rep(*gpu, log, test::RoutingReplayBackend::Mode::Replay, kRoutingMargin, kTopkMargin);
  const V41Weights ref = random_v41_weights(c, 5, DType::F32);  // host copy: the Markov sums below
  DeepseekV41Model cm(c, random_v41_weights(c, 5, DType::F32), rec);
  DeepseekV41Model gm(c, random_v41_weights(c, 5, DType::F32), rep);
  ASSERT_EQ(gm.draft_block_size(), 5);
  test::PagedDriver dc(cm, rec, 4, 64), dg(gm, rep, 4, 64);
  auto both = [&](const std::vector<test::PagedDriver::Chunk>& chunks) {
    log.clear_calls();
    dc.step(chunks);
    dg.step(chunks);
    EXPECT_EQ(log.next, log.calls.size()) << "CUDA made fewer routing calls than the CPU";
  };
  std::vector<std::vector<int32_t>> prompts(2);
  for (int i = 0; i < 22; ++i) prompts[0].push_back((i * 13 + 5) % 60);
  for (int i = 0; i < 10; ++i) prompts[1].push_back((i * 7 + 2) % 60);
  const int n0 = 21, n1 = 9;  // computed tokens; the next one is the anchor
  for (size_t s = 0; s < 2; ++s) {
    ASSERT_EQ(dc.add_sequence(), static_cast<int>(s));
    ASSERT_EQ(dg.add_sequence(), static_cast<int>(s));
  }
  using V = std::vector<int32_t>;
  both({{0, V(prompts[0].begin(), prompts[0].begin() + 12), false}, {1, V(prompts[1].begin(), prompts[1].begin() + 5), false}});
  both({{0, V(prompts[0].begin() + 12, prompts[0].begin() + n0), false}, {1, V(prompts[1].begin() + 5, prompts[1].begin() + n1), false}});

  auto seqs = [&](test::PagedDriver& d, const DeepseekV41Model& m) {
    std::vector<DeepseekV41Model::BlockSeq> q;
    q.push_back({prompts[0][n0], n0, d.table(0, m.draft_kv_group())});
    q.push_back({prompts[1][n1], n1, d.table(1, m.draft_kv_group())});
    return q;
  };
  const std::vector<DeepseekV41Model::BlockSeq> qc = seqs(dc, cm), qg = seqs(dg, gm);
  std::vector<DsparkDrafter::Output> want, got;
  HostBuffer base_c, base_g;
  log.clear_calls();
  cm.propose_blocks(qc, dc.caches(), c.base.vocab_size, want, &base_c);
  gm.propose_blocks(qg, dg.caches(), c.base.vocab_size, got, &base_g);
  EXPECT_EQ(log.next, log.calls.size()) << "CUDA's drafter made fewer routing calls than the CPU's";

  const int64_t B = c.dspark_block_size, Vn = c.base.vocab_size, r = c.dspark_markov_rank;
  ASSERT_EQ(base_g.tensor().dims(), base_c.tensor().dims());
  double diff = 0, scale = 1e-30;
  for (int64_t i = 0; i < base_c.tensor().numel(); ++i) {
    ASSERT_FALSE(std::isnan(base_g.ptr<float>()[i])) << "CUDA base logit " << i << " is NaN";
    diff = std::max(diff, std::fabs(double(base_g.ptr<float>()[i]) - base_c.ptr<float>()[i]));
    scale = std::max(scale, std::fabs(double(base_c.ptr<float>()[i])));
  }
  std::printf("[dspark cuda] base logits: max |cuda - cpu| %.3g (max |cpu| %.3g, %.2f%%)\n", diff, scale,
              100 * diff / scale);
  EXPECT_LE(diff, kToleranceBf16 * scale);

  ASSERT_EQ(got.size(), 2u);
  int exact = 0, compared = 0;
  double conf_diff = 0;
  for (size_t b = 0; b < 2; ++b) {
    ASSERT_EQ(static_cast<int64_t>(want[b].drafts.size()), B) << "random weights give finite logits";
    ASSERT_EQ(got[b].drafts.size(), want[b].drafts.size()) << "block " << b;
    ASSERT_EQ(got[b].confidences.size(), got[b].drafts.size()) << "block " << b;
    for (int64_t i = 0; i < B; ++i) {
      const int32_t dw = want[b].drafts[static_cast<size_t>(i)], dg2 = got[b].drafts[static_cast<size_t>(i)];
      ++compared;
      conf_diff = std::max(conf_diff, std::fabs(double(got[b].confidences[static_cast<size_t>(i)]) -
                                                want[b].confidences[static_cast<size_t>(i)]));
      EXPECT_NEAR(got[b].confidences[static_cast<size_t>(i)], want[b].confidences[static_cast<size_t>(i)],
                  kConfidenceTol)
          << "block " << b << " confidence " << i;
      if (dw == dg2) {
        ++exact;
        continue;
      }
      // The CPU's Markov sums of this row: base + markov_w2 · markov_w1[prev] (prev: the anchor,
      // then the previous draft, the same on both sides up to here).
      const int32_t prev = i == 0 ? qc[b].anchor : want[b].drafts[static_cast<size_t>(i - 1)];
      const float* row = base_c.ptr<float>() + (static_cast<int64_t>(b) * B + i) * Vn;
      auto sum = [&](int32_t v) {
        double acc = row[v];
        for (int64_t k = 0; k < r; ++k)
          acc += double(ref.dspark.markov_w2.w.ptr<float>()[v * r + k]) * ref.dspark.markov_w1.ptr<float>()[prev * r + k];
        return acc;
      };
      double top = 0;
      for (int32_t v = 0; v < Vn; ++v) top = std::max(top, std::fabs(sum(v)));
      EXPECT_LE(sum(dw) - sum(dg2), kDraftTieMargin * top)
          << "block " << b << " draft " << i << ": CUDA's " << dg2 << " is no near-tie of the CPU's " << dw;
      break;  // the later drafts follow another token
    }
  }
  std::printf("[dspark cuda] drafts: %d of %d compared equal the CPU's; confidences within %.3g\n", exact, compared,
              conf_diff);
}

// --- The engine on CUDA: speculative decoding with the drafter keeps the tokens.
EngineConfig engine_config(int k, int varlen = 0) {
  EngineConfig c;
  c.random_weights_config = kDir + "/config.json";
  c.random_weights_seed = 11;
  c.backend = "cuda";
  c.batch_invariant = true;
  c.kv_block_size = 16;
  c.num_kv_blocks = 256;
  c.max_model_len = 160;
  c.max_num_batched_tokens = 16;  // prompts prefill in chunks
  c.num_speculative_tokens = k;
  c.spec_varlen = varlen;
  return c;
}

TEST(SpecEngineV41DsparkCuda, GreedyAndSeededSamplingEqualNoSpeculation) {
  if (!test::cuda_goldens_wanted()) GTEST_SKIP() << "DEEPINFER_ACCELERATOR is not cuda";
  const std::vector<Prompt> prompts = spec_test::token_prompts({20, 37, 60, 9}, 7, 3, 60);
  const std::vector<SamplingParams> sp = {spec_test::seeded(0, 0, 20), spec_test::seeded(0.8f, 101, 20),
                                          spec_test::seeded(0, 0, 20), spec_test::seeded(1.0f, 103, 20)};
  const auto base = spec_test::run(engine_config(0), prompts, sp);
  for (int k : {5, 2}) {
    EngineStats st;
    spec_test::expect_same(base, spec_test::run(engine_config(k), prompts, sp, &st), "cuda k=" + std::to_string(k));
    EXPECT_GT(st.spec.num_draft_tokens, 0) << "k=" << k;
    std::printf("[dspark cuda] engine k=%d: %lld drafts, %lld accepted\n", k,
                static_cast<long long>(st.spec.num_draft_tokens), static_cast<long long>(st.spec.num_accepted_tokens));
  }
  EngineStats st;
  spec_test::expect_same(base, spec_test::run(engine_config(5, 1), prompts, sp, &st), "cuda k=5 scheduled");
  EXPECT_GT(st.spec.num_draft_tokens, 0);
}

}  // namespace
}  // namespace deepinfer
