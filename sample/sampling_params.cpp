#include <cmath>

#include "core/error.h"
#include "backend/sample_rule.h"
#include "deepinfer/sampling_params.h"

namespace deepinfer {

bool SamplingParams::greedy() const { return sample_rule::is_greedy(temperature); }

void SamplingParams::validate() const {
  DI_CHECK(n >= 1 && n <= kMaxN, "n: must be in [1, ", kMaxN, "], got ", n);
  DI_CHECK(std::isfinite(temperature) && temperature >= 0.0f,
           "temperature: must be >= 0, got ", temperature);
  DI_CHECK(top_p > 0.0f && top_p <= 1.0f, "top_p: must be in (0, 1], got ", top_p);
  DI_CHECK(top_k >= -1 && top_k <= kMaxTopK, "top_k: must be -1, 0 (all) or in [1, ", kMaxTopK, "], got ",
           top_k);
  DI_CHECK(min_p >= 0.0f && min_p <= 1.0f, "min_p: must be in [0, 1], got ", min_p);
  DI_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f,
           "repetition_penalty: must be > 0, got ", repetition_penalty);
  DI_CHECK(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f,
           "frequency_penalty: must be in [-2, 2], got ", frequency_penalty);
  DI_CHECK(presence_penalty >= -2.0f && presence_penalty <= 2.0f,
           "presence_penalty: must be in [-2, 2], got ", presence_penalty);
  DI_CHECK(max_tokens >= 1 && max_tokens <= kMaxTokens, "max_tokens: must be in [1, ", kMaxTokens, "], got ",
           max_tokens);
  DI_CHECK(min_tokens >= 0 && min_tokens <= max_tokens,
           "min_tokens: must be in [0, max_tokens], got ", min_tokens);
  DI_CHECK(stop.size() <= kMaxStops, "stop: ", stop.size(), " stop strings, at most ", kMaxStops);
  for (const auto& s : stop) {
    DI_CHECK(!s.empty(), "stop: stop strings must not be empty");
    DI_CHECK(s.size() <= kMaxStopBytes, "stop: a stop string of ", s.size(), " bytes, at most ", kMaxStopBytes);
  }
  DI_CHECK(stop_token_ids.size() <= kMaxStopTokenIds, "stop_token_ids: ", stop_token_ids.size(),
           " entries, at most ", kMaxStopTokenIds);
  DI_CHECK(logprobs >= -1 && logprobs <= kMaxLogprobs, "logprobs: must be -1 (none) or 0..", kMaxLogprobs,
           ", got ", logprobs);
  DI_CHECK(prompt_logprobs >= -1 && prompt_logprobs <= kMaxLogprobs, "prompt_logprobs: must be -1 (none) or 0..",
           kMaxLogprobs, ", got ", prompt_logprobs);
  const std::string& k = so_args.kind;
  DI_CHECK(k.empty() || k == "regex" || k == "json_schema" || k == "ebnf" || k == "json_object" || k == "tool_calls",
           "so_args.kind: expected regex, json_schema, ebnf, json_object or tool_calls, got '", k, "'");
}

}  // namespace deepinfer
