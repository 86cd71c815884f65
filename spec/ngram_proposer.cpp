#include <algorithm>

#include "core/error.h"
#include "spec/proposer.h"

namespace deepinfer {

NgramProposer::NgramProposer(int min_ngram, int max_ngram) : min_ngram_(min_ngram), max_ngram_(max_ngram) {
  DI_CHECK(min_ngram >= 1 && max_ngram >= min_ngram, "ngram proposer: need 1 <= min_ngram <= max_ngram, got ",
           min_ngram, " and ", max_ngram);
}

std::vector<int32_t> NgramProposer::lookup(std::span<const int32_t> t, int max_drafts, int min_ngram,
                                           int max_ngram) {
  const int n_tok = static_cast<int>(t.size());
  for (int n = std::min(max_ngram, n_tok - 1); n >= min_ngram && max_drafts > 0; --n) {
    const auto tail = t.subspan(static_cast<size_t>(n_tok - n));
    // Latest earlier occurrence whose match is followed by at least one token.
    for (int start = n_tok - n - 1; start >= 0; --start) {
      if (!std::equal(tail.begin(), tail.end(), t.begin() + start)) continue;
      const int from = start + n;
      const int count = std::min(max_drafts, n_tok - from);
      return std::vector<int32_t>(t.begin() + from, t.begin() + from + count);
    }
  }
  return {};
}

void NgramProposer::propose(std::span<const ProposeSeq> seqs, std::vector<Proposal>& out) {
  out.assign(seqs.size(), Proposal{});
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i].max_drafts <= 0) continue;
    out[i].drafts = lookup(seqs[i].token_ids, seqs[i].max_drafts, min_ngram_, max_ngram_);
    out[i].confidences.assign(out[i].drafts.size(), 0.5f);
  }
}

}  // namespace deepinfer
