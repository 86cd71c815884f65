// Runner::run_mtp on the CPU backend with a recording model: drafts are the argmax over
// the first sample_vocab columns (a padding column's larger logit is never drafted), the
// host logits come back only when asked, and hidden inputs are gathered from the target
// step's rows or, chained, from the previous pass's output rows.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/error.h"
#include "model/config.h"
#include "model/model.h"
#include "runner/runner.h"

namespace deepinfer {
namespace {

constexpr int kVocab = 64, kHidden = 4;

// Target forward: hidden row t = 10 t + 1. MTP forward: records column 0 of its hidden
// inputs, hidden_out = hidden_in + 100, logits row r: 10 at column r + 1, 20 at the last
// (padding) column, 0 elsewhere.
class MtpRecordingModel final : public Model {
 public:
  MtpRecordingModel() {
    config_.vocab_size = kVocab;
    config_.hidden_size = kHidden;
    config_.max_position_embeddings = 256;
  }
  const ModelConfig& config() const override { return config_; }
  std::vector<KvGroupSpec> kv_groups() const override {
    KvGroupSpec g;
    g.name = "latent";
    g.num_layers = 1;
    g.row_dim = 2;
    return {g};
  }
  int vocab_size() const override { return kVocab; }
  int num_mtp_layers() const override { return 1; }
  void forward(const StepBatch& b, KvCaches&, Tensor& logits, Tensor* hidden_out) override {
    std::fill(logits.ptr<float>(), logits.ptr<float>() + logits.numel(), 0.0f);
    if (hidden_out == nullptr) return;
    for (int t = 0; t < b.num_tokens; ++t)
      for (int h = 0; h < kHidden; ++h) hidden_out->ptr<float>()[t * kHidden + h] = 10.0f * t + 1.0f;
  }
  void mtp_forward(const StepBatch& b, std::span<Tensor>, const Tensor& hidden_in, Tensor& hidden_out,
                   Tensor& logits) override {
    seen.clear();
    seen_tokens.assign(b.token_ids.ptr<int32_t>(), b.token_ids.ptr<int32_t>() + b.num_tokens);
    for (int t = 0; t < b.num_tokens; ++t) {
      seen.push_back(hidden_in.ptr<float>()[t * kHidden]);
      for (int h = 0; h < kHidden; ++h)
        hidden_out.ptr<float>()[t * kHidden + h] = hidden_in.ptr<float>()[t * kHidden + h] + 100.0f;
    }
    float* l = logits.ptr<float>();
    std::fill(l, l + logits.numel(), 0.0f);
    for (int64_t r = 0; r < logits.size(0); ++r) {
      l[r * kVocab + r + 1] = 10.0f;
      l[r * kVocab + kVocab - 1] = 20.0f;
    }
  }
  std::vector<float> seen;
  std::vector<int32_t> seen_tokens;

 private:
  ModelConfig config_;
};

struct MtpFixture {
  std::unique_ptr<Backend> backend = make_cpu_backend([] {
    BackendOptions o;
    o.num_threads = 1;
    return o;
  }());
  MtpRecordingModel model;
  std::unique_ptr<Runner> runner;
  explicit MtpFixture(int sample_vocab) {
    RunnerConfig rc;
    rc.num_kv_blocks = 8;
    rc.kv_block_size = 4;
    rc.max_num_batched_tokens = 32;
    rc.max_num_seqs = 4;
    rc.max_model_len = 16;
    rc.num_mtp_kv_layers = 1;
    rc.sample_vocab = sample_vocab;
    runner = std::make_unique<Runner>(model, *backend, rc);
  }
};

TEST(RunnerMtp, DraftsFromSampleVocabLogitsOnlyWhenAskedChainedHidden) {
  MtpFixture f(60);  // columns 60..63 are padding
  const std::vector<int32_t> a = {5, 6, 7}, b = {8, 9}, blocks_a = {1}, blocks_b = {2};
  // Target step: a's 3 tokens (hidden rows 0..2), b's 2 (rows 3, 4).
  std::vector<RunSeq> target = {{a, 0, 3, blocks_a, true}, {b, 0, 2, blocks_b, true}};
  f.runner->execute(target);
  // MTP pass over a's positions 0, 1 and b's 0, hidden from target rows 0, 1 and 3.
  const std::vector<int32_t> next_a = {6, 7, 40}, next_b = {9, 41};
  std::vector<RunSeq> pass1 = {{next_a, 0, 2, blocks_a, true, 1}, {next_b, 0, 1, blocks_b, true, 1}};
  const std::vector<int32_t> rows1 = {0, 1, 3};
  EXPECT_EQ(f.runner->run_mtp(pass1, rows1, true), (std::vector<int32_t>{1, 2}));  // not 63
  EXPECT_EQ(f.model.seen, (std::vector<float>{1, 11, 31}));
  EXPECT_FALSE(f.runner->mtp_logits().defined());
  // Chained: one row each at the next position, hidden from pass 1's output rows 1 (a's
  // last) and 2 (b's); the logits come back when asked.
  std::vector<RunSeq> pass2 = {{next_a, 2, 1, blocks_a, true, 1}, {next_b, 1, 1, blocks_b, true, 1}};
  const std::vector<int32_t> rows2 = {1, 2};
  EXPECT_EQ(f.runner->run_mtp(pass2, rows2, false, true), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(f.model.seen, (std::vector<float>{111, 131}));
  const Tensor& l = f.runner->mtp_logits();
  ASSERT_TRUE(l.defined());
  ASSERT_EQ(l.size(0), 2);
  ASSERT_EQ(l.size(1), kVocab);
  EXPECT_EQ(l.ptr<float>()[kVocab - 1], 20.0f);
  EXPECT_EQ(l.ptr<float>()[kVocab + 2], 10.0f);
  // A hidden row outside the source (pass 2 wrote rows 0, 1) is refused.
  const std::vector<int32_t> bad = {0, 2};
  EXPECT_THROW(f.runner->run_mtp(pass2, bad, false), Error);
}

// Chained passes issued without a host wait: the second takes its tokens from the first's
// device argmax (the host's entries are not read), both stay pending, and each keeps its
// own host logits until collected in order.
TEST(RunnerMtp, ChainedPassTakesTokensFromThePreviousPassOnTheDevice) {
  MtpFixture f(60);
  const std::vector<int32_t> a = {5, 6, 7}, b = {8, 9}, blocks_a = {1}, blocks_b = {2};
  std::vector<RunSeq> target = {{a, 0, 3, blocks_a, true}, {b, 0, 2, blocks_b, true}};
  f.runner->execute(target);
  const std::vector<int32_t> next_a = {6, 7, 99}, next_b = {9, 99};
  std::vector<RunSeq> pass1 = {{next_a, 0, 2, blocks_a, true, 1}, {next_b, 0, 1, blocks_b, true, 1}};
  const std::vector<int32_t> rows1 = {0, 1, 3};
  f.runner->submit_mtp(pass1, rows1, true, true);
  std::vector<RunSeq> pass2 = {{next_a, 2, 1, blocks_a, true, 1}, {next_b, 1, 1, blocks_b, true, 1}};
  const std::vector<int32_t> rows2 = {1, 2};
  f.runner->submit_mtp(pass2, rows2, false, true, true);
  EXPECT_EQ(f.model.seen_tokens, (std::vector<int32_t>{1, 2}));  // pass 1's drafts, not 99
  EXPECT_THROW(f.runner->submit_mtp(pass2, rows2, false), Error);  // a third pending pass
  EXPECT_THROW(f.runner->execute(target), Error);                  // a target step meanwhile
  EXPECT_EQ(f.runner->collect_mtp(), (std::vector<int32_t>{1, 2}));
  ASSERT_TRUE(f.runner->mtp_logits().defined());
  const float* l1 = f.runner->mtp_logits().ptr<float>();
  EXPECT_EQ(f.runner->collect_mtp(), (std::vector<int32_t>{1, 2}));
  const float* l2 = f.runner->mtp_logits().ptr<float>();
  EXPECT_NE(l1, l2);  // two halves of the host logits
  EXPECT_EQ(l2[kVocab + 2], 10.0f);
  EXPECT_THROW(f.runner->collect_mtp(), Error);
  // One row per sequence is required (and a previous pass with as many rows).
  std::vector<RunSeq> two = {{next_a, 0, 2, blocks_a, true, 1}};
  const std::vector<int32_t> rows_two = {0, 1};
  EXPECT_THROW(f.runner->submit_mtp(two, rows_two, true, false, true), Error);
}

TEST(RunnerMtp, WithoutSampleVocabEveryColumnCounts) {
  MtpFixture f(0);
  const std::vector<int32_t> a = {5, 6}, blocks = {1};
  std::vector<RunSeq> target = {{a, 0, 2, blocks, true}};
  f.runner->execute(target);
  const std::vector<int32_t> next = {6, 40};
  std::vector<RunSeq> pass = {{next, 0, 2, blocks, true, 1}};
  const std::vector<int32_t> rows = {0, 1};
  EXPECT_EQ(f.runner->run_mtp(pass, rows, true), (std::vector<int32_t>{kVocab - 1}));
}

}  // namespace
}  // namespace deepinfer
