#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "backend/sample_rule.h"

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

std::string nan_logits_error(int64_t position) {
  return "the model's logits hold NaN at position " + std::to_string(position) +
         " (its forward broke; check the checkpoint: a load without --skip-weight-check scans "
         "it for NaN/Inf)";
}

bool device_samplable(const SamplingParams& p) {
  return p.repetition_penalty == 1.0f && p.frequency_penalty == 0.0f &&
         p.presence_penalty == 0.0f && p.logprobs < 0;
}

SampleRowParams device_params(const SamplingParams& p, uint64_t seed, uint64_t stream,
                              int64_t position) {
  SampleRowParams r;
  r.temperature = p.temperature;
  r.top_p = p.top_p;
  r.min_p = p.min_p;
  r.top_k = p.top_k;
  r.seed = seed;
  r.stream = stream;
  r.position = static_cast<uint64_t>(position);
  return r;
}

SampleResult Sampler::sample(const float* logits, const SampleRow& row) {
  const SamplingParams& p = *row.params;
  const int vocab = vocab_size_;
  SampleResult result;
  bool nan = false;
  for (int v = 0; v < vocab; ++v) nan |= sample_rule::is_nan(logits[v]);
  if (nan) {
    result.error = nan_logits_error(row.position);
    return result;
  }
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

  if (p.greedy()) {
    // First maximum: lowest id on ties, matching backend argmax.
    result.token_id = static_cast<int32_t>(std::max_element(work_.begin(), work_.end()) - work_.begin());
  } else {
    // Temperature, min_p, top_k, top_p and the draw: the rule the device op runs too
    // (backend/sample_rule.h), so a row gives the same token on either path.
    const int32_t id = sample_rule::sample_row(work_.data(), vocab, device_params(p, row.seed, row.stream,
                                                                                  row.position));
    if (id < 0) {
      result.error = "every token is masked (or no logit is finite) at position " +
                     std::to_string(row.position);
      return result;
    }
    result.token_id = id;
  }
  if (p.logprobs >= 0) raw_logprobs(logits, vocab, p.logprobs, result, cand_);
  return result;
}

}  // namespace deepinfer
