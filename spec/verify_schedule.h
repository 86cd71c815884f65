// Confidence-scheduled verification (DSpark; SPEC_DECODING.md): how many drafts to make
// and verify per step, from step times measured on the shapes the engine's steps run as
// (deepinfer/spec_step_times.h). Two decisions, both maximising expected emitted tokens
// per second:
//  1. before drafting, the step's draft depth d in 0..k, from the expected survival a_j
//     of draft position j (measured acceptance): Theta(d) = S (1 + sum_{j<=d} a_j) /
//     (verify(S, 1 + d) + drafting(S, d)), Theta(0) = S / decode(S) (with asynchronous
//     scheduling where k = 0 would run so). d = 0 drafts nothing: the step runs as k = 0
//     does, so speculation never costs more than the table says it saves;
//  2. after drafting (drafting spent), each request's verify length l_r <= its drafts from
//     the drafts' confidences c_{r,j}: survival a_{r,j} = prod_{i<=j} c_{r,i}, expected
//     tau = sum_r (1 + sum_{j<=l_r} a_{r,j}) over step_seconds(l). Candidates: one length
//     for every request (uniform: a graphed shape on CUDA) and DSpark's admissions of
//     (r, j) by descending a_{r,j} (every prefix; mixed lengths cost what the table says an
//     eager step costs). Ties keep the shorter plan.
// Verification is exact, so any lengths give the same output; this only decides the speed.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "deepinfer/spec_step_times.h"

namespace deepinfer {

// Step seconds from a measured SpecStepTimes: linear between measured batches (the first
// one's below, extrapolated from the last two beyond), linear in tokens per sequence.
class StepCost {
 public:
  StepCost() = default;
  // Throws Error naming the field when the table is inconsistent.
  explicit StepCost(SpecStepTimes table);
  bool empty() const { return t_.empty(); }
  const SpecStepTimes& table() const { return t_; }
  // Target step of num_seqs sequences of tokens_per_seq (>= 1, fractional: a mixed step's
  // mean) tokens; mixed: their lengths differ (adds the eager overhead where measured).
  double verify_seconds(int num_seqs, double tokens_per_seq, bool mixed = false) const;
  // Target step where sequence r verifies drafts[r] drafts (computes 1 + drafts[r] tokens).
  double step_seconds(std::span<const int> drafts) const;
  // A decode step (k = 0); ahead: issued before the previous one's tokens are read.
  double decode_seconds(int num_seqs, bool ahead) const;
  // Drafting depth drafts for num_seqs sequences (0 for depth 0 and for a model-free proposer).
  double draft_seconds(int num_seqs, int depth) const;

 private:
  double at(std::span<const double> per_batch, int num_seqs) const;  // linear in batch
  SpecStepTimes t_;
};

// Decision 1: survival[j - 1] = a_j (expected, unconditional: the fraction of drafts at
// position j accepted), max_depth <= survival.size(); ahead: k = 0 would run with
// asynchronous scheduling. min_gain: drafting must promise at least this factor over d = 0.
// Returns d in [0, max_depth].
int choose_draft_depth(std::span<const double> survival, int num_seqs, int max_depth, const StepCost& cost,
                       bool ahead, double min_gain = 1.0);

// Decision 2: confidences[r] = c_{r,1..k_r} (request r's drafts). Returns l_r in [0, k_r].
std::vector<int> schedule_verify_lengths(std::span<const std::vector<float>> confidences, const StepCost& cost);

}  // namespace deepinfer
