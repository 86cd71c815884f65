// `deepinfer generate --input IN --output OUT`: a JSONL batch whose results are durable.
// Each result line is appended to OUT (and flushed) the moment its request finishes, so the
// lines are in completion order and each carries "index" (the 0-based number of its request
// in IN, blank lines not counted). A bad line is that line's error; every other line runs.
// With resume, indices already in OUT are skipped and the rest appended.
#pragma once
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/request_line.h"
#include "deepinfer/engine.h"

namespace deepinfer::app {

// Speculative decoding counts as JSON (batch JSONL lines, bench records).
inline nlohmann::json spec_json(const SpecDecodeStats& s) {
  return {{"verify_steps", s.num_verify_steps},
          {"draft_tokens", s.num_draft_tokens},
          {"accepted_tokens", s.num_accepted_tokens},
          {"emitted_tokens", s.num_emitted_tokens},
          {"drafts_per_position", s.drafts_per_position},
          {"accepted_per_position", s.accepted_per_position},
          {"acceptance_rate", s.acceptance_rate()},
          {"mean_accepted_length", s.mean_accepted_length()},
          {"tokens_per_verify_step", s.tokens_per_verify_step()}};
}

// The step times --spec-varlen chose from (measured at start-up), as recorded by bench.
inline nlohmann::json spec_step_times_json(const SpecStepTimes& t) {
  return {{"batches", t.batches},           {"max_tokens_per_seq", t.max_tokens_per_seq},
          {"verify_s", t.verify_s},         {"mixed_s", t.mixed_s},
          {"decode_ahead_s", t.decode_ahead_s}, {"mtp_first_s", t.mtp_first_s},
          {"mtp_chain_s", t.mtp_chain_s},   {"measure_s", t.measure_s}};
}


struct BatchOptions {
  std::string input, output;
  bool resume = false;
  bool progress = true;  // progress bar on stderr
};

class BatchJob {
 public:
  // Reads IN (and with resume the indices already in OUT), opens OUT for writing (before
  // any model is loaded, so an unwritable OUT is reported at once) and writes the results
  // of lines that fail to parse. Throws Error for an unreadable IN or unwritable OUT.
  BatchJob(const BatchOptions& options, const SamplingParams& defaults);
  ~BatchJob();
  BatchJob(const BatchJob&) = delete;
  BatchJob& operator=(const BatchJob&) = delete;

  // Runs the parsed requests, appending each result as it finishes. `stop_signal` (may be
  // empty) is polled between steps; when it returns a signal number the run stops, keeps
  // every finished line and reports how many remain. Returns the exit code: 0 every
  // request succeeded, 1 some failed, 128 + signal when stopped.
  int run(Engine& engine, const std::function<int()>& stop_signal = nullptr);
  // run() with SIGINT/SIGTERM as the stop signal (handlers installed for the run, defaults
  // restored after): the first one stops after the current step; a second ends the process.
  int run_until_signalled(Engine& engine);

  size_t num_requests() const { return num_requests_; }
  size_t num_skipped() const { return skipped_; }

 private:
  struct Pending {
    size_t index;
    int64_t line_no;
    RequestLine request;
  };
  void write_line(const nlohmann::json& line);
  void write_error(size_t index, const std::string& message);

  BatchOptions options_;
  std::FILE* out_ = nullptr;
  std::vector<Pending> pending_;
  size_t num_requests_ = 0;  // non-blank input lines
  size_t skipped_ = 0;       // already in OUT (resume)
  size_t written_ = 0;       // result lines this run
  int num_errors_ = 0;
};

// Indices of the result lines in an existing output file (resume); a partial last line
// (a run killed while writing it) is cut off the file.
std::set<size_t> finished_indices(const std::string& path);

}  // namespace deepinfer::app
