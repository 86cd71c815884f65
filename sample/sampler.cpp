#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "sample/philox.h"

namespace deepinfer {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Orders candidates most likely first, lower id first on ties (deterministic).
bool more_likely(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

void raw_logprobs(const float* logits, int vocab, int k, SampleResult& r,
                  std::vector<std::pair<float, int32_t>>& scratch) {
  float max_logit = *std::max_element(logits, logits + vocab);
  double sum = 0.0;
  for (int v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(logits[v] - max_logit));
  const double log_z = max_logit + std::log(sum);
  r.logprob = static_cast<float>(logits[r.token_id] - log_z);
  if (k <= 0) return;
  scratch.clear();
  for (int v = 0; v < vocab; ++v) scratch.emplace_back(logits[v], v);
  k = std::min(k, vocab);
  std::partial_sort(scratch.begin(), scratch.begin() + k, scratch.end(), more_likely);
  for (int i = 0; i < k; ++i)
    r.top_logprobs.emplace_back(scratch[i].second, static_cast<float>(scratch[i].first - log_z));
}

}  // namespace

SampleResult Sampler::sample(const float* logits, const SampleRow& row) {
  const SamplingParams& p = *row.params;
  const int vocab = vocab_size_;
  work_.assign(logits, logits + vocab);

  if (row.allowed_bitmask != nullptr) {
    for (int v = 0; v < vocab; ++v)
      if (!((row.allowed_bitmask[v >> 5] >> (v & 31)) & 1u)) work_[v] = kNegInf;
  }
  for (int32_t t : row.banned_tokens)
    if (t >= 0 && t < vocab) work_[t] = kNegInf;

  if (p.repetition_penalty != 1.0f) {
    auto penalize = [&](int32_t t) {
      if (t < 0 || t >= vocab || counts_[t] == -1) return;
      counts_[t] = -1;  // once per distinct token
      work_[t] = work_[t] > 0 ? work_[t] / p.repetition_penalty : work_[t] * p.repetition_penalty;
    };
    counts_.assign(vocab, 0);
    for (int32_t t : row.prompt_tokens) penalize(t);
    for (int32_t t : row.output_tokens) penalize(t);
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    counts_.assign(vocab, 0);
    for (int32_t t : row.output_tokens)
      if (t >= 0 && t < vocab) counts_[t]++;
    for (int v = 0; v < vocab; ++v)
      if (counts_[v] > 0)
        work_[v] -= p.frequency_penalty * static_cast<float>(counts_[v]) + p.presence_penalty;
  }

  SampleResult result;
  if (p.greedy()) {
    // First maximum: lowest id on ties, matching backend argmax.
    result.token_id = static_cast<int32_t>(std::max_element(work_.begin(), work_.end()) - work_.begin());
  } else {
    cand_.clear();
    for (int v = 0; v < vocab; ++v)
      if (work_[v] != kNegInf) cand_.emplace_back(work_[v] / p.temperature, v);
    DI_CHECK(!cand_.empty(), "sampler: every token is masked at position ", row.position);
    float max_logit = std::max_element(cand_.begin(), cand_.end())->first;
    if (p.min_p > 0.0f) {
      // p_v / p_max = exp(l_v - l_max) >= min_p
      const float threshold = max_logit + std::log(p.min_p);
      std::erase_if(cand_, [&](const auto& c) { return c.first < threshold; });
    }
    size_t keep = cand_.size();
    if (p.top_k > 0 && static_cast<size_t>(p.top_k) < keep) keep = p.top_k;
    if (p.top_p < 1.0f || keep < cand_.size()) {
      std::partial_sort(cand_.begin(), cand_.begin() + keep, cand_.end(), more_likely);
      cand_.resize(keep);
    }
    double total = 0.0;
    for (auto& c : cand_) total += std::exp(static_cast<double>(c.first - max_logit));
    if (p.top_p < 1.0f) {
      double mass = 0.0;
      size_t i = 0;
      while (i < cand_.size()) {
        mass += std::exp(static_cast<double>(cand_[i].first - max_logit));
        ++i;
        if (mass >= p.top_p * total) break;
      }
      cand_.resize(i);
      total = mass;
    }
    const double u = philox_uniform(row.seed, row.stream, static_cast<uint64_t>(row.position));
    const double target = u * total;
    double cum = 0.0;
    result.token_id = cand_.back().second;  // rounding fallback
    for (auto& c : cand_) {
      cum += std::exp(static_cast<double>(c.first - max_logit));
      if (cum > target) {
        result.token_id = c.second;
        break;
      }
    }
  }
  if (p.logprobs >= 0) raw_logprobs(logits, vocab, p.logprobs, result, cand_);
  return result;
}

}  // namespace deepinfer
