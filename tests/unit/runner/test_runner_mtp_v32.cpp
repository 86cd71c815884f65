// DeepSeek-V3.2's MTP layer through the runner (model/deepseek_v32: its block attends over the
// positions its own indexer picks, with caches in both KV groups, latent and indexer keys, one
// more layer in each, addressed by each group's block table). A tiny random V3.2 with an MTP
// layer (tests/unit/spec/v32_mtp.config.json: index_topk 8) over a 40-token prompt: the MTP
// logits of the last row are bit for bit the same whether the prompt and its MTP rows run in
// one step or in two chunks, the second reading the MTP rows of the first from both caches
// (batch-invariant CPU backend: one attention form for any step). Both groups' tables are
// scattered and different, so a pass that wrote or read the wrong group's cache or table differs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "runner/runner.h"

namespace deepinfer {
namespace {

const std::string kConfig = std::string(DEEPINFER_SOURCE_DIR) + "/tests/unit/spec/v32_mtp.config.json";

struct V32Mtp {
  std::unique_ptr<Backend> backend = make_cpu_backend([] {
    BackendOptions o;
    o.num_threads = 1;
    o.batch_invariant = true;
    return o;
  }());
  std::unique_ptr<Model> model;
  std::unique_ptr<Runner> runner;
  V32Mtp() {
    LoadOptions lo;
    lo.random_weights = true;
    lo.seed = 11;
    lo.load_mtp = true;
    model = random_model(kConfig, *backend, lo);
    RunnerConfig rc;
    rc.num_kv_blocks = 8;
    rc.kv_block_size = 16;
    rc.max_num_batched_tokens = 64;
    rc.max_num_seqs = 2;
    rc.max_model_len = 64;
    rc.num_mtp_kv_layers = 1;
    runner = std::make_unique<Runner>(*model, *backend, rc);
  }
  // Target step over tokens [begin, begin + n) of `tokens`, then the MTP rows of positions
  // [begin, min(begin + n, len - 1)) (row p reads t_{p+1}); returns the last row's MTP logits.
  std::vector<float> chunk(const std::vector<int32_t>& tokens, int begin, int n) {
    const std::vector<std::vector<int32_t>> more = {keys_blocks};
    const RunSeq target{tokens, begin, n, latent_blocks, true, 1, more};
    runner->execute(std::span(&target, 1));
    const std::vector<int32_t> next(tokens.begin() + 1, tokens.end());
    const int rows = std::min(begin + n, static_cast<int>(tokens.size()) - 1) - begin;
    const RunSeq pass{next, begin, rows, latent_blocks, true, 1, more};
    std::vector<int32_t> hidden(static_cast<size_t>(rows));
    std::iota(hidden.begin(), hidden.end(), 0);
    runner->run_mtp(std::span(&pass, 1), hidden, true, true);
    const Tensor& l = runner->mtp_logits();
    return std::vector<float>(l.ptr<float>(), l.ptr<float>() + l.size(1));
  }
  const std::vector<int32_t> latent_blocks = {5, 1, 3};
  const std::vector<int32_t> keys_blocks = {2, 6, 0};
};

TEST(RunnerMtp, V32MtpLayerChunkedEqualsOneStepOverBothKvGroups) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back(2 + (i * 53) % 500);
  V32Mtp whole;
  ASSERT_EQ(whole.model->num_mtp_layers(), 1);
  ASSERT_EQ(whole.model->num_mtp_kv_groups(), 2);
  ASSERT_EQ(whole.runner->kv_groups().size(), 2u);
  EXPECT_EQ(whole.runner->kv_groups()[1].num_layers, 4);  // 3 main layers + the MTP layer
  const std::vector<float> one = whole.chunk(tokens, 0, 40);
  V32Mtp split;
  split.chunk(tokens, 0, 17);
  const std::vector<float> two = split.chunk(tokens, 17, 23);
  ASSERT_EQ(one.size(), two.size());
  ASSERT_GT(one.size(), 0u);
  for (size_t i = 0; i < one.size(); ++i) {
    ASSERT_FALSE(std::isnan(one[i])) << i;
    ASSERT_EQ(std::memcmp(&one[i], &two[i], sizeof(float)), 0) << "vocab " << i << ": " << one[i] << " vs " << two[i];
  }
}

}  // namespace
}  // namespace deepinfer
