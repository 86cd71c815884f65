#include <cmath>

#include "core/error.h"
#include "spec/proposer.h"

namespace deepinfer {

std::pair<int32_t, float> top_token(const float* logits, int64_t vocab) {
  int32_t best = 0;
  for (int64_t v = 1; v < vocab; ++v)
    if (logits[v] > logits[best]) best = static_cast<int32_t>(v);
  double sum = 0.0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(logits[v] - logits[best]));
  return {best, static_cast<float>(1.0 / sum)};
}

void MtpProposer::propose(std::span<const ProposeSeq> seqs, std::vector<Proposal>& out) {
  out.assign(seqs.size(), Proposal{});
  const int64_t vocab = exec_.vocab_size();
  next_.resize(seqs.size());
  // 1. Every newly verified position p gets its MTP row (h_p, t_{p+1}); the last one of a
  //    drafting sequence gives draft 1.
  std::vector<MtpRows> rows;
  std::vector<size_t> drafting;  // seqs index per logits row
  for (size_t i = 0; i < seqs.size(); ++i) {
    const ProposeSeq& s = seqs[i];
    const int n = static_cast<int>(s.token_ids.size());
    // Row p needs t_{p+1}: positions up to n - 2.
    const int end = std::min(s.computed_end, n - 1);
    if (end <= s.computed_begin) continue;
    next_[i].assign(s.token_ids.begin() + 1, s.token_ids.end());
    const bool want = s.max_drafts > 0 && end == n - 1;
    rows.push_back({next_[i], s.computed_begin, end - s.computed_begin, s.block_ids, want, s.target_row});
    if (want) drafting.push_back(i);
  }
  if (rows.empty()) return;
  const Tensor* logits = &exec_.run_mtp(rows, true);
  // 2. Chain: draft j + 1 from draft j's output hidden state, one row per sequence.
  for (int j = 0; !drafting.empty(); ++j) {
    std::vector<size_t> still;
    rows.clear();
    for (size_t r = 0; r < drafting.size(); ++r) {
      const size_t i = drafting[r];
      const auto [tok, p] = top_token(logits->ptr<float>() + static_cast<int64_t>(r) * vocab, vocab);
      out[i].drafts.push_back(tok);
      out[i].confidences.push_back(p);
      if (static_cast<int>(out[i].drafts.size()) >= seqs[i].max_drafts) continue;
      next_[i].push_back(tok);
      const int pos = static_cast<int>(seqs[i].token_ids.size()) - 1 + j;  // the draft's position
      rows.push_back({next_[i], pos, 1, seqs[i].block_ids, true, static_cast<int>(r)});
      still.push_back(i);
    }
    drafting = std::move(still);
    if (drafting.empty()) break;
    logits = &exec_.run_mtp(rows, false);
  }
}

}  // namespace deepinfer
