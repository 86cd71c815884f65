// DeepSeek-V4.1 golden tests: the CPU forward (model/deepseek_v41) over its paged KV layer groups
// (test::PagedDriver: scattered blocks, window blocks freed and filled with NaN as the window
// moves) against THE UNMERGED TRANSFORMERS PR "Add DeepSeek-V4.1 (deepseek_v41) text model"
// (src/transformers/models/deepseek_v41/, in no transformers release; fp32, eager, through its
// cache) on tiny random checkpoints made by tools/golden/v41_golden.py: fixtures/v41_tiny/ (BF16,
// the PR's names) and fixtures/v41_fp8_fp4/ (the released names and formats: FP8 32x32 dense
// linears, FP4 experts, Engram as v41_engram below with FP8 tables and an E8M0 scale per row and 32
// channels; the oracle ran on the dequantized values). Every V4.1 layer kind is in it
// (window only; ratio-2 KV + index sources and a layer reading them; a second ratio-2 group; the
// ratio-1 KV source that is the candidate source; a layer reading it; an index source reusing its
// keys inside its candidate blocks); prompt 40 tokens, window 8. fixtures/v41_engram/ is v41_tiny's
// schedule (4 experts) with Engram on layers 1 and 5 (2- to 4-grams, 2 heads, BF16 tables of 304 and
// 462 rows, the compressed token map of a word-level tokenizer whose tokens collapse under the PR's
// normalisation as engram_token_map.safetensors): the Engram code of the same UNMERGED PR made it
// (its build_compressed_token_map, numpy-PCG64 multipliers, DeepseekV41NgramHashState, DeepseekV41Engram);
// the oracle's logits move by up to 9.5 with Engram skipped (reference.json checks).
//  1. whole-prompt prefill: every position's logits within 1e-4 * max(1, max |oracle|);
//  2. greedy tokens decoded one at a time through the paged cache identical to the oracle's, each
//     8th step's logits bit-equal to a whole re-prefill's last row, window groups holding a bounded
//     number of blocks;
//  3. the prompt in chunks (7, 1, 9, the rest): logits bit-equal to the one-shot prefill's;
//  4. sequences of different lengths and chunkings in one step: bit-equal to each alone.
// GoldenV41Cuda (DEEPINFER_ACCELERATOR=cuda; skipped otherwise): the same fixtures on the CUDA
// backend, BF16 activations as V4's (the hyper-connection streams, router logits and indexer
// scores F32; the FP8 32x32 linears dequantized to BF16 exactly, see DeepseekV41Model::
// upload_weights), tolerance 6e-2 * max(1, max |oracle|), 0.11 for v41_tiny (tolerance_bf16 says why);
// each step also runs on the CPU reference, which records its MoE routing, indexer top-k
// (topk_finite) and candidate blocks, and CUDA replays them where a near-tie flipped one
// (routing_replay.h; a larger difference fails):
//  1. whole-prompt prefill vs the oracle, then the oracle's greedy tokens (32, 16, 24) fed one at a time
//     through the paged cache: each one CUDA's argmax or within the tolerance of it, each step's
//     logits within the tolerance of the CPU's;
//  2. chunks 7 + 1 + 9 + rest vs the oracle;
//  3. batch-invariant configuration (no replay): three sequences batched with different chunkings
//     bit-equal to one-shot prefills of each alone.
// GoldenV41Bf16Emulation (CPU, always): the CUDA harness with the CPU reference under BF16 emulation
// (bf16_emulation.h) in CUDA's place: it reaches the oracle within tolerance_bf16 and no closer than
// 1e-2 (the evidence that CUDA's distance from the oracle is its BF16 storage's).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/backend.h"
#include "golden_rows.h"
#include "model/deepseek_v41/model.h"
#include "model/model.h"
#include "paged_driver.h"
#include "cuda_golden.h"

namespace deepinfer {
namespace {

using test::argmax;
using test::expect_same_bits;
using test::Rows;

struct Reference {
  std::vector<int32_t> prompt, greedy;
  std::vector<std::vector<double>> logits;
};

std::string fixture(const std::string& name) {
  return std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/" + name;
}

Reference read(const std::string& dir) {
  std::ifstream in(dir + "/reference.json");
  DI_CHECK(in.good(), dir, "/reference.json cannot be opened");
  const nlohmann::json j = nlohmann::json::parse(in);
  return {j.at("prompt_ids").get<std::vector<int32_t>>(),
          j.at("greedy_ids").get<std::vector<int32_t>>(),
          j.at("logits").get<std::vector<std::vector<double>>>()};
}

double max_ref(const Reference& ref) {
  double m = 1.0;
  for (const auto& row : ref.logits)
    for (double v : row) m = std::max(m, std::fabs(v));
  return m;
}

// max |rows[r] - oracle[r]| over the rows.
double worst_diff(const Rows& rows, const Reference& ref) {
  double worst = 0.0;
  for (size_t r = 0; r < rows.size(); ++r)
    for (size_t v = 0; v < rows[r].size(); ++v) worst = std::max(worst, std::fabs(rows[r][v] - ref.logits[r][v]));
  return worst;
}

class GoldenV41 : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ref_ = read(fixture(GetParam()));
    backend_ = make_cpu_backend();
    model_ = load_model(fixture(GetParam()), *backend_);
    ASSERT_NE(dynamic_cast<DeepseekV41Model*>(model_.get()), nullptr);
  }
  Rows prefill(const std::vector<int32_t>& ids) {
    test::PagedDriver driver(*model_, *backend_, kBlockSize);
    return driver.step({{driver.add_sequence(), ids, true}});
  }
  double max_ref() const { return deepinfer::max_ref(ref_); }
  double worst_diff(const Rows& rows) const { return deepinfer::worst_diff(rows, ref_); }
  static constexpr int kBlockSize = 4;  // several blocks per window and compressed group
  Reference ref_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
};

TEST_P(GoldenV41, PrefillLogitsMatchThePrOracle) {
  const Rows logits = prefill(ref_.prompt);
  const double worst = worst_diff(logits);
  std::printf(
      "[golden v41] %s: prefill of %zu tokens, max |logit - oracle| = %.3g (max |oracle| %.3g)\n",
      GetParam().c_str(), ref_.prompt.size(), worst, max_ref());
  EXPECT_LE(worst, 1e-4 * max_ref());
}

TEST_P(GoldenV41, GreedyDecodeThroughThePagedCacheMatchesThePrOracle) {
  test::PagedDriver driver(*model_, *backend_, kBlockSize);
  const int seq = driver.add_sequence();
  std::vector<int32_t> ids = ref_.prompt;
  int32_t next = argmax(driver.step({{seq, ref_.prompt, false}})[0]);
  const std::vector<KvGroupSpec> groups = model_->kv_groups();
  for (size_t step = 0; step < ref_.greedy.size(); ++step) {
    ASSERT_EQ(next, ref_.greedy[step]) << "greedy step " << step;
    ids.push_back(next);
    const Rows one = driver.step({{seq, {next}, false}});
    next = argmax(one[0]);
    if (step % 8 == 7) {
      const Rows all = prefill(ids);
      expect_same_bits({all.back()}, one, "decode vs re-prefill at step " + std::to_string(step));
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      if (groups[g].window == 0) continue;
      EXPECT_LE(driver.held_blocks(seq, static_cast<int>(g)),
                (groups[g].window - 1 + kBlockSize - 1) / kBlockSize + 2)
          << "group " << groups[g].name << " at step " << step;
    }
  }
}

TEST_P(GoldenV41, ChunkedPrefillEqualsOneShot) {
  const int64_t T = static_cast<int64_t>(ref_.prompt.size());
  const Rows whole = prefill(ref_.prompt);
  test::PagedDriver driver(*model_, *backend_, kBlockSize);
  const int seq = driver.add_sequence();
  Rows chunked;
  int64_t first = 0;
  for (int64_t len : {int64_t{7}, int64_t{1}, int64_t{9}, T - 17}) {
    std::vector<int32_t> chunk(ref_.prompt.begin() + first, ref_.prompt.begin() + first + len);
    for (auto& row : driver.step({{seq, chunk, true}})) chunked.push_back(std::move(row));
    first += len;
  }
  expect_same_bits(whole, chunked, "chunks 7 + 1 + 9 + rest");
  EXPECT_LE(worst_diff(chunked), 1e-4 * max_ref());
}

TEST_P(GoldenV41, BatchedSequencesEqualEachAlone) {
  const std::vector<int32_t>& p = ref_.prompt;
  const std::vector<std::vector<int32_t>> seqs = {
      p,
      std::vector<int32_t>(p.begin(), p.begin() + static_cast<long>(p.size() * 2 / 3)),
      {p.rbegin(), p.rend()}};
  test::PagedDriver driver(*model_, *backend_, kBlockSize, /*num_blocks=*/96);
  const std::vector<Rows> got = test::batched_steps(driver, seqs);
  for (size_t i = 0; i < seqs.size(); ++i)
    expect_same_bits(prefill(seqs[i]), got[i], "sequence " + std::to_string(i));
}

// Random weights from the fixture's config (BF16 and FP8 block-scaled linears): every tensor the
// loader reads is in v41_random_specs, the logits are finite, chunked prefill equals one-shot.
TEST_P(GoldenV41, RandomWeightsLoadAndRun) {
  for (DType dt : {DType::BF16, DType::F8_E4M3}) {
    LoadOptions o;
    o.seed = 11;
    o.random_weight_dtype = dt;
    std::unique_ptr<Model> m = random_model(fixture(GetParam()) + "/config.json", *backend_, o);
    test::PagedDriver whole(*m, *backend_, kBlockSize), parts(*m, *backend_, kBlockSize);
    const Rows a = whole.step({{whole.add_sequence(), ref_.prompt, true}});
    const int seq = parts.add_sequence();
    Rows b = parts.step({{seq, {ref_.prompt.begin(), ref_.prompt.begin() + 13}, true}});
    for (auto& row : parts.step({{seq, {ref_.prompt.begin() + 13, ref_.prompt.end()}, true}}))
      b.push_back(row);
    for (const auto& row : a)
      for (float v : row) ASSERT_TRUE(std::isfinite(v)) << dtype_name(dt);
    expect_same_bits(a, b, std::string("random ") + std::string(dtype_name(dt)));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenV41, ::testing::Values("v41_tiny", "v41_fp8_fp4", "v41_engram"));

// Tolerances of V4.1 on CUDA, from the H200 runs of 2026-12-03 (13:52 and 13:58 UTC,
// bench/results/2026-12-03-v41cuda), twice V4's: BF16 GEMM inputs feed V4.1's fake-quantized formats
// (FP8 window KV and FP4 compressed KV / indexer queries and keys with E8M0 or e4m3 block scales),
// whose rounding steps turn BF16-level differences into whole FP4 / FP8 steps (a scale crossing a
// power of two re-rounds a whole block). Measured: with routing and top-k replayed, prefill max
// |logit - oracle| 0.543 (v41_fp8_fp4, max |oracle| 10.7) and 0.520 (v41_engram, 10.4), i.e. 5.1% and
// 5.0%, each teacher-forced step within 0.588 of the CPU's, 16/16 and 22/24 oracle tokens CUDA's
// argmax. V4's 3e-2 failed; 6e-2 is the measured 5.1% plus a little, not a derived bound.
// v41_tiny (BF16 weights, 8 experts) is more sensitive: on the H200 (2026-12-03 15:05 UTC) 0.881 of
// 9.22 (9.6%), 30/32 tokens, steps within 0.78 of the CPU's. The CPU reference under BF16 emulation
// (bf16_emulation.h: BF16 storage at CUDA's rounding points and nothing else of CUDA's kernels, same
// replay; GoldenV41Bf16Emulation below) lands at the same place: 0.881 of 9.22, 30/32 tokens, steps
// within 0.782 of the CPU's, 214 of 360 top-k rows replayed (largest gap 0.395), routing gap 0.0447;
// and at 0.559 / 0.520 for the other two (CUDA: 0.543 / 0.520). So CUDA's distance is the BF16
// storage's, not a kernel bug; v41_tiny's tolerance is its emulated 9.6% plus a little.
double tolerance_bf16(const std::string& fixture_name) { return fixture_name == "v41_tiny" ? 0.11 : 6e-2; }
// Largest top-k / candidate-block near-tie a replay accepts, relative to the row's largest |score|.
// V4's 0.1 (test_golden_v4.cpp) is too tight here: with one E8M0 scale per 32-value key
// (index_head_dim 32), a BF16-level change of a key's amax across a power of two halves or doubles
// its scale; replayed gaps reached 0.395 (v41_tiny), 0.306, 0.337. A kept entry outside the CPU's
// visible / candidate ones still fails at any margin.
constexpr double kTopkMargin = 0.5;
// Largest routing gap (choice-score units) a replay accepts: V4's 0.02 failed on v41_tiny (layer 5,
// token 3: 0.0447, the expert scores moved by the FP4 / FP8 re-rounding above); the other fixtures'
// largest was 0.0126. (v41_tiny's run past that point is not measured yet.)
constexpr double kRoutingMargin = 0.05;

// The replay harness (cuda_golden.h) with CUDA (Emulated false: skipped unless
// DEEPINFER_ACCELERATOR=cuda) or the CPU reference under BF16 emulation (true: always) as the device.
template <bool Emulated>
class GoldenV41Harness : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!Emulated && !test::cuda_goldens_wanted()) GTEST_SKIP() << "DEEPINFER_ACCELERATOR is not cuda";
    ref_ = read(fixture(GetParam()));
    if (Emulated)
      h_.open_emulated(fixture(GetParam()), kTopkMargin, kRoutingMargin);
    else
      h_.open(fixture(GetParam()), kTopkMargin, kRoutingMargin);
    scale_ = max_ref(ref_);
  }
  void TearDown() override { h_.report("[golden v41] " + GetParam()); }
  // Whole-prompt prefill (its max |logit - oracle| returned), then the oracle's greedy tokens
  // teacher-forced within tolerance_bf16 (cuda_golden.h's teacher_forced).
  double prefill_then_teacher_forced() {
    auto p = h_.pair(kBlockSize);
    const int seq = p->cpu.add_sequence();
    EXPECT_EQ(p->gpu.add_sequence(), seq);
    const Rows logits = h_.step(*p, {{seq, ref_.prompt, true}});
    const double worst = worst_diff(logits, ref_);
    std::printf("[golden v41] %s on %s: prefill of %zu tokens, max |logit - oracle| = %.3g (max |oracle| %.3g)\n",
                GetParam().c_str(), h_.label.c_str(), ref_.prompt.size(), worst, scale_);
    h_.teacher_forced(*p, seq, logits.back(), ref_.greedy, tolerance_bf16(GetParam()) * scale_,
                      "[golden v41] " + GetParam());
    return worst;
  }
  static constexpr int kBlockSize = 4;
  Reference ref_;
  test::CudaGolden h_;
  double scale_ = 1;
};
using GoldenV41Cuda = GoldenV41Harness<false>;
// The CUDA harness with the CPU reference under BF16 emulation in CUDA's place (bf16_emulation.h:
// activations stored BF16 where CUDA stores them, F32 linears rounded as the uploader does), no GPU.
using GoldenV41Bf16Emulation = GoldenV41Harness<true>;

TEST_P(GoldenV41Cuda, PrefillAndTeacherForcedDecodeMatch) {
  EXPECT_LE(prefill_then_teacher_forced(), tolerance_bf16(GetParam()) * scale_);
}

TEST_P(GoldenV41Cuda, ChunkedPrefillMatches) {
  const int64_t T = static_cast<int64_t>(ref_.prompt.size());
  auto p = h_.pair(kBlockSize);
  const int seq = p->cpu.add_sequence();
  ASSERT_EQ(p->gpu.add_sequence(), seq);
  Rows chunked;
  int64_t first = 0;
  for (int64_t len : {int64_t{7}, int64_t{1}, int64_t{9}, T - 17}) {
    std::vector<int32_t> chunk(ref_.prompt.begin() + first, ref_.prompt.begin() + first + len);
    for (auto& r : h_.step(*p, {{seq, chunk, true}})) chunked.push_back(std::move(r));
    first += len;
  }
  const double worst = worst_diff(chunked, ref_);
  std::printf("[golden v41] %s on cuda: chunks 7 + 1 + 9 + rest, max |logit - oracle| = %.3g\n", GetParam().c_str(),
              worst);
  EXPECT_LE(worst, tolerance_bf16(GetParam()) * scale_);
}

TEST_P(GoldenV41Cuda, BatchInvariantChunksAndBatchesEqualAlone) {
  auto model = load_model(fixture(GetParam()), *h_.gpu_inv);
  auto prefill = [&](const std::vector<int32_t>& ids) {
    test::PagedDriver d(*model, *h_.gpu_inv, kBlockSize);
    return d.step({{d.add_sequence(), ids, true}});
  };
  const std::vector<int32_t>& p = ref_.prompt;
  const std::vector<std::vector<int32_t>> seqs = {
      p, std::vector<int32_t>(p.begin(), p.begin() + static_cast<long>(p.size() * 2 / 3)), {p.rbegin(), p.rend()}};
  test::PagedDriver driver(*model, *h_.gpu_inv, kBlockSize, /*num_blocks=*/96);
  const std::vector<Rows> got = test::batched_steps(driver, seqs);
  for (size_t i = 0; i < seqs.size(); ++i)
    expect_same_bits(prefill(seqs[i]), got[i], GetParam() + " on cuda (batch-invariant): sequence " + std::to_string(i));
}

TEST_P(GoldenV41Bf16Emulation, PrefillAndTeacherForcedDecode) {
  // A correct implementation with CUDA's BF16 storage reaches the tolerance GoldenV41Cuda holds
  // CUDA to (and the F32 CPU reference is 1e-4 from the oracle: the distance is the storage's).
  const double worst = prefill_then_teacher_forced();
  EXPECT_LE(worst, tolerance_bf16(GetParam()) * scale_);
  EXPECT_GT(worst, 1e-2 * scale_) << "the emulation rounds nothing? (it is as close as the F32 reference)";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenV41Bf16Emulation, ::testing::Values("v41_tiny", "v41_fp8_fp4", "v41_engram"));

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenV41Cuda, ::testing::Values("v41_tiny", "v41_fp8_fp4", "v41_engram"));

}  // namespace
}  // namespace deepinfer
