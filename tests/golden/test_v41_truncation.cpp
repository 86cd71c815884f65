// DeepSeek-V4.1 prefill truncation ("bounded replay", model/deepseek_v41/truncation.h; issue 19
// item 3) on the CPU: the layers above the last KV source run only on a prompt's last `keep` rows.
// The reference is the same model with truncation off, whose forward matches THE UNMERGED
// TRANSFORMERS PR's deepseek_v41 (test_golden_v41.cpp). fixtures/v41_tiny: 7 layers, the last KV
// source is layer 4, so layers 5 and 6 are truncated; window 8: a keep of at least
// 2 x (8 - 1) + 1 = 15 is exact, the floor is 8 + 2 x (dspark_block_size + 1) (here set to 1: 12).
// Prompts of 80 and 96 tokens (ten and more times the window), caches filled with NaN first so a
// read of a row no step wrote shows.
//  1. keep >= 15: the last prompt row's logits and 12 greedy tokens decoded through the cache are
//     bit-equal to full prefill's;
//  2. keep 12 (below 15): they differ (outputs differ from full prefill's below the exact keep);
//  3. chunked prefill (chunks below, across and above the floor) equals one-shot prefill, exact
//     keep or not; every kept row's logits are finite (no read below the floor); several
//     sequences with different floors in one step equal each alone;
//  4. a keep below the floor, an unknown mode and Engram above the last KV source are refused
//     naming the variable / field; logits asked below the floor are refused; mode off (and a
//     prompt no longer than keep) leave the forward as it was; with the DSpark drafter loaded,
//     compact truncation drafts what full prefill drafts (exact keep);
//  5. (TruncationV41Cuda) 1. on CUDA, batch-invariant.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/backend.h"
#include "core/error.h"
#include "core/settings.h"
#include "golden_rows.h"
#include "io/safetensors.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/model.h"
#include "model/deepseek_v41/truncation.h"
#include "model/deepseek_v41/weights.h"
#include "model/model.h"
#include "paged_driver.h"

namespace deepinfer {
namespace {

using test::argmax;
using test::expect_same_bits;
using test::PagedDriver;
using test::Rows;

std::string fixture(const std::string& name) {
  return std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/" + name;
}

DeepseekV41Config tiny_config(const std::string& name = "v41_tiny") {
  std::ifstream in(fixture(name) + "/config.json");
  nlohmann::json root = nlohmann::json::parse(in);
  root["text_config"]["dspark_block_size"] = 1;  // backtracking 4: floor 8 + 4 = 12
  return parse_deepseek_v41_config(root, fixture(name) + "/config.json");
}

std::vector<int32_t> prompt(int n, uint32_t seed) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    ids.push_back(static_cast<int32_t>(2 + (seed >> 8) % 254));
  }
  return ids;
}

class TruncationV41 : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = make_cpu_backend();
    init();
  }
  void init() {
    config_ = tiny_config();
    reader_ = std::make_shared<const CheckpointReader>(CheckpointReader::open(fixture("v41_tiny")));
    full_ = make("off", 140);
  }
  std::unique_ptr<DeepseekV41Model> make(const std::string& mode, int64_t keep) {
    return std::make_unique<DeepseekV41Model>(config_, load_v41_weights(config_, reader_),
                                              *backend_,
                                              v41_prefill_truncation(config_, mode, keep));
  }
  // Prefill of `ids` in chunks of `sizes` (the rest last), then `steps` greedy tokens: the last
  // prompt row's logits and each decode step's.
  Rows run(Model& m, const std::vector<int32_t>& ids, int64_t keep, std::vector<int> sizes = {},
           int steps = 12) {
    PagedDriver d(m, *backend_, kBlockSize, 192);
    d.fill_nan();
    const int seq = d.add_sequence();
    const int n = static_cast<int>(ids.size());
    const int floor = keep > 0 && n > keep ? n - static_cast<int>(keep) : 0;
    int first = 0;
    sizes.push_back(n);
    Rows out;
    for (int len : sizes) {
      len = std::min(len, n - first);
      if (len <= 0) break;
      const bool last = first + len == n;
      PagedDriver::Chunk c{
          seq, {ids.begin() + first, ids.begin() + first + len}, false, last, floor};
      Rows r = d.step({c});
      if (last) out.push_back(r.at(0));
      first += len;
    }
    for (int s = 0; s < steps; ++s) {
      for (float v : out.back()) EXPECT_TRUE(std::isfinite(v)) << "step " << s;
      const int32_t next = argmax(out.back());
      out.push_back(d.step({{seq, {next}, false, true, floor}}).at(0));
    }
    return out;
  }
  void check_exact_keep();
  static constexpr int kBlockSize = 4;
  std::unique_ptr<Backend> backend_;
  DeepseekV41Config config_;
  std::shared_ptr<const CheckpointReader> reader_;
  std::unique_ptr<DeepseekV41Model> full_;
};

TEST_F(TruncationV41, SettingsResolveForTheTinySchedule) {
  const V41PrefillTruncation t = v41_prefill_truncation(config_, "compact", 12);
  EXPECT_TRUE(t.active());
  EXPECT_EQ(t.first_layer, 5);
  EXPECT_EQ(t.floor, 12);       // window 8 + 2 x (1 + 1)
  EXPECT_EQ(t.exact_keep, 15);  // 2 layers x 7 + 1
  EXPECT_EQ(t.exact_lag, 7);    // 1 x 7
  EXPECT_EQ(t.row_floor(80), 68);
  EXPECT_EQ(t.row_floor(12), 0);
  EXPECT_FALSE(v41_prefill_truncation(config_, "off", 12).active());
  // The released schedule: 40 layers, sources up to 20, window 128, DSpark blocks of 5.
  nlohmann::json released = {{"model_type", "deepseek_v41"}};
  const DeepseekV41Config r = parse_deepseek_v41_config(released, "released");
  const V41PrefillTruncation rt = v41_prefill_truncation(r, "compact", 140);
  EXPECT_EQ(rt.first_layer, 21);
  EXPECT_EQ(rt.floor, 140);
  EXPECT_EQ(rt.exact_keep, 19 * 127 + 1);
}

void TruncationV41::check_exact_keep() {
  for (int n : {80, 96}) {
    const std::vector<int32_t> ids = prompt(n, static_cast<uint32_t>(n));
    const Rows want = run(*full_, ids, 0);
    for (int64_t keep : {15, 16, 23}) {
      auto m = make("compact", keep);
      expect_same_bits(want, run(*m, ids, keep),
                       backend_->name() + ": prompt " + std::to_string(n) + ", keep " + std::to_string(keep));
    }
  }
}

TEST_F(TruncationV41, ExactKeepEqualsFullPrefill) { check_exact_keep(); }

// The same on CUDA (DEEPINFER_ACCELERATOR=cuda; skipped otherwise) in the batch-invariant
// configuration, whose rows do not depend on how many share a step: the truncated layers' compacted
// steps then give full prefill's bits.
class TruncationV41Cuda : public TruncationV41 {
 protected:
  void SetUp() override {
    if (env_settings().get_string("DEEPINFER_ACCELERATOR") != "cuda") GTEST_SKIP() << "DEEPINFER_ACCELERATOR is not cuda";
    BackendOptions o;
    o.cuda = cuda_options(env_settings());
    o.batch_invariant = true;
    backend_ = make_cuda_backend(o);
    ASSERT_NE(backend_, nullptr) << "DEEPINFER_ACCELERATOR=cuda but deepinfer was built without CUDA";
    init();
  }
};

TEST_F(TruncationV41Cuda, ExactKeepEqualsFullPrefill) { check_exact_keep(); }

TEST_F(TruncationV41, KeepBelowTheExactOneDiffersFromFullPrefill) {
  const std::vector<int32_t> ids = prompt(80, 80);
  const Rows want = run(*full_, ids, 0, {}, 0);
  for (int64_t keep : {12, 14}) {  // 14: one row short of the exact keep
    auto m = make("compact", keep);
    const Rows got = run(*m, ids, keep, {}, 0);
    double diff = 0;
    for (size_t v = 0; v < want[0].size(); ++v)
      diff = std::max(diff, static_cast<double>(std::fabs(want[0][v] - got[0][v])));
    std::printf("[v41 truncation] keep %lld of 80 (exact from 15): max |logit - full| = %.3g\n",
                static_cast<long long>(keep), diff);
    EXPECT_GT(diff, 0.0) << "keep " << keep;
  }
}

TEST_F(TruncationV41, ChunkedPrefillEqualsOneShot) {
  const std::vector<int32_t> ids = prompt(80, 7);
  for (int64_t keep : {12, 15}) {
    auto m = make("compact", keep);
    const Rows whole = run(*m, ids, keep);
    // floor 68 (65): a chunk wholly below it, one across it, single rows, the rest above.
    expect_same_bits(whole, run(*m, ids, keep, {30, 36, 1, 5}), "keep " + std::to_string(keep));
    expect_same_bits(whole, run(*m, ids, keep, {67, 1, 1}), "keep " + std::to_string(keep));
  }
}

// Every kept row's logits are finite: no truncated layer reads a window row below the floor (the
// caches start as NaN; a read there makes the rows just above the floor NaN).
TEST_F(TruncationV41, KeptRowsReadNoRowBelowTheFloor) {
  const std::vector<int32_t> ids = prompt(80, 21);
  for (int64_t keep : {12, 15}) {
    auto m = make("compact", keep);
    PagedDriver d(*m, *backend_, kBlockSize, 192);
    d.fill_nan();
    const int seq = d.add_sequence(), floor = 80 - static_cast<int>(keep);
    EXPECT_TRUE(d.step({{seq, {ids.begin(), ids.begin() + floor}, false, false, floor}}).empty());
    const Rows kept = d.step({{seq, {ids.begin() + floor, ids.end()}, true, true, floor}});
    ASSERT_EQ(kept.size(), static_cast<size_t>(keep));
    for (size_t r = 0; r < kept.size(); ++r)
      for (float v : kept[r])
        ASSERT_TRUE(std::isfinite(v)) << "keep " << keep << ", kept row " << r;
  }
}

TEST_F(TruncationV41, SequencesWithDifferentFloorsInOneStepEqualEachAlone) {
  auto m = make("compact", 12);
  const std::vector<int32_t> a = prompt(80, 3), b = prompt(30, 4), c = prompt(10, 5);
  PagedDriver d(*m, *backend_, kBlockSize, 256);
  d.fill_nan();
  const int sa = d.add_sequence(), sb = d.add_sequence(), sc = d.add_sequence();
  // Step 1: a's first 40 rows (all below its floor 68, no logits), b whole (floor 18), c whole.
  Rows r = d.step({{sa, {a.begin(), a.begin() + 40}, false, false, 68},
                   {sb, b, false, true, 18},
                   {sc, c, false, true, 0}});
  ASSERT_EQ(r.size(), 2u);
  expect_same_bits({run(*m, b, 12, {}, 0)[0]}, {r[0]}, "b");
  expect_same_bits({run(*m, c, 12, {}, 0)[0]}, {r[1]}, "c");
  // Step 2: the rest of a beside a decode step of b.
  r = d.step(
      {{sa, {a.begin() + 40, a.end()}, false, true, 68}, {sb, {argmax(r[0])}, false, true, 18}});
  expect_same_bits({run(*m, a, 12, {}, 0)[0]}, {r[0]}, "a");
  expect_same_bits({run(*m, b, 12, {}, 1)[1]}, {r[1]}, "b decode");
}

TEST_F(TruncationV41, BadSettingsAreRefusedNamingTheVariable) {
  try {
    v41_prefill_truncation(config_, "compact", 11);
    FAIL() << "keep 11 below the floor accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("DEEPINFER_YOCO_PREFILL_KEEP_TOKENS=11"), std::string::npos) << msg;
    EXPECT_NE(msg.find("floor 12"), std::string::npos) << msg;
  }
  try {
    v41_prefill_truncation(config_, "yes", 140);
    FAIL() << "mode 'yes' accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE='yes'"),
              std::string::npos)
        << e.what();
  }
  // Through the loader (LoadOptions, as the engine passes the environment).
  LoadOptions o;
  o.prefill_truncation_mode = "compact";
  o.prefill_keep_tokens = 19;  // the fixture's DSpark blocks of 5: floor 8 + 12 = 20
  EXPECT_THROW(load_model(fixture("v41_tiny"), *backend_, o), Error);
  // v41_engram has an Engram layer (5) above its last KV source (4).
  o.prefill_keep_tokens = 140;
  try {
    load_model(fixture("v41_engram"), *backend_, o);
    FAIL() << "Engram above the last KV source accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("engram_layer_ids"), std::string::npos) << e.what();
  }
  o.prefill_truncation_mode = "off";
  EXPECT_NO_THROW(load_model(fixture("v41_engram"), *backend_, o));
}

// Compact truncation with the DSpark drafter: the drafter's context rows are written for the kept
// rows only, and a block reads its last window - 1 positions, all above the floor. v41_tiny's
// schedule with three random drafter stages added, tapping layer 1 (below the truncation) and layer
// 5 (the first truncated layer: its rows from floor + 7 on are exact at keep 15). After an 80-token
// prompt (one shot, and in chunks below / across / above the floor 65), the drafts and confidences
// equal those of the untruncated model's bit for bit; at keep 12 (inexact) they are still finite
// (no NaN context row read: the caches start as NaN). The layout still declares the drafter's group.
TEST_F(TruncationV41, CompactWithTheDrafterDraftsAsFullPrefill) {
  std::ifstream in(fixture("v41_tiny") + "/config.json");
  nlohmann::json root = nlohmann::json::parse(in);
  nlohmann::json& t = root["text_config"];
  t["dspark_block_size"] = 1;
  t["num_nextn_predict_layers"] = 3;
  t["dspark_target_layer_ids"] = {1, 5};
  t["dspark_markov_rank"] = 8;
  t["dspark_noise_token_id"] = 63;
  t["dspark_n_routed_experts"] = 4;
  t["dspark_num_experts_per_tok"] = 2;
  const DeepseekV41Config c = parse_deepseek_v41_config(root, fixture("v41_tiny") + "/config.json");
  const V41Weights w = random_v41_weights(c, 7, DType::F32);
  auto build = [&](const std::string& mode, int64_t keep) {
    return std::make_unique<DeepseekV41Model>(c, w, *backend_, v41_prefill_truncation(c, mode, keep));
  };
  ASSERT_TRUE(v41_prefill_truncation(c, "compact", 15).active()) << "nothing to truncate: the test proves nothing";
  ASSERT_EQ(v41_prefill_truncation(c, "compact", 15).first_layer, 5);
  const std::vector<int32_t> ids = prompt(80, 33);
  // Prefill in chunks (the rest last), then one block of drafts after the greedy anchor.
  auto drafts = [&](DeepseekV41Model& m, int floor, std::vector<int> sizes) {
    PagedDriver d(m, *backend_, kBlockSize, 192);
    d.fill_nan();
    const int seq = d.add_sequence();
    sizes.push_back(80);
    int first = 0;
    Rows last;
    for (int len : sizes) {
      len = std::min(len, 80 - first);
      if (len <= 0) break;
      const bool end = first + len == 80;
      Rows r = d.step({{seq, {ids.begin() + first, ids.begin() + first + len}, false, end, floor}});
      if (end) last = r;
      first += len;
    }
    const DeepseekV41Model::BlockSeq q{argmax(last.at(0)), 80, d.table(seq, m.draft_kv_group())};
    std::vector<DsparkDrafter::Output> out;
    m.propose_blocks(std::span(&q, 1), d.caches(), c.base.vocab_size, out);
    EXPECT_EQ(out.size(), 1u);
    return out.empty() ? DsparkDrafter::Output{} : out[0];
  };
  auto full = build("off", 140);
  const DsparkDrafter::Output want = drafts(*full, 0, {});
  ASSERT_FALSE(want.drafts.empty());
  auto compact = build("compact", 15);
  for (const std::vector<int>& sizes : {std::vector<int>{}, {30, 36, 1, 5}, {64, 2}}) {
    const DsparkDrafter::Output got = drafts(*compact, 65, sizes);
    EXPECT_EQ(got.drafts, want.drafts) << "chunks " << sizes.size();
    ASSERT_EQ(got.confidences.size(), want.confidences.size());
    for (size_t i = 0; i < want.confidences.size(); ++i)
      EXPECT_EQ(std::bit_cast<uint32_t>(got.confidences[i]), std::bit_cast<uint32_t>(want.confidences[i]))
          << "draft " << i << ", chunks " << sizes.size();
  }
  auto rough = build("compact", 12);
  for (float p : drafts(*rough, 68, {}).confidences) EXPECT_TRUE(std::isfinite(p)) << p;
  bool drafter_kv = false;
  for (const KvGroupSpec& g : compact->kv_groups()) drafter_kv = drafter_kv || g.name == "dspark_context";
  EXPECT_TRUE(drafter_kv);
}

// A step's temporaries: each sequence's gathered entries, keys and scores (they grow with its
// context) go back once its attention is issued, so a decode step of four sequences of 480 tokens
// peaks about where one sequence's does, not four times as high (V4.1-Flash at batch 64 x 128k
// asked for a 36 GiB arena before). The step-sized buffers (four rows instead of one) stay.
TEST_F(TruncationV41, StepPeakDoesNotGrowWithTheBatchsContexts) {
  auto m = make("off", 140);
  auto peak = [&](int nseqs) {
    PagedDriver d(*m, *backend_, kBlockSize, 1400);
    std::vector<PagedDriver::Chunk> prefill, decode;
    for (int i = 0; i < nseqs; ++i) {
      const int seq = d.add_sequence();
      prefill.push_back({seq, prompt(480, 40 + i), false, true, 0});
      decode.push_back({seq, {5}, false, true, 0});
    }
    d.step(prefill);
    d.step(decode);
    return m->step_peak_bytes();
  };
  const size_t one = peak(1), four = peak(4);
  // One ratio-1 layer's gathered rows of one sequence: 480 entries x head_dim F32 (120 KiB).
  const size_t rows = 480 * static_cast<size_t>(config_.head_dim) * sizeof(float);
  std::printf("[v41 arena] decode step peak: %zu B with one sequence, %zu B with four (%zu B of rows per "
              "sequence and layer)\n", one, four, rows);
  EXPECT_GT(one, rows) << "the step gathered less than one layer's rows: the test proves nothing";
  EXPECT_LT(four, one + 2 * rows);
}

TEST_F(TruncationV41, LogitsBelowTheFloorAreRefused) {
  auto m = make("compact", 12);
  PagedDriver d(*m, *backend_, kBlockSize, 192);
  const std::vector<int32_t> ids = prompt(40, 9);
  try {
    d.step({{d.add_sequence(), ids, true, true, 28}});
    FAIL() << "logits below the floor returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("replay floor"), std::string::npos) << e.what();
  }
}

TEST_F(TruncationV41, OffAndShortPromptsLeaveTheForwardAsItWas) {
  const std::vector<int32_t> ids = prompt(80, 11);
  const Rows want = run(*full_, ids, 0, {}, 4);
  auto off = make("off", 12);
  EXPECT_EQ(off->prefill_truncation().keep, 0);
  expect_same_bits(want, run(*off, ids, 0, {}, 4), "mode off");
  auto compact = make("compact", 80);  // keep = the prompt: floor 0
  EXPECT_EQ(compact->prefill_truncation().keep, 80);
  EXPECT_EQ(compact->prefill_truncation().exact_lag, 7);
  expect_same_bits(want, run(*compact, ids, 80, {}, 4), "keep = prompt length");
}

}  // namespace
}  // namespace deepinfer
