// The engine's per-request and per-sample state. A SeqState is the scheduler's
// Sequence plus what the engine adds on top: detokenizer, text, stop state,
// grammar matcher and timing.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/engine.h"
#include "grammar/grammar.h"
#include "sched/sequence.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

struct RequestState;

struct SeqState : Sequence {
  RequestState* request = nullptr;
  int index = 0;       // sample index within the request
  uint64_t stream = 0; // RNG stream: seq_seed + index
  std::unique_ptr<IncrementalDecoder> decoder;
  std::unique_ptr<grammar::GrammarMatcher> matcher;
  std::string text;
  size_t num_text_emitted = 0;    // bytes of text already streamed
  size_t num_tokens_emitted = 0;  // output tokens already streamed
  FinishReason finish_reason = FinishReason::None;
  std::string stop_reason;
  std::string error;  // why it ended with FinishReason::Error (e.g. NaN logits)
  std::vector<TokenLogprob> logprobs;
};

struct RequestState {
  std::string request_id;
  SamplingParams params;
  uint64_t seed = 0;
  std::vector<int32_t> prompt_token_ids;
  std::vector<std::unique_ptr<SeqState>> seqs;  // [n]
  size_t max_stop_len = 0;
  double time_added_s = 0.0;
  double time_first_token_s = -1.0;
  double time_finished_s = -1.0;
  int num_finished = 0;
  SpecDecodeStats spec;
  // spec_varlen 1: this request's accepted / verified drafts by draft position, decayed per
  // verify step (its draft confidences come from them, blended with the run's).
  std::vector<double> spec_accepted_decayed, spec_drafted_decayed;
  // SamplingParams::prompt_logprobs: entry p is prompt token p + 1, filled by sample 0's prefill
  // steps from the logits of position p; positions [0, num_prompt_logprobs) are done.
  std::vector<PromptLogprob> prompt_logprobs;
  int num_prompt_logprobs = 0;
  bool prompt_logprobs_sent = false;  // in an update already (sent again in the final one)
  bool prompt_logprobs_done() const {
    return num_prompt_logprobs >= static_cast<int>(prompt_token_ids.size()) - 1;
  }
  bool finished() const { return num_finished == static_cast<int>(seqs.size()); }
};

}  // namespace deepinfer
