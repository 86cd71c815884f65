// DeepSeek-V4 golden tests: the CPU forward (model/deepseek_v4) over its paged KV layer
// groups (test::PagedDriver: scattered blocks, window blocks freed and filled with NaN as
// the window moves) against HF transformers 5.17's DeepseekV4ForCausalLM (fp32, eager) on
// tiny random checkpoints made by tools/golden/make_golden.py (v4_golden.py):
// fixtures/v4_* /{config.json, model.safetensors, reference.json}.
//  1. whole-prompt prefill: every position's logits within 1e-4 * max(1, max |oracle|);
//  2. greedy tokens decoded one at a time through the paged cache (window rows, compressed
//     entries, indexer keys, pending compressor inputs, CSA overlap) identical to the
//     oracle's (which recomputes without cache), each 8th step's logits bit-equal to a
//     whole re-prefill's last row, and the window groups holding a bounded number of blocks;
//  3. the prompt in chunks (7, 1, the rest): logits bit-equal to the one-shot prefill's;
//  4. sequences of different lengths and chunkings in one step: bit-equal to each alone.
// The shared expert is clamped as transformers does; DeepSeek's reference leaves it
// unclamped. In these fixtures no shared-expert pre-activation reaches the limit 10, so
// both rules give the same logits (checked: SharedExpertClampDoesNotActHere).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/settings.h"
#include "io/safetensors.h"
#include "model/deepseek_v4/model.h"
#include "model/model.h"
#include "golden_rows.h"
#include "paged_driver.h"
#include "cuda_golden.h"
#include "routing_replay.h"

namespace deepinfer {
namespace {

using test::argmax;
using test::batched_steps;
using test::expect_same_bits;
using test::Rows;

struct V4Reference {
  std::vector<int32_t> prompt, greedy;
  std::vector<std::vector<double>> logits;
};

V4Reference read(const std::string& dir) {
  std::ifstream in(dir + "/reference.json");
  DI_CHECK(in.good(), dir, "/reference.json cannot be opened");
  const nlohmann::json j = nlohmann::json::parse(in);
  return {j.at("prompt_ids").get<std::vector<int32_t>>(), j.at("greedy_ids").get<std::vector<int32_t>>(),
          j.at("logits").get<std::vector<std::vector<double>>>()};
}

std::string fixture(const std::string& name) {
  return std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/" + name;
}

double max_abs(const V4Reference& ref) {
  double m = 1.0;
  for (const auto& row : ref.logits)
    for (double v : row) m = std::max(m, std::fabs(v));
  return m;
}

// max |rows[r] - oracle[first + r]| over the rows.
double worst_diff(const Rows& rows, const V4Reference& ref, int64_t first) {
  double worst = 0.0;
  for (size_t r = 0; r < rows.size(); ++r)
    for (size_t v = 0; v < rows[r].size(); ++v)
      worst = std::max(worst, std::fabs(rows[r][v] - ref.logits[first + r][v]));
  return worst;
}

class GoldenV4 : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ref_ = read(fixture(GetParam()));
    backend_ = make_cpu_backend();
    model_ = load_model(fixture(GetParam()), *backend_);
    v4_ = dynamic_cast<DeepseekV4Model*>(model_.get());
    ASSERT_NE(v4_, nullptr);
  }
  // Every position's logits of `ids` in one step, on a fresh driver.
  Rows prefill(Model& model, const std::vector<int32_t>& ids) {
    test::PagedDriver driver(model, *backend_, kBlockSize);
    return driver.step({{driver.add_sequence(), ids, true}});
  }
  static constexpr int kBlockSize = 4;  // several blocks per compressed group, window blocks freed
  V4Reference ref_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  DeepseekV4Model* v4_ = nullptr;
};

TEST_P(GoldenV4, PrefillLogitsMatchTransformers) {
  const Rows logits = prefill(*v4_, ref_.prompt);
  const double worst = worst_diff(logits, ref_, 0), max_ref = max_abs(ref_);
  std::printf("[golden v4] %s: prefill of %zu tokens, max |logit - oracle| = %.3g (max |oracle| %.3g)\n",
              GetParam().c_str(), ref_.prompt.size(), worst, max_ref);
  EXPECT_LE(worst, 1e-4 * max_ref) << GetParam();
}

TEST_P(GoldenV4, GreedyDecodeThroughThePagedCacheMatchesTransformers) {
  test::PagedDriver driver(*v4_, *backend_, kBlockSize);
  const int seq = driver.add_sequence();
  std::vector<int32_t> ids = ref_.prompt;
  int32_t next = argmax(driver.step({{seq, ref_.prompt, false}})[0]);
  const V4KvLayout& lay = v4_->kv_layout();
  for (size_t step = 0; step < ref_.greedy.size(); ++step) {
    ASSERT_EQ(next, ref_.greedy[step]) << GetParam() << ": greedy step " << step;
    ids.push_back(next);
    const Rows one = driver.step({{seq, {next}, false}});
    next = argmax(one[0]);
    if (step % 8 == 7) {  // the paged decode's logits equal a whole re-prefill's last row
      const Rows all = prefill(*v4_, ids);
      expect_same_bits({all.back()}, one, GetParam() + ": decode vs re-prefill at step " + std::to_string(step));
    }
    // Window groups keep the blocks of their window and the one being written only.
    for (size_t g = 0; g < lay.groups.size(); ++g) {
      const KvGroupSpec& spec = lay.groups[g];
      if (spec.window == 0) continue;
      EXPECT_LE(driver.held_blocks(seq, static_cast<int>(g)), (spec.window - 1 + kBlockSize - 1) / kBlockSize + 2)
          << GetParam() << ": group " << spec.name << " at step " << step;
    }
  }
}

TEST_P(GoldenV4, ChunkedPrefillEqualsOneShot) {
  const int64_t T = static_cast<int64_t>(ref_.prompt.size());
  const Rows whole = prefill(*v4_, ref_.prompt);
  test::PagedDriver driver(*v4_, *backend_, kBlockSize);
  const int seq = driver.add_sequence();
  Rows chunked;
  int64_t first = 0;
  for (int64_t len : {int64_t{7}, int64_t{1}, T - 8}) {
    std::vector<int32_t> chunk(ref_.prompt.begin() + first, ref_.prompt.begin() + first + len);
    for (auto& row : driver.step({{seq, chunk, true}})) chunked.push_back(std::move(row));
    first += len;
  }
  expect_same_bits(whole, chunked, GetParam() + ": chunks 7 + 1 + rest");
  EXPECT_LE(worst_diff(chunked, ref_, 0), 1e-4 * max_abs(ref_)) << GetParam();
}

// Three sequences of different lengths (the prompt, a shorter prefix of it, its reverse)
// computed together, in chunks that differ per sequence and step, decode included: every
// logits row bit-equal to the same sequence's alone in one shot.
TEST_P(GoldenV4, BatchedSequencesEqualEachAlone) {
  const std::vector<int32_t>& p = ref_.prompt;
  const std::vector<std::vector<int32_t>> seqs = {
      p, std::vector<int32_t>(p.begin(), p.begin() + static_cast<long>(p.size() * 2 / 3)), {p.rbegin(), p.rend()}};
  test::PagedDriver driver(*v4_, *backend_, kBlockSize, /*num_blocks=*/160);  // HCA pending: 128-token windows
  const std::vector<Rows> got = batched_steps(driver, seqs);
  for (size_t i = 0; i < seqs.size(); ++i)
    expect_same_bits(prefill(*v4_, seqs[i]), got[i], GetParam() + ": sequence " + std::to_string(i));
}

TEST_P(GoldenV4, SharedExpertClampDoesNotActHere) {
  DeepseekV4Config c = load_deepseek_v4_config(fixture(GetParam()));
  c.clamp_shared_expert = false;  // DeepSeek's reference rule
  auto reader = std::make_shared<const CheckpointReader>(CheckpointReader::open(fixture(GetParam())));
  DeepseekV4Model unclamped(c, load_v4_weights(c, reader), *backend_);
  expect_same_bits(prefill(*v4_, ref_.prompt), prefill(unclamped, ref_.prompt), GetParam());
}

// Routed experts kept packed (FP4 e2m1 bytes + E8M0 scales, as CUDA reads them): the CPU
// reference dequantizes them per call, with the values load-time dequantization gives, so the
// logits are the same bits.
TEST_P(GoldenV4, PackedFp4ExpertsGiveTheSameLogitsOnTheCpu) {
  DeepseekV4Config c = load_deepseek_v4_config(fixture(GetParam()));
  auto reader = std::make_shared<const CheckpointReader>(CheckpointReader::open(fixture(GetParam())));
  V4Weights w = load_v4_weights(c, reader, true, /*packed_fp4=*/true);
  const DType dt = w.layers.front().experts.front().gate.w.dtype;
  if (dt != DType::I8 && dt != DType::U8) GTEST_SKIP() << GetParam() << " has no FP4 experts";
  EXPECT_EQ(w.layers.front().experts.front().gate.scale_inv.dtype, DType::F8_E8M0);
  DeepseekV4Model packed(c, std::move(w), *backend_);
  expect_same_bits(prefill(*v4_, ref_.prompt), prefill(packed, ref_.prompt), GetParam());
}

// The groups v4_tiny declares (layers: window-only, CSA ratio 4, HCA ratio 8; window 6,
// head_dim 32, index_head_dim 16): the real state, nothing allocated for nothing.
TEST(GoldenV4Layout, KvGroupsAreTheAttentionState) {
  auto backend = make_cpu_backend();
  auto model = load_model(fixture("v4_tiny"), *backend);
  struct Want {
    const char* name;
    int layers;
    int64_t row_dim;
    int tokens_per_row, window;
  };
  const std::vector<Want> want = {{"window", 3, 32, 1, 6},      {"csa_entries", 1, 32, 4, 0},
                                  {"indexer_keys", 1, 16, 4, 0}, {"csa_pending", 1, 4 * 32 + 4 * 16, 1, 8},
                                  {"hca_entries", 1, 32, 8, 0},  {"hca_pending", 1, 2 * 32, 1, 8}};
  const std::vector<KvGroupSpec> groups = model->kv_groups();
  ASSERT_EQ(groups.size(), want.size());
  for (size_t g = 0; g < want.size(); ++g) {
    EXPECT_EQ(groups[g].name, want[g].name);
    EXPECT_EQ(groups[g].num_layers, want[g].layers) << want[g].name;
    EXPECT_EQ(groups[g].row_dim, want[g].row_dim) << want[g].name;
    EXPECT_EQ(groups[g].tokens_per_row, want[g].tokens_per_row) << want[g].name;
    EXPECT_EQ(groups[g].window, want[g].window) << want[g].name;
  }
}

// A step without the model's groups (e.g. a runner built for another model) is refused by name.
TEST(GoldenV4Layout, ForwardRefusesMissingKvGroups) {
  auto backend = make_cpu_backend();
  auto model = load_model(fixture("v4_tiny"), *backend);
  KvCaches none;
  StepBatch batch;
  batch.num_tokens = 1;
  HostBuffer logits(DType::F32, {1, model->vocab_size()});
  try {
    model->forward(batch, none, logits.tensor());
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("deepseek_v4 needs its 6 KV groups"), std::string::npos) << e.what();
  }
}

// --- The same model on CUDA (DEEPINFER_ACCELERATOR=cuda, as the V3 golden tests; skipped
// otherwise). Activations are BF16 there (the hyper-connection streams stay F32), so logits
// carry ~1e-2 relative error: the tolerance is 3e-2 * max(1, max |oracle|), as for V3. Every
// step runs on the CPU reference too, which records its MoE routing and CSA indexer top-k;
// CUDA replays them where a near-tie flipped one (routing_replay.h; a larger difference fails).
//  1. whole-prompt prefill vs the oracle;
//  2. the oracle's greedy tokens fed one at a time (teacher-forced, through the paged cache):
//     each oracle token is CUDA's argmax or within the tolerance of it, and every step's
//     logits within the tolerance of the CPU reference's over the same steps;
//  3. chunks 7 + 1 + rest vs the oracle;
//  4. the batch-invariant configuration (no replay): three sequences batched with different
//     chunkings bit-equal to one-shot prefills of each alone.
constexpr double kToleranceBf16 = 3e-2;
// Largest indexer near-tie a replay accepts, relative to the row's largest |score|. V3.2's 0.05
// was too tight here: on the H200 (2026-12-02) v4_fp8_fp4's one-shot prefill kept, in row 30 of
// its first CSA layer, a key scoring 0.0513 below the CPU's k-th (its keys are 16-dim and pass
// through BF16 pending rows, pooling, norm and RoPE before scoring); a wrong selection scores
// far lower than that.
constexpr double kTopkMargin = 0.1;

// (cuda_golden.h: the CPU recording, CUDA replaying, both models, BF16 activations in every GEMM.)
class GoldenV4Cuda : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!test::cuda_goldens_wanted()) GTEST_SKIP() << "DEEPINFER_ACCELERATOR is not cuda";
    ref_ = read(fixture(GetParam()));
    h_.open(fixture(GetParam()), kTopkMargin);
    scale_ = max_abs(ref_);
  }
  void TearDown() override { h_.report("[golden v4] " + GetParam()); }
  void check_prefill_and_decode(const std::string& what);
  static constexpr int kBlockSize = 4;
  V4Reference ref_;
  test::CudaGolden h_;
  double scale_ = 1;
};

// 1 + 2 on h_.gpu_model (what: how its experts are held).
void GoldenV4Cuda::check_prefill_and_decode(const std::string& what) {
  auto p = h_.pair(kBlockSize);
  const int seq = p->cpu.add_sequence();
  ASSERT_EQ(p->gpu.add_sequence(), seq);
  const Rows logits = h_.step(*p, {{seq, ref_.prompt, true}});
  const double worst = worst_diff(logits, ref_, 0);
  std::printf("[golden v4] %s on cuda: prefill max |logit - oracle| = %.3g (max |oracle| %.3g)\n", what.c_str(),
              worst, scale_);
  EXPECT_LE(worst, kToleranceBf16 * scale_) << what;
  h_.teacher_forced(*p, seq, logits.back(), ref_.greedy, kToleranceBf16 * scale_, "[golden v4] " + what);
}

TEST_P(GoldenV4Cuda, PrefillAndTeacherForcedDecodeMatch) { check_prefill_and_decode(GetParam()); }

// The routed experts kept as FP4 e2m1 bytes with E8M0 scales (v4_fp8_fp4 ships them so), read
// packed by CUDA's expert kernels, against the same oracle.
TEST_P(GoldenV4Cuda, PackedFp4ExpertsMatch) {
  DeepseekV4Config c = load_deepseek_v4_config(fixture(GetParam()));
  auto reader = std::make_shared<const CheckpointReader>(CheckpointReader::open(fixture(GetParam())));
  V4Weights w = load_v4_weights(c, reader, true, /*packed_fp4=*/true);
  const DType dt = w.layers.front().experts.front().gate.w.dtype;
  if (dt != DType::I8 && dt != DType::U8) GTEST_SKIP() << GetParam() << " has no FP4 experts";
  h_.gpu_model = std::make_unique<DeepseekV4Model>(c, std::move(w), *h_.rep);
  check_prefill_and_decode(GetParam() + " (packed FP4 experts)");
}

TEST_P(GoldenV4Cuda, ChunkedPrefillMatches) {
  const int64_t T = static_cast<int64_t>(ref_.prompt.size());
  auto p = h_.pair(kBlockSize);
  const int seq = p->cpu.add_sequence();
  ASSERT_EQ(p->gpu.add_sequence(), seq);
  Rows chunked;
  int64_t first = 0;
  for (int64_t len : {int64_t{7}, int64_t{1}, T - 8}) {
    std::vector<int32_t> chunk(ref_.prompt.begin() + first, ref_.prompt.begin() + first + len);
    for (auto& r : h_.step(*p, {{seq, chunk, true}})) chunked.push_back(std::move(r));
    first += len;
  }
  const double worst = worst_diff(chunked, ref_, 0);
  std::printf("[golden v4] %s on cuda: chunks 7 + 1 + rest, max |logit - oracle| = %.3g\n", GetParam().c_str(), worst);
  EXPECT_LE(worst, kToleranceBf16 * scale_) << GetParam();
}

TEST_P(GoldenV4Cuda, BatchInvariantChunksAndBatchesEqualAlone) {
  auto model = load_model(fixture(GetParam()), *h_.gpu_inv);
  auto prefill = [&](const std::vector<int32_t>& ids) {
    test::PagedDriver d(*model, *h_.gpu_inv, kBlockSize);
    return d.step({{d.add_sequence(), ids, true}});
  };
  const std::vector<int32_t>& p = ref_.prompt;
  const std::vector<std::vector<int32_t>> seqs = {
      p, std::vector<int32_t>(p.begin(), p.begin() + static_cast<long>(p.size() * 2 / 3)), {p.rbegin(), p.rend()}};
  test::PagedDriver driver(*model, *h_.gpu_inv, kBlockSize, /*num_blocks=*/160);
  const std::vector<Rows> got = batched_steps(driver, seqs);
  for (size_t i = 0; i < seqs.size(); ++i)
    expect_same_bits(prefill(seqs[i]), got[i],
                     GetParam() + " on cuda (batch-invariant): sequence " + std::to_string(i));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenV4, ::testing::Values("v4_tiny", "v4_fp8_fp4"));
INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenV4Cuda, ::testing::Values("v4_tiny", "v4_fp8_fp4"));

}  // namespace
}  // namespace deepinfer
