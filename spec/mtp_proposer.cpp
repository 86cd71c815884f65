#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "spec/proposer.h"

namespace deepinfer {

float softmax_probability(const float* logits, int64_t vocab, int32_t token) {
  DI_CHECK(token >= 0 && token < vocab, "softmax_probability: token ", token, " outside [0, ", vocab, ")");
  const double top = logits[token];
  double sum = 0.0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(logits[v]) - top);
  return static_cast<float>(1.0 / sum);
}

void MtpProposer::propose(std::span<const ProposeSeq> seqs, std::vector<Proposal>& out) {
  out.assign(seqs.size(), Proposal{});
  const int64_t vocab = exec_.vocab_size();
  next_.resize(seqs.size());
  // 1. Every newly verified position p gets its MTP row (h_p, t_{p+1}); the last one of a
  //    drafting sequence gives draft 1.
  rows_.clear();
  drafting_.clear();  // seqs index per logits row
  hidden_of_.clear();  // per logits row: the call's token row whose output hidden state chains
  int tokens = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const ProposeSeq& s = seqs[i];
    const int n = static_cast<int>(s.token_ids.size());
    // Row p needs t_{p+1}: positions up to n - 2.
    const int end = std::min(s.computed_end, n - 1);
    // A window W: later MTP queries (positions >= computed_end - 1) read rows from
    // computed_end - W on only.
    const int window = exec_.kv_window();
    const int begin = window > 0 ? std::max(s.computed_begin, s.computed_end - window) : s.computed_begin;
    if (end <= begin) continue;
    next_[i].assign(s.token_ids.begin() + 1, s.token_ids.end());
    const bool want = s.max_drafts > 0 && end == n - 1;
    rows_.push_back({next_[i], begin, end - begin, s.block_ids, want, s.target_row + (begin - s.computed_begin)});
    tokens += end - begin;
    if (want) {
      drafting_.push_back(i);
      hidden_of_.push_back(tokens - 1);  // its last row (the draft's position - 1)
    }
  }
  if (rows_.empty()) return;
  MtpResult result = exec_.run_mtp(rows_, true, confidences_ && !drafting_.empty());
  // 2. Chain: draft j + 1 from draft j's output hidden state, one row per sequence.
  for (int j = 0; !drafting_.empty(); ++j) {
    DI_CHECK(result.tokens.size() == drafting_.size() && (!confidences_ || result.logits != nullptr),
             "MtpProposer: ", result.tokens.size(), " draft tokens for ", drafting_.size(), " rows",
             confidences_ && result.logits == nullptr ? ", no logits for the confidences" : "");
    still_.clear();
    rows_.clear();
    for (size_t r = 0; r < drafting_.size(); ++r) {
      const size_t i = drafting_[r];
      const int32_t tok = result.tokens[r];
      if (tok < 0 || tok >= vocab) continue;  // a NaN row (no token): this sequence's drafts end
      out[i].drafts.push_back(tok);
      if (confidences_)
        out[i].confidences.push_back(
            softmax_probability(result.logits->ptr<float>() + static_cast<int64_t>(r) * result.logits->size(1),
                                vocab, tok));
      if (static_cast<int>(out[i].drafts.size()) >= seqs[i].max_drafts) continue;
      next_[i].push_back(tok);
      const int pos = static_cast<int>(seqs[i].token_ids.size()) - 1 + j;  // the draft's position
      // Chain on the output hidden state of the row that drafted tok (a call's output rows
      // are its token rows: in the first call a sequence may have several).
      rows_.push_back({next_[i], pos, 1, seqs[i].block_ids, true, hidden_of_[r]});
      still_.push_back(i);
    }
    std::swap(drafting_, still_);
    hidden_of_.resize(drafting_.size());
    for (size_t r = 0; r < drafting_.size(); ++r) hidden_of_[r] = static_cast<int>(r);  // one row each
    if (drafting_.empty()) break;
    result = exec_.run_mtp(rows_, false, confidences_);
  }
}

}  // namespace deepinfer
