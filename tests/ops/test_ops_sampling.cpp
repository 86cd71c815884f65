// Parity of Backend::sample: the CUDA kernel against the CPU reference (backend/cpu/
// sampling_rows.cpp). The rule's masses are integers (backend/sample_rule.h), so the tokens
// must be equal exactly, near-ties included; ids are poisoned before each run.
#include "backend/sample_rule.h"
#include "tests/ops/parity.h"

namespace deepinfer::ops_test {
namespace {

class SamplingOps : public Parity {
 protected:
  // Row params drawn over the cases the brief names: extreme temperatures, top-p 1 and
  // near 0, top-k 1 and beyond the vocabulary, min-p, greedy rows mixed in.
  SampleRowParams random_params(int64_t vocab) {
    const float temps[] = {0.0f, 1e-3f, 0.05f, 0.8f, 1.0f, 5.0f, 100.0f};
    const float top_ps[] = {1.0f, 1.0f, 0.95f, 0.5f, 1e-6f};
    const int top_ks[] = {0, 0, 1, 2, 50, static_cast<int>(vocab) + 3};
    const float min_ps[] = {0.0f, 0.0f, 0.05f, 0.5f, 1.0f};
    SampleRowParams p;
    p.temperature = temps[randint(0, 6)];
    p.top_p = top_ps[randint(0, 4)];
    p.top_k = top_ks[randint(0, 5)];
    p.min_p = min_ps[randint(0, 4)];
    p.seed = rng_();
    p.stream = static_cast<uint64_t>(randint(0, 7));
    p.position = static_cast<uint64_t>(randint(0, 1 << 20));
    return p;
  }
  // Logits of one row: normal with a random scale; some rows coarsely rounded (many exact
  // ties), some entries masked (-inf).
  std::vector<float> random_logits(int64_t rows, int64_t vocab) {
    std::vector<float> l;
    for (int64_t r = 0; r < rows; ++r) {
      const float scale = std::vector<float>{0.1f, 1.0f, 4.0f, 30.0f}[randint(0, 3)];
      std::vector<float> row = randn(vocab, scale, false);
      const int kind = randint(0, 3);
      for (float& x : row) {
        if (kind == 1) x = std::round(x * 2.0f) / 2.0f;  // ties
        if (kind == 2 && randint(0, 9) == 0) x = -INFINITY;  // grammar-style mask
      }
      if (kind == 3) row.assign(row.size(), 1.5f);  // all tied
      l.insert(l.end(), row.begin(), row.end());
    }
    return l;
  }

  // Runs both backends on [rows, vocab]; returns {cpu ids, gpu ids}.
  std::pair<std::vector<int32_t>, std::vector<int32_t>> run(const std::vector<float>& logits,
                                                            const std::vector<SampleRowParams>& params,
                                                            int64_t rows, int64_t vocab) {
    std::vector<int32_t> words(static_cast<size_t>(rows * kSampleRowWords));
    std::memcpy(words.data(), params.data(), params.size() * sizeof(SampleRowParams));
    Tensor lc = cpu_f32(logits, {rows, vocab});
    Tensor pc = cpu_i32(words, {rows, kSampleRowWords});
    Tensor ic = cpu_i32(std::vector<int32_t>(static_cast<size_t>(rows), -7), {rows});
    cpu_->sample(lc, pc, ic);
    Tensor lg = gpu_float(*gpu_, logits, {rows, vocab}, DType::F32);
    Tensor pg = gpu_copy(*gpu_, pc);
    Tensor ig = gpu_poisoned(*gpu_, DType::I32, {rows});
    gpu_->sample(lg, pg, ig);
    std::vector<int32_t> got(static_cast<size_t>(rows));
    Tensor host(got.data(), DType::I32, {rows});
    gpu_->copy(ig, host);
    return {std::vector<int32_t>(ic.ptr<int32_t>(), ic.ptr<int32_t>() + rows), got};
  }

  void check(int64_t rows, int64_t vocab) {
    const std::vector<float> logits = random_logits(rows, vocab);
    std::vector<SampleRowParams> params;
    for (int64_t r = 0; r < rows; ++r) params.push_back(random_params(vocab));
    const auto [want, got] = run(logits, params, rows, vocab);
    for (int64_t r = 0; r < rows; ++r) {
      const SampleRowParams& p = params[r];
      EXPECT_EQ(got[r], want[r]) << "row " << r << " of [" << rows << ", " << vocab
                                 << "]: T " << p.temperature << " top_p " << p.top_p << " top_k "
                                 << p.top_k << " min_p " << p.min_p << ", seed " << seed_;
    }
  }
};

TEST_F(SamplingOps, MatchesReferenceOnOddVocabularies) {
  check(1, 1);
  check(3, 7);
  check(300, 1000);   // many rows
  check(17, 32003);   // odd vocabulary
  check(12, 129280);  // DeepSeek-V3's vocabulary
}

// The cut points and the draw at exact ties: every logit equal, top-k / top-p cutting inside
// the tie (lower ids stay), one position per row so the draw lands everywhere.
TEST_F(SamplingOps, TiesGoToLowerIds) {
  const int64_t rows = 64, vocab = 4099;
  std::vector<float> logits(static_cast<size_t>(rows * vocab), 0.25f);
  std::vector<SampleRowParams> params(rows);
  for (int64_t r = 0; r < rows; ++r) {
    params[r].top_k = r % 2 ? 1000 : 0;
    params[r].top_p = r % 3 ? 0.3f : 1.0f;
    params[r].position = static_cast<uint64_t>(r);
    params[r].seed = 99;
  }
  const auto [want, got] = run(logits, params, rows, vocab);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(got[r], want[r]) << "row " << r << ", seed " << seed_;
    if (params[r].top_k == 1000) {
      EXPECT_LT(want[r], 1000) << "row " << r;
    }
  }
}

// A row's token does not depend on the other rows: each row alone gives the batch's token.
TEST_F(SamplingOps, BatchInvariant) {
  const int64_t rows = 9, vocab = 129280;
  const std::vector<float> logits = random_logits(rows, vocab);
  std::vector<SampleRowParams> params;
  for (int64_t r = 0; r < rows; ++r) params.push_back(random_params(vocab));
  const auto batch = run(logits, params, rows, vocab).second;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> one(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
    const auto alone = run(one, {params[r]}, 1, vocab).second;
    EXPECT_EQ(alone[0], batch[r]) << "row " << r << ", seed " << seed_;
  }
}

// A row holding a NaN logit has no token (sample_rule::kNoToken, -1) on both backends, greedy
// or sampled, wherever the NaN is (first, last, inside a prep block, the only one); so has a
// sampled row with nothing finite. Temperatures below the floor (1e-5) are the argmax. The
// other rows of the batch keep their tokens.
TEST_F(SamplingOps, NanRowsHaveNoTokenAndTinyTemperaturesAreGreedy) {
  for (int64_t vocab : {int64_t{7}, int64_t{4099}, int64_t{129280}}) {
    const int64_t rows = 16;
    std::vector<float> logits = random_logits(rows, vocab);
    for (int64_t r = 0; r < rows; ++r)  // finite rows (random_logits masks some entries)
      for (int64_t v = 0; v < vocab; ++v)
        if (!std::isfinite(logits[r * vocab + v])) logits[r * vocab + v] = -3.0f;
    std::vector<SampleRowParams> params;
    for (int64_t r = 0; r < rows; ++r) params.push_back(random_params(vocab));
    const int64_t nan_at[] = {0, vocab - 1, vocab / 2, vocab > 1030 ? 1029 : 3};
    std::vector<bool> no_token(rows, false);
    for (int64_t r = 0; r < 8; ++r) {  // rows 0-7: a NaN; even ones greedy
      logits[r * vocab + nan_at[r % 4]] = std::nanf("");
      params[r].temperature = r % 2 == 0 ? 0.0f : 0.7f;
      no_token[r] = true;
    }
    for (int64_t v = 0; v < vocab; ++v) logits[8 * vocab + v] = -INFINITY;  // nothing finite
    params[8].temperature = 1.0f;
    no_token[8] = true;
    for (int64_t r = 9; r < 12; ++r) {  // below the floor: the argmax whatever top_k / top_p
      params[r].temperature = std::vector<float>{1e-38f, 1e-6f, 9.9e-6f}[r - 9];
      params[r].top_k = 2;
      params[r].top_p = 0.5f;
    }
    const auto [want, got] = run(logits, params, rows, vocab);
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(got[r], want[r]) << "row " << r << " of vocab " << vocab << ", seed " << seed_;
      if (no_token[r]) {
        EXPECT_EQ(want[r], sample_rule::kNoToken) << "row " << r;
      } else {
        EXPECT_GE(want[r], 0) << "row " << r;
      }
      if (r >= 9 && r < 12) {
        const auto row = logits.begin() + r * vocab;
        EXPECT_EQ(want[r], std::max_element(row, row + vocab) - row) << "row " << r;
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer::ops_test
