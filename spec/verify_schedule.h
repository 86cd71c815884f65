// Confidence-scheduled verification (DSpark; SPEC_DECODING.md): per step, how many of
// each request's drafts to verify. Survival a_{r,j} = prod_{i<=j} c_{r,i}; verifying l_r
// drafts of each request sends B = sum_r (1 + l_r) tokens and expects
// tau = sum_r (1 + sum_{j<=l_r} a_{r,j}) emitted tokens. With step_seconds(B) from a table
// measured at start-up, choose the l_r maximising tau / step_seconds(B): admit (r, j) in
// order of a_{r,j} (descending; a is non-increasing in j, so prefixes are kept) and keep
// the best prefix of admissions (no early stop). Verification is exact, so any lengths
// give the same output; this only decides the speed.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace deepinfer {

// Step time by tokens per step: measured points (tokens ascending, seconds), linear in
// between, linear extrapolation from the last two beyond.
class StepTimeTable {
 public:
  StepTimeTable() = default;
  StepTimeTable(std::vector<int> tokens, std::vector<double> seconds);
  double seconds(int tokens) const;
  bool empty() const { return tokens_.empty(); }
  std::span<const int> tokens() const { return tokens_; }

 private:
  std::vector<int> tokens_;
  std::vector<double> seconds_;
};

// confidences[r]: request r's draft confidences (c_{r,1..k_r}). Returns l_r in [0, k_r].
std::vector<int> schedule_verify_lengths(std::span<const std::vector<float>> confidences,
                                         const StepTimeTable& table);

}  // namespace deepinfer
