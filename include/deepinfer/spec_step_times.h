// SpecStepTimes: what confidence-scheduled verification (spec_varlen, SPEC_DECODING.md)
// chooses from: the engine's step times measured at start-up on the shapes its steps run
// as (on CUDA the graphed uniform verify shapes; on the CPU the real step). Plain data:
// EngineStats shows the table the engine measured, EngineConfig may hand one in.
#pragma once
#include <vector>

namespace deepinfer {

struct SpecStepTimes {
  std::vector<int> batches;     // sequences per measured step, ascending (>= 1)
  int max_tokens_per_seq = 0;   // verify shapes measured: 1..this tokens per sequence (1 + k)
  // [batches x max_tokens_per_seq], row-major: seconds of a target step of b sequences that
  // each compute q tokens after cached context, each with its logits row (q = 1: decode;
  // graphed where the backend has graphs); the host's wait for the result included.
  std::vector<double> verify_s;
  // [batches] or empty: seconds of a step whose sequences' lengths differ (runs eagerly on a
  // backend with graphs), measured at b sequences of max_tokens_per_seq tokens, one of them
  // one token short. Empty: a mixed step costs what a uniform one of its mean length does
  // (the CPU: no graphs).
  std::vector<double> mixed_s;
  // [batches] or empty: seconds per decode step (q = 1) when the next step is issued before
  // the previous one's tokens are read (asynchronous scheduling: what k = 0 runs as).
  std::vector<double> decode_ahead_s;
  // [batches] or empty (model-free proposer): seconds of the MTP layer's first pass (two
  // rows per sequence: newly verified positions) and of one chained pass (one row per
  // sequence), the host's wait for the drafts included. A block drafter (V4.1's DSpark): its
  // block forward at b sequences in mtp_first_s, mtp_chain_s 0 (every draft of a block at once).
  std::vector<double> mtp_first_s, mtp_chain_s;
  double measure_s = 0.0;  // wall time the measurement took
  bool empty() const { return batches.empty(); }
};

}  // namespace deepinfer
