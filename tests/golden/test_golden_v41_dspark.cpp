// DeepSeek-V4.1's DSpark drafter (model/deepseek_v41/dspark.h) against OUR reference,
// tools/golden/dspark_golden.py (numpy), fixture fixtures/v41_dspark (a tiny random drafter: 3 stages,
// 4 experts top 2, block of 5, Markov rank 8, confidence head; two blocks, one with a context past the
// window of 8). There is no oracle for the drafter: the unmerged transformers PR (deepseek_v41) carries
// its config only and ignores `mtp.*`, so the reference is ours, written from the DSpark paper and
// DeepSpec's code (with SGLang's DeepSeek-V4 DSpark drafter for the V4 block pieces); bench/NOTES.md
// "V4.1 DSpark drafter" says what each piece follows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "io/safetensors.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/dspark.h"
#include "model/deepseek_v41/model.h"
#include "model/deepseek_v41/weights.h"
#include "paged_driver.h"

namespace deepinfer {
namespace {

std::string fixture(const std::string& name) {
  return std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/" + name;
}

// max |a - b| over n floats, relative to max |b|.
double rel_diff(const float* a, const float* b, int64_t n) {
  double diff = 0.0, scale = 1e-30;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

TEST(V41Dspark, ForwardMatchesOurReferenceFromDeepSpec) {
  const std::string dir = fixture("v41_dspark");
  const DeepseekV41Config c = load_deepseek_v41_config(dir);
  auto reader = std::make_shared<const CheckpointReader>(CheckpointReader::open(dir + "/model.safetensors"));
  const CheckpointReader ref = CheckpointReader::open(dir + "/reference.safetensors");
  V41Weights w;
  w.embed = reader->tensor("embed.weight");
  w.head.w = reader->tensor("head.weight");
  load_dspark_weights(c, reader, w);
  ASSERT_TRUE(w.dspark.loaded());
  ASSERT_EQ(w.dspark.stages.size(), 3u);
  ASSERT_TRUE(w.dspark.confidence.w.defined());
  std::unique_ptr<Backend> be = make_cpu_backend();
  DsparkDrafter drafter(c, w, *be);
  const int64_t B = c.dspark_block_size, V = c.base.vocab_size;

  // Context rows of both sequences' verified positions, in one call.
  std::vector<DeviceBuffer> rows;
  drafter.context_rows(ref.tensor("features"), ref.tensor("positions"), rows);
  ASSERT_EQ(rows.size(), 3u);
  for (size_t s = 0; s < rows.size(); ++s) {
    const Tensor want = ref.tensor("context_rows." + std::to_string(s));
    ASSERT_EQ(rows[s].tensor().dims(), want.dims());
    EXPECT_LT(rel_diff(rows[s].tensor().ptr<float>(), want.ptr<float>(), want.numel()), 1e-5) << "stage " << s;
  }

  // Two blocks: sequence 0 has 12 context rows (past the window of 8), sequence 1 has 3.
  const Tensor anchors = ref.tensor("anchors");
  const int64_t n0 = 12, n1 = 3;
  ASSERT_EQ(ref.tensor("positions").numel(), n0 + n1);
  std::vector<DsparkDrafter::Block> blocks(2);
  for (int s = 0; s < drafter.num_stages(); ++s) {
    blocks[0].context.push_back(rows[static_cast<size_t>(s)].tensor().slice_rows(0, n0));
    blocks[1].context.push_back(rows[static_cast<size_t>(s)].tensor().slice_rows(n0, n0 + n1));
  }
  blocks[0].anchor = anchors.ptr<int32_t>()[0];
  blocks[0].anchor_pos = n0;
  blocks[1].anchor = anchors.ptr<int32_t>()[1];
  blocks[1].anchor_pos = n1;
  std::vector<DsparkDrafter::Output> out;
  HostBuffer base;
  drafter.propose(blocks, V, out, &base);

  const Tensor want_base = ref.tensor("base_logits");
  ASSERT_EQ(base.tensor().dims(), want_base.dims());
  EXPECT_LT(rel_diff(base.ptr<float>(), want_base.ptr<float>(), want_base.numel()), 1e-4);
  const Tensor drafts = ref.tensor("drafts"), conf = ref.tensor("confidences");
  ASSERT_EQ(out.size(), 2u);
  for (int64_t b = 0; b < 2; ++b) {
    ASSERT_EQ(static_cast<int64_t>(out[static_cast<size_t>(b)].drafts.size()), B);
    ASSERT_EQ(static_cast<int64_t>(out[static_cast<size_t>(b)].confidences.size()), B);
    for (int64_t i = 0; i < B; ++i) {
      EXPECT_EQ(out[static_cast<size_t>(b)].drafts[static_cast<size_t>(i)], drafts.ptr<int32_t>()[b * B + i])
          << "block " << b << " draft " << i;
      EXPECT_NEAR(out[static_cast<size_t>(b)].confidences[static_cast<size_t>(i)], conf.ptr<float>()[b * B + i],
                  1e-5)
          << "block " << b << " confidence " << i;
    }
  }
  // Drafts restricted to a smaller vocabulary never leave it.
  drafter.propose(blocks, 8, out);
  for (const auto& o : out)
    for (int32_t d : o.drafts) EXPECT_TRUE(d >= 0 && d < 8) << d;
}

// Random weights (--random-weights, benches) carry the drafter where the config declares its layers; a
// sequence with no context yet (its first verified token still to come) drafts from the block alone.
TEST(V41Dspark, RandomWeightsCarryTheDrafter) {
  const DeepseekV41Config c = load_deepseek_v41_config(fixture("v41_dspark"));
  const V41Weights w = random_v41_weights(c, 7, DType::F32);
  ASSERT_TRUE(w.dspark.loaded());
  EXPECT_EQ(w.dspark.stages.size(), 3u);
  EXPECT_EQ(w.dspark.stages[0].experts.size(), static_cast<size_t>(c.dspark_n_routed_experts));
  std::unique_ptr<Backend> be = make_cpu_backend();
  DsparkDrafter drafter(c, w, *be);
  std::vector<DsparkDrafter::Block> blocks(1);
  blocks[0].anchor = 3;
  blocks[0].context.assign(3, Tensor());
  std::vector<DsparkDrafter::Output> out;
  drafter.propose(blocks, c.base.vocab_size, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].drafts.size(), 5u);
  ASSERT_EQ(out[0].confidences.size(), 5u);
  for (float p : out[0].confidences) EXPECT_TRUE(p > 0.0f && p < 1.0f) << p;
  DeepseekV41Config text = c;
  text.base.num_nextn_predict_layers = 0;
  EXPECT_FALSE(random_v41_weights(text, 7, DType::F32).dspark.loaded());
}

// What the model's own steps give the drafter: with the last layer as the tap, the context rows a
// prefill (in two chunks) writes into "dspark_context" are those of the mean over the hc streams
// forward's hidden rows hold, so propose_blocks drafts what the reference-checked drafter drafts
// from them.
TEST(V41Dspark, TheForwardWritesTheContextRowsOfItsTapLayers) {
  DeepseekV41Config c = load_deepseek_v41_config(fixture("v41_dspark"));
  c.dspark_target_layers = {c.num_layers() - 1};
  std::unique_ptr<Backend> be = make_cpu_backend();
  DeepseekV41Model model(c, random_v41_weights(c, 5, DType::F32), *be);
  const V41Weights same = random_v41_weights(c, 5, DType::F32);
  DsparkDrafter ref(c, same, *be);
  ASSERT_EQ(model.draft_block_size(), 5);
  ASSERT_GE(model.draft_kv_group(), 0);
  test::PagedDriver driver(model, *be, 4, 64);
  driver.capture_hidden = true;
  const int seq = driver.add_sequence();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 21; ++i) prompt.push_back((i * 13 + 5) % 60);
  const int64_t H = c.base.hidden_size, hc = c.hc_mult, n = 20;
  std::vector<float> features;
  for (int64_t part = 0; part < 2; ++part) {  // tokens 0..11, then 12..19: chunked prefill
    const int64_t b0 = part == 0 ? 0 : 12, b1 = part == 0 ? 12 : n;
    driver.step({{seq, std::vector<int32_t>(prompt.begin() + b0, prompt.begin() + b1), false}});
    ASSERT_EQ(static_cast<int64_t>(driver.last_hidden.size()), (b1 - b0) * hc * H);
    for (int64_t t = 0; t < b1 - b0; ++t)
      for (int64_t d = 0; d < H; ++d) {
        float acc = 0.0f;
        for (int64_t j = 0; j < hc; ++j) acc += driver.last_hidden[static_cast<size_t>((t * hc + j) * H + d)];
        features.push_back(acc / static_cast<float>(hc));
      }
  }
  HostBuffer f(DType::F32, {n, H}), pos(DType::I32, {n});
  std::copy(features.begin(), features.end(), f.ptr<float>());
  for (int64_t p = 0; p < n; ++p) pos.ptr<int32_t>()[p] = static_cast<int32_t>(p);
  std::vector<DeviceBuffer> rows;
  ref.context_rows(f.tensor(), pos.tensor(), rows);
  std::vector<DsparkDrafter::Block> blocks(1);
  blocks[0].anchor = prompt[static_cast<size_t>(n)];
  blocks[0].anchor_pos = n;
  for (const DeviceBuffer& r : rows) blocks[0].context.push_back(r.tensor());
  std::vector<DsparkDrafter::Output> want, got;
  ref.propose(blocks, c.base.vocab_size, want);
  const std::vector<int32_t>& table = driver.table(seq, model.draft_kv_group());
  const DeepseekV41Model::BlockSeq q{prompt[static_cast<size_t>(n)], n, table};
  model.propose_blocks(std::span(&q, 1), driver.caches(), c.base.vocab_size, got);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].drafts, want[0].drafts);
  ASSERT_EQ(got[0].confidences.size(), want[0].confidences.size());
  for (size_t i = 0; i < want[0].confidences.size(); ++i)
    EXPECT_NEAR(got[0].confidences[i], want[0].confidences[i], 1e-6) << i;
}

}  // namespace
}  // namespace deepinfer
