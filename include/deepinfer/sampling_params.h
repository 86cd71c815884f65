// SamplingParams: how one request is sampled and when it stops. Names follow
// vLLM / DeepInfer. validate() throws deepinfer::Error naming the field.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace deepinfer {

// Structured output constraint (so_args). Empty kind means none.
struct StructuredOutputArgs {
  // "" | "regex" | "json_schema" | "ebnf" | "json_object" | "tool_calls" (marker-wrapped calls whose
  // arguments follow JSON Schemas; source format in grammar/tool_calls.cpp)
  std::string kind;
  std::string source;  // the pattern, schema text or grammar text
  // JSON whitespace between tokens. false (default): compact JSON, so a small or
  // unsure model cannot loop on whitespace (the failure vLLM users hit with
  // xgrammar's any-whitespace default); true: any JSON whitespace.
  bool any_whitespace = false;
};

struct SamplingParams {
  int n = 1;                        // samples per prompt; they share the prompt's KV blocks
  float temperature = 1.0f;         // below 1e-5 (0 included) = greedy
  float top_p = 1.0f;               // (0, 1]
  int top_k = 0;                    // 0 or -1 = all
  float min_p = 0.0f;               // [0, 1]
  float repetition_penalty = 1.0f;  // > 0; prompt and output tokens
  float frequency_penalty = 0.0f;   // [-2, 2]; output tokens
  float presence_penalty = 0.0f;    // [-2, 2]; output tokens
  int max_tokens = 16;              // >= 1 new tokens
  int min_tokens = 0;               // EOS and stop tokens are masked until this many
  std::vector<std::string> stop;    // stop strings (not included in the text)
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;
  // Random stream: each sampled token draws from a counter-based generator keyed
  // by (seed, seq_seed + sample index, position), so it never depends on the batch.
  std::optional<uint64_t> seed;     // unset: the engine picks one per request
  uint64_t seq_seed = 0;
  int logprobs = -1;                // -1 none; k >= 0: sampled token + top k (of raw logits)
  // vLLM's prompt_logprobs: -1 none; k >= 0: for every prompt token after the first, its
  // log-probability given the tokens before it and the k most likely alternatives there
  // (RequestOutput::prompt_logprobs), computed by the prefill steps. Such a request does not
  // reuse cached prefix blocks for its prompt (a cached position has no logits), as vLLM.
  int prompt_logprobs = -1;
  bool skip_special_tokens = true;
  // Engine::step's updates carry only what they add (vLLM's RequestOutputKind.DELTA): each
  // sample's text and token_ids hold the new part only (equal to delta_text / delta_token_ids,
  // as always set), logprobs the new tokens' entries only, prompt_token_ids stays empty and
  // prompt_logprobs comes once; the final update too. Streaming callers that keep their own
  // copy (the server) then copy nothing per update that grows with the output. generate()
  // ignores it (it returns whole outputs).
  bool delta_outputs = false;
  StructuredOutputArgs so_args;

  // Upper bounds validate() enforces, so one request cannot exhaust memory or time.
  static constexpr int kMaxN = 128;
  static constexpr int kMaxTokens = 1 << 20;        // max_tokens (the context bounds it too)
  static constexpr int kMaxLogprobs = 20;           // vLLM's default max_logprobs
  static constexpr int kMaxTopK = 1 << 20;          // above the vocabulary size means all
  static constexpr size_t kMaxStops = 64;           // stop strings
  static constexpr size_t kMaxStopBytes = 1024;     // bytes per stop string
  static constexpr size_t kMaxStopTokenIds = 1024;  // stop_token_ids entries

  // temperature below the floor of backend/sample_rule.h (1e-5, vLLM's): argmax.
  bool greedy() const;
  // Throws Error("<field>: ...") for values outside their ranges.
  void validate() const;
};

}  // namespace deepinfer
