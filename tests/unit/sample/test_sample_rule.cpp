// The sampling rule (backend/sample_rule.h) on the host: its exp, its distribution against
// an independent double-precision computation, its cut points at ties, and Backend::sample
// on the CPU backend (the reference the CUDA op is compared with in tests/ops).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/sample_rule.h"
#include "core/error.h"
#include "sample/sampler.h"

namespace deepinfer {
namespace {

TEST(SampleRule, ExpNegIsCloseToExp) {
  EXPECT_EQ(sample_rule::exp_neg(0.0f), 1.0f);
  EXPECT_EQ(sample_rule::exp_neg(-24.0f), 0.0f);
  EXPECT_EQ(sample_rule::exp_neg(-INFINITY), 0.0f);
  EXPECT_EQ(sample_rule::weight(0.0f), sample_rule::kMaxWeight);
  double worst = 0.0;
  for (float x = 0.0f; x >= -23.0f; x -= 0.000731f) {
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(sample_rule::exp_neg(x) - want) / want);
  }
  EXPECT_LT(worst, 4e-7);
}

// The rule's distribution computed independently in double: sort most likely first (lower
// id on ties), min_p, top_k, the shortest top_p prefix, renormalise.
std::vector<double> expected_probs(const std::vector<float>& logits, const SampleRowParams& p) {
  const int n = static_cast<int>(logits.size());
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  const double m = logits[order[0]] / static_cast<double>(p.temperature);
  std::vector<double> w(n, 0.0);
  for (int v = 0; v < n; ++v) w[v] = std::exp(logits[v] / static_cast<double>(p.temperature) - m);
  std::vector<int> kept;
  for (int v : order)
    if (w[v] >= p.min_p) kept.push_back(v);
  if (p.top_k > 0 && p.top_k < static_cast<int>(kept.size())) kept.resize(p.top_k);
  double total = 0.0;
  for (int v : kept) total += w[v];
  if (p.top_p < 1.0f) {
    double mass = 0.0;
    size_t i = 0;
    while (i < kept.size()) {
      mass += w[kept[i++]];
      if (mass >= p.top_p * total) break;
    }
    kept.resize(i);
    total = mass;
  }
  std::vector<double> probs(n, 0.0);
  for (int v : kept) probs[v] = w[v] / total;
  return probs;
}

TEST(SampleRule, FrequenciesFollowTheRule) {
  // Cut points are kept away from the thresholds (mass 0.8 vs prefix masses .60/.83/...).
  const std::vector<float> logits = {0.3f, 2.0f, -1.0f, 1.1f, 2.6f, 0.0f, 1.7f, -3.0f, 0.9f};
  std::vector<SampleRowParams> cases(5);
  cases[0].temperature = 0.7f;
  cases[1].top_k = 3;
  cases[2].top_p = 0.8f;
  cases[3].min_p = 0.2f;
  cases[4].temperature = 1.6f, cases[4].top_k = 6, cases[4].top_p = 0.9f, cases[4].min_p = 0.05f;
  const int draws = 40000;
  for (size_t c = 0; c < cases.size(); ++c) {
    SampleRowParams p = cases[c];
    p.seed = 17 + c;
    const std::vector<double> want = expected_probs(logits, p);
    std::vector<int> counts(logits.size(), 0);
    for (int i = 0; i < draws; ++i) {
      p.position = static_cast<uint64_t>(i);
      const int32_t t = sample_rule::sample_row(logits.data(), static_cast<int64_t>(logits.size()), p);
      ASSERT_GE(t, 0);
      counts[t]++;
    }
    for (size_t v = 0; v < logits.size(); ++v) {
      if (want[v] == 0.0) {
        EXPECT_EQ(counts[v], 0) << "case " << c << ": token " << v << " is outside the support";
        continue;
      }
      const double sigma = std::sqrt(draws * want[v] * (1 - want[v]));
      EXPECT_NEAR(counts[v], draws * want[v], 5 * sigma + 1) << "case " << c << " token " << v;
    }
  }
}

TEST(SampleRule, NarrowCutsGiveTheArgmaxLowestIdOnTies) {
  const std::vector<float> logits = {0.5f, 3.0f, -2.0f, 3.0f, 1.0f};
  SampleRowParams k1, p0, m1;
  k1.top_k = 1;
  p0.top_p = 1e-6f;
  m1.min_p = 1.0f;
  for (SampleRowParams p : {k1, p0}) {
    for (uint64_t pos = 0; pos < 50; ++pos) {
      p.position = pos;
      EXPECT_EQ(sample_rule::sample_row(logits.data(), 5, p), 1);
    }
  }
  // min_p 1 keeps both maxima (e = 1 for each): the draw picks among ids 1 and 3 only.
  int seen[5] = {};
  for (uint64_t pos = 0; pos < 200; ++pos) {
    m1.position = pos;
    seen[sample_rule::sample_row(logits.data(), 5, m1)]++;
  }
  EXPECT_GT(seen[1], 50);
  EXPECT_GT(seen[3], 50);
  EXPECT_EQ(seen[0] + seen[2] + seen[4], 0);
  // No finite logit: -1 for the caller to handle.
  const std::vector<float> masked(4, -INFINITY);
  EXPECT_EQ(sample_rule::sample_row(masked.data(), 4, SampleRowParams{}), -1);
}

// Top-p over a peaked row: most of the vocabulary weighs 0 (the host reference sorts only the
// rest). The token equals the rule written out in full here: every candidate sorted, the cut
// walked, the draw over the kept ids in id order.
TEST(SampleRule, PeakedTopPRowsGiveTheFullRulesToken) {
  using namespace sample_rule;
  std::mt19937 rng(21);
  const int vocab = 4000;
  std::vector<float> logits(vocab);
  for (float& x : logits) x = -40.0f + std::normal_distribution<float>(0.0f, 1.0f)(rng);
  for (int i = 0; i < 24; ++i)
    logits[std::uniform_int_distribution<int>(0, vocab - 1)(rng)] = std::normal_distribution<float>(0.0f, 1.5f)(rng);
  logits[vocab - 1] = -17.5f;  // near the weight-0 edge at T 1
  for (float top_p : {0.3f, 0.9f, 0.999999f}) {
    for (float temperature : {0.7f, 1.0f, 2.5f}) {
      SampleRowParams p;
      p.temperature = temperature;
      p.top_p = top_p;
      p.seed = 3;
      float max_s = -INFINITY;
      for (float l : logits) max_s = std::max(max_s, fdiv(l, temperature));
      struct C { uint32_t key; int32_t id; uint32_t w; };
      std::vector<C> all;
      for (int v = 0; v < vocab; ++v) {
        const float s = fdiv(logits[v], temperature);
        all.push_back({order_key(s), v, weight(fadd(s, -max_s))});
      }
      std::vector<C> order = all;
      std::sort(order.begin(), order.end(), [](const C& a, const C& b) {
        return a.key > b.key || (a.key == b.key && a.id < b.id);
      });
      uint64_t total = 0;
      for (const C& c : order) total += c.w;
      const uint64_t need = top_p_need(top_p, total);
      uint64_t mass = 0;
      size_t keep = 0;
      while (keep < order.size()) {
        mass += order[keep++].w;
        if (mass >= need) break;
      }
      std::vector<bool> kept(vocab, false);
      for (size_t i = 0; i < keep; ++i) kept[order[i].id] = true;
      uint64_t kept_total = 0;
      for (int v = 0; v < vocab; ++v) kept_total += kept[v] ? all[v].w : 0;
      for (uint64_t pos = 0; pos < 300; ++pos) {
        p.position = pos;
        const uint64_t target = draw_target(philox_bits53(p.seed, p.stream, pos), kept_total);
        uint64_t cum = 0;
        int32_t want = -1;
        for (int v = 0; v < vocab && want < 0; ++v) {
          cum += kept[v] ? all[v].w : 0;
          if (cum > target) want = v;
        }
        ASSERT_EQ(sample_row(logits.data(), vocab, p), want)
            << "top_p " << top_p << " T " << temperature << " position " << pos;
      }
    }
  }
}

// The host sampler's non-greedy rows are the rule itself (the engine's host and device paths
// agree because of this).
TEST(SampleRule, HostSamplerFollowsTheRule) {
  std::mt19937 rng(5);
  const int vocab = 300;
  std::vector<float> logits(vocab);
  for (float& x : logits) x = std::normal_distribution<float>(0.0f, 2.0f)(rng);
  Sampler sampler(vocab);
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.top_p = 0.95f;
  sp.top_k = 40;
  for (int64_t pos = 0; pos < 200; ++pos) {
    SampleRow row;
    row.params = &sp;
    row.seed = 11;
    row.stream = 2;
    row.position = pos;
    EXPECT_EQ(sampler.sample(logits.data(), row).token_id,
              sample_rule::sample_row(logits.data(), vocab, device_params(sp, 11, 2, pos)));
  }
}

// Backend::sample on the CPU backend: row by row the rule, a row's token independent of the
// other rows, greedy rows the argmax; bad shapes are errors naming the argument.
TEST(SampleRule, CpuOpIsTheRulePerRow) {
  auto cpu = make_cpu_backend();
  std::mt19937_64 rng(9);
  const int64_t rows = 6, vocab = 1001;
  std::vector<float> logits(static_cast<size_t>(rows * vocab));
  for (float& x : logits) x = std::normal_distribution<float>(0.0f, 3.0f)(rng);
  std::vector<SampleRowParams> params(rows);
  for (int64_t r = 0; r < rows; ++r) {
    params[r].temperature = r == 2 ? 0.0f : 0.5f + 0.3f * r;
    params[r].top_k = r == 3 ? 10 : 0;
    params[r].top_p = r == 4 ? 0.7f : 1.0f;
    params[r].seed = rng();
    params[r].position = r * 7;
  }
  auto run = [&](int64_t first, int64_t n) {
    std::vector<int32_t> ids(static_cast<size_t>(n), -5);
    std::vector<int32_t> words(static_cast<size_t>(n * kSampleRowWords));
    std::memcpy(words.data(), params.data() + first, words.size() * sizeof(int32_t));
    Tensor l(logits.data() + first * vocab, DType::F32, {n, vocab});
    Tensor p(words.data(), DType::I32, {n, kSampleRowWords});
    Tensor i(ids.data(), DType::I32, {n});
    cpu->sample(l, p, i);
    return ids;
  };
  const std::vector<int32_t> batch = run(0, rows);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(batch[r], sample_rule::sample_row(logits.data() + r * vocab, vocab, params[r])) << r;
    EXPECT_EQ(run(r, 1)[0], batch[r]) << "row " << r << " alone";
  }
  EXPECT_EQ(batch[2], std::max_element(logits.begin() + 2 * vocab, logits.begin() + 3 * vocab) -
                          (logits.begin() + 2 * vocab));

  std::vector<int32_t> ids(rows), short_words(rows * kSampleRowWords - 1);
  Tensor l(logits.data(), DType::F32, {rows, vocab});
  Tensor bad_p(short_words.data(), DType::I32, {static_cast<int64_t>(short_words.size())});
  Tensor i(ids.data(), DType::I32, {rows});
  try {
    cpu->sample(l, bad_p, i);
    FAIL() << "short row_params accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row_params"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer

namespace deepinfer {
namespace {

// Temperatures below the floor (sample_rule::kMinTemperature, 1e-5) are greedy on every path:
// the rule, the host sampler, the CPU op and SamplingParams::greedy(). Before the floor, 1e-38
// made every nonzero logit overflow to +-inf (dropped), so id 0 (BOS here) was drawn whatever
// top_k said.
TEST(SampleRule, TemperaturesBelowTheFloorAreGreedy) {
  const std::vector<float> logits = {0.0f, 5.0f, 3.0f, -1.0f, 4.5f};
  for (float t : {1e-38f, 1e-30f, 1e-6f, 9.99e-6f, 0.0f}) {
    SampleRowParams p;
    p.temperature = t;
    p.top_k = 3;
    p.top_p = 0.9f;
    p.seed = 5;
    for (uint64_t pos = 0; pos < 50; ++pos) {
      p.position = pos;
      EXPECT_EQ(sample_rule::sample_row(logits.data(), 5, p), 1) << "T " << t << " position " << pos;
    }
    SamplingParams sp;
    sp.temperature = t;
    EXPECT_TRUE(sp.greedy()) << t;
    Sampler s(5);
    SampleRow row;
    row.params = &sp;
    row.seed = 3;
    EXPECT_EQ(s.sample(logits.data(), row).token_id, 1) << "T " << t;
  }
  SamplingParams at_floor;
  at_floor.temperature = sample_rule::kMinTemperature;
  EXPECT_FALSE(at_floor.greedy());
  // At the floor the rule samples (here the 0.5 gap at T 1e-5 still leaves only the max).
  SampleRowParams p;
  p.temperature = 1e-5f;
  EXPECT_EQ(sample_rule::sample_row(logits.data(), 5, p), 1);
}

// A row with a NaN logit has no token (kNoToken) in the rule, the CPU ops (sample, argmax)
// and the host sampler (whose result names the NaN); the other rows of the batch keep theirs.
TEST(SampleRule, NanRowsHaveNoToken) {
  auto cpu = make_cpu_backend();
  const int64_t rows = 6, vocab = 300;
  std::mt19937_64 rng(17);
  std::vector<float> logits(static_cast<size_t>(rows * vocab));
  for (float& x : logits) x = std::normal_distribution<float>(0.0f, 2.0f)(rng);
  const std::vector<float> clean = logits;
  logits[0 * vocab + 0] = NAN;            // greedy, first element
  logits[1 * vocab + vocab - 1] = NAN;    // sampled, last element
  logits[2 * vocab + 123] = -NAN;         // sampled, negative NaN, with top_k
  std::vector<SampleRowParams> params(rows);
  for (int64_t r = 0; r < rows; ++r) {
    params[r].temperature = r % 3 == 0 ? 0.0f : 0.8f;
    params[r].top_k = r == 2 ? 5 : 0;
    params[r].seed = 7 + r;
  }
  std::vector<int32_t> words(static_cast<size_t>(rows * kSampleRowWords));
  std::memcpy(words.data(), params.data(), words.size() * sizeof(int32_t));
  std::vector<int32_t> ids(rows, -5), argmax_ids(rows, -5);
  Tensor l(logits.data(), DType::F32, {rows, vocab});
  Tensor pw(words.data(), DType::I32, {rows, kSampleRowWords});
  Tensor it(ids.data(), DType::I32, {rows});
  cpu->sample(l, pw, it);
  Tensor at(argmax_ids.data(), DType::I32, {rows});
  cpu->argmax(l, at);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * vocab;
    if (r < 3) {
      EXPECT_EQ(ids[r], sample_rule::kNoToken) << r;
      EXPECT_EQ(argmax_ids[r], sample_rule::kNoToken) << r;
      EXPECT_EQ(sample_rule::sample_row(row, vocab, params[r]), sample_rule::kNoToken) << r;
    } else {
      EXPECT_EQ(ids[r], sample_rule::sample_row(clean.data() + r * vocab, vocab, params[r])) << r;
      EXPECT_GE(ids[r], 0) << r;
      EXPECT_EQ(argmax_ids[r], std::max_element(row, row + vocab) - row) << r;
    }
  }
  // The host sampler: no token and an error naming NaN, greedy or not, logprobs or not.
  Sampler s(static_cast<int>(vocab));
  for (float t : {0.0f, 0.8f}) {
    SamplingParams sp;
    sp.temperature = t;
    sp.logprobs = t > 0 ? 2 : -1;
    SampleRow row;
    row.params = &sp;
    row.position = 41;
    const SampleResult res = s.sample(logits.data() + vocab, row);
    EXPECT_EQ(res.token_id, sample_rule::kNoToken);
    EXPECT_NE(res.error.find("NaN"), std::string::npos) << res.error;
    EXPECT_NE(res.error.find("41"), std::string::npos) << res.error;
    EXPECT_GE(s.sample(clean.data() + vocab, row).token_id, 0);
  }
}

// Everything masked on the host path is that row's error (a result), not an exception that
// would end every request of the step.
TEST(SampleRule, HostSamplerReportsAnAllMaskedRow) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  SamplingParams sp;
  sp.temperature = 0.5f;
  std::vector<int32_t> banned = {0, 1, 2};
  SampleRow row;
  row.params = &sp;
  row.banned_tokens = banned;
  Sampler s(3);
  const SampleResult res = s.sample(logits.data(), row);
  EXPECT_EQ(res.token_id, sample_rule::kNoToken);
  EXPECT_NE(res.error.find("masked"), std::string::npos) << res.error;
}

// The sampler reads only its vocab_size first columns: ids beyond are never chosen.
TEST(SampleRule, HostSamplerChoosesOnlyWithinItsVocabulary) {
  std::vector<float> logits = {0.0f, 1.0f, 2.0f, 50.0f, 60.0f};  // the last two are beyond
  Sampler s(3);
  SamplingParams greedy;
  greedy.temperature = 0;
  SamplingParams hot;
  hot.temperature = 5.0f;
  for (uint64_t pos = 0; pos < 200; ++pos) {
    SampleRow row;
    row.params = &greedy;
    row.position = static_cast<int64_t>(pos);
    EXPECT_EQ(s.sample(logits.data(), row).token_id, 2);
    row.params = &hot;
    EXPECT_LT(s.sample(logits.data(), row).token_id, 3);
  }
}

}  // namespace
}  // namespace deepinfer
