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
  //    drafting sequence gives draft 1. Drafting sequences come first, by drafts wanted
  //    (descending), so each chained pass is a prefix of the one before.
  std::vector<size_t> order;
  for (size_t i = 0; i < seqs.size(); ++i) order.push_back(i);
  auto wants = [&](size_t i) {
    const int n = static_cast<int>(seqs[i].token_ids.size());
    return seqs[i].max_drafts > 0 && std::min(seqs[i].computed_end, n - 1) == n - 1 && seqs[i].computed_begin < n - 1
               ? seqs[i].max_drafts
               : 0;
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return wants(a) > wants(b); });
  rows_.clear();
  drafting_.clear();   // seqs index per logits row
  hidden_of_.clear();  // per logits row: the call's token row whose output hidden state chains
  int tokens = 0;
  for (size_t i : order) {
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
    const bool want = wants(i) > 0;
    rows_.push_back({next_[i], begin, end - begin, s.block_ids, want, s.target_row + (begin - s.computed_begin),
                     s.more_block_ids});
    tokens += end - begin;
    if (want) {
      drafting_.push_back(i);
      hidden_of_.push_back(tokens - 1);  // its last row (the draft's position - 1)
    }
  }
  if (rows_.empty()) return;
  exec_.submit_mtp(rows_, true, confidences_ && !drafting_.empty(), false);
  // 2. Chain: draft d + 1 from draft d's output hidden state and token (on the device), one
  //    row per sequence; pass d + 1 is issued before the host reads pass d's drafts, unless
  //    two passes' logits cannot both wait on the host.
  const bool overlap = !confidences_ || static_cast<int>(drafting_.size()) <= exec_.max_overlapped_rows();
  alive_.assign(seqs.size(), 1);
  size_t pending_rows = drafting_.size();  // logits rows of the pending pass (a prefix of drafting_)
  for (int d = 1;; ++d) {                  // the pending pass gives draft d
    size_t next_rows = 0;                  // rows of the pass giving draft d + 1
    while (next_rows < pending_rows && seqs[drafting_[next_rows]].max_drafts > d) ++next_rows;
    auto submit_next = [&] {
      rows_.clear();
      for (size_t r = 0; r < next_rows; ++r) {
        const size_t i = drafting_[r];
        next_[i].push_back(0);  // draft d: the token comes from the device
        const int pos = static_cast<int>(seqs[i].token_ids.size()) - 2 + d;  // draft d's position - 1
        // A call's output rows are its token rows: in the first call a sequence may have several.
        rows_.push_back({next_[i], pos, 1, seqs[i].block_ids, true, d == 1 ? hidden_of_[r] : static_cast<int>(r),
                         seqs[i].more_block_ids});
      }
      exec_.submit_mtp(rows_, false, confidences_, true);
    };
    if (next_rows > 0 && overlap) submit_next();
    const MtpResult result = exec_.collect_mtp();
    DI_CHECK(result.tokens.size() == pending_rows && (!confidences_ || pending_rows == 0 || result.logits != nullptr),
             "MtpProposer: ", result.tokens.size(), " draft tokens for ", pending_rows, " rows",
             confidences_ && result.logits == nullptr ? ", no logits for the confidences" : "");
    for (size_t r = 0; r < pending_rows; ++r) {
      const size_t i = drafting_[r];
      const int32_t tok = result.tokens[r];
      if (!alive_[i]) continue;
      if (tok < 0 || tok >= vocab) {  // a NaN row (no token): this sequence's drafts end
        alive_[i] = 0;
        continue;
      }
      out[i].drafts.push_back(tok);
      if (confidences_)
        out[i].confidences.push_back(
            softmax_probability(result.logits->ptr<float>() + static_cast<int64_t>(r) * result.logits->size(1),
                                vocab, tok));
    }
    if (next_rows == 0) break;
    if (!overlap) submit_next();
    pending_rows = next_rows;
  }
}

}  // namespace deepinfer
