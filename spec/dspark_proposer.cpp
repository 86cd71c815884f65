#include <algorithm>

#include "core/error.h"
#include "spec/proposer.h"

namespace deepinfer {

void DsparkProposer::propose(std::span<const ProposeSeq> seqs, std::vector<Proposal>& out) {
  out.assign(seqs.size(), Proposal{});
  in_.clear();
  index_.clear();
  for (size_t i = 0; i < seqs.size(); ++i) {
    const ProposeSeq& s = seqs[i];
    const int n = static_cast<int>(s.token_ids.size());
    // Only a sequence whose last token is sampled and not computed yet drafts after it.
    if (s.max_drafts <= 0 || n < 1 || s.computed_end != n - 1) continue;
    in_.push_back({s.token_ids[static_cast<size_t>(n - 1)], n - 1, s.block_ids});
    index_.push_back(i);
  }
  if (in_.empty()) return;
  exec_.draft_blocks(in_, got_);
  DI_CHECK(got_.size() == in_.size(), "DsparkProposer: ", got_.size(), " blocks for ", in_.size(), " sequences");
  for (size_t r = 0; r < in_.size(); ++r) {
    Proposal& p = got_[r];
    const ProposeSeq& s = seqs[index_[r]];
    DI_CHECK(p.confidences.empty() || p.confidences.size() == p.drafts.size(), "DsparkProposer: ",
             p.confidences.size(), " confidences for ", p.drafts.size(), " drafts");
    size_t keep = std::min(p.drafts.size(), static_cast<size_t>(s.max_drafts));
    for (size_t j = 0; j < keep; ++j)
      if (p.drafts[j] < 0) keep = j;  // no token (a NaN row): the block ends there
    p.drafts.resize(keep);
    if (!p.confidences.empty()) p.confidences.resize(keep);
    out[index_[r]] = std::move(p);
  }
}

}  // namespace deepinfer
