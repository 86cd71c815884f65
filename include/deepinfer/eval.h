// deepinfer public API: two-stage evaluation (`deepinfer eval generate | score` and Python's
// `deepinfer.eval`). Stage 1 reads a dataset, runs each item's request through an Engine and
// writes one raw record per sample; stage 2 grades raw records alone (it never loads a model),
// so a grader can change without paying for inference again. The CLI and Python share these
// functions, so their files are the same format and their scores the same numbers.
//
// Strings in, strings out (JSON texts): the API carries no JSON library in its types.
// Dataset lines and graders: app/eval.h.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "deepinfer/engine.h"

namespace deepinfer::eval {

// One dataset item, checked, with its request ready for the engine.
struct Task {
  std::string id;
  std::string kind;          // exact_answer | multiple_choice | exact_match | code | structured
  std::string item_json;     // the whole dataset line
  std::string request_json;  // the request-line fields, with "n" = samples
  Prompt prompt;
  SamplingParams params;     // validated; seed 0 when neither the item nor the defaults give one
};

// Reads a dataset (JSONL). Every item is checked before any model loads: unique ids, the
// fields its kind needs, a valid request. Throws Error naming the file, line and field.
// `defaults` fills the sampling fields an item leaves out (an eval is reproducible: a missing
// seed becomes 0 and is recorded).
std::vector<Task> read_dataset(const std::string& path, int samples, const SamplingParams& defaults);

// What the engine made of one sample.
struct SampleOutput {
  std::string text;
  std::vector<int32_t> token_ids;
  std::string finish_reason;  // "error" with `error` set when the request failed
  std::string error;
  std::optional<int64_t> prompt_tokens, completion_tokens, cached_tokens;  // the request's usage
};
SampleOutput sample_output(const RequestOutput& request, int sample);

// The engine's identity as recorded in raw records and perplexity baselines (JSON object text).
std::string engine_record(const EngineConfig& config);

// Sample `sample` of `task` as one raw record (one JSON line, no newline).
std::string raw_record(const Task& task, int sample, const SampleOutput& output, const EngineConfig& config);

struct ScoreOptions {
  std::string python = "python3";   // runs code tests and the structured-output validator
  double code_timeout_s = 10.0;
  bool check_structured_output = false;
  std::string structured_checker;   // tools/eval/check_structured.py (shipped in the wheel too)
};

// Grades raw records (JSON texts, one per sample). Returns the scores as JSON text:
// {"summary": {...}, "tasks": [...], "samples": [...]}; pass@1 per task is the mean of its
// samples' grades. Throws Error naming the record for a malformed one.
std::string score(const std::vector<std::string>& records, const ScoreOptions& options);

}  // namespace deepinfer::eval
