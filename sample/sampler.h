// Sampler: turns one row of logits into a token, applying the request's
// processors in vLLM v1's order:
//   0. logprobs, if asked, from the raw logits (before any processing)
//   1. structured-output mask (grammar bitmask): disallowed tokens -> -inf
//   2. min_tokens: EOS and stop token ids -> -inf until enough tokens exist
//   3. penalties: repetition (prompt + output tokens; divide positive logits,
//      multiply negative ones), then frequency (x count) and presence (once),
//      over output tokens
//   4. greedy (temperature 0): argmax, lowest id on ties; done
//   5. temperature, min_p, top_k, top_p and the Philox draw keyed by (seed, stream,
//      position): backend/sample_rule.h, the rule Backend::sample runs on the device, so
//      a seeded row gives the same token on the host and on the device.
// Each row is independent of the others, so results never depend on the batch.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "deepinfer/sampling_params.h"

namespace deepinfer {

// True when the device op (Backend::sample) covers p: no penalties, no logprobs. The
// engine adds its own conditions (no grammar mask, min_tokens reached).
bool device_samplable(const SamplingParams& p);
// The op's per-row parameters for a request's row.
SampleRowParams device_params(const SamplingParams& p, uint64_t seed, uint64_t stream,
                              int64_t position);

struct SampleRow {
  const SamplingParams* params = nullptr;
  uint64_t seed = 0;      // resolved request seed
  uint64_t stream = 0;    // params.seq_seed + sample index
  int64_t position = 0;   // index in its sequence of the token being sampled
  std::span<const int32_t> prompt_tokens;
  std::span<const int32_t> output_tokens;
  std::span<const int32_t> banned_tokens;   // e.g. EOS before min_tokens
  const uint32_t* allowed_bitmask = nullptr;  // [ceil(vocab/32)], bit set = allowed; null = all
};

struct SampleResult {
  // -1 (sample_rule::kNoToken) when the row has no token: a NaN logit, or every token masked;
  // `error` then says which (the engine ends the sequence with that error).
  int32_t token_id = -1;
  std::string error;
  float logprob = 0.0f;  // of the sampled token under the raw distribution (when logprobs >= 0)
  std::vector<std::pair<int32_t, float>> top_logprobs;  // [params.logprobs], most likely first
};

// The error of a row whose logits hold NaN (token position `position`), for every path.
std::string nan_logits_error(int64_t position);

class Sampler {
 public:
  // vocab_size: the ids it may choose, the first columns of each logits row (the engine
  // passes the tokenizer's vocabulary when the model has padding rows beyond it).
  explicit Sampler(int vocab_size) : vocab_size_(vocab_size) {}
  // logits: F32 [vocab_size] (the rest of the row is not read), read only.
  SampleResult sample(const float* logits, const SampleRow& row);

 private:
  int vocab_size_;
  std::vector<float> work_;                      // [vocab] processed logits
  std::vector<std::pair<float, int32_t>> cand_;  // candidates (logit, id)
  std::vector<int32_t> counts_;                  // [vocab] output token counts
};

}  // namespace deepinfer
