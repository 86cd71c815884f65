// Draft proposers for speculative decoding (SPEC_DECODING.md). After every target step the
// engine tells the proposer which positions of each sequence the step verified, and asks
// for up to max_drafts draft tokens to follow the sequence's last token. Drafts only
// decide how many tokens a verify step may accept: verification is exact (the engine
// samples each position as non-speculative decoding would), so output never depends on
// them.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace deepinfer {

// One sequence of the step just done.
struct ProposeSeq {
  std::span<const int32_t> token_ids;  // verified tokens: prompt + output (no drafts)
  // Positions [computed_begin, computed_end) were computed by the step and are verified
  // (their input tokens are all in token_ids); computed_end <= token_ids.size().
  int computed_begin = 0;
  int computed_end = 0;
  std::span<const int32_t> block_ids;  // KV blocks (cover every position a draft may write)
  int target_row = 0;  // row of position computed_begin in the step's target hidden states
  int max_drafts = 0;  // 0: draft nothing (a prefill chunk), but observe the positions
  // The block tables of the MTP layer's further KV groups (Model::num_mtp_kv_groups() > 1,
  // V3.2's indexer keys); block_ids is its first group's.
  std::span<const std::vector<int32_t>> more_block_ids = {};
};

struct Proposal {
  std::vector<int32_t> drafts;      // [<= max_drafts]
  // [drafts.size()]: P(draft j survives | draft j-1 did); empty when the proposer was asked
  // for none (MtpProposer without confidences).
  std::vector<float> confidences;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual std::string name() const = 0;
  // out[i] for seqs[i]; every sequence of the step is passed, also those drafting nothing.
  virtual void propose(std::span<const ProposeSeq> seqs, std::vector<Proposal>& out) = 0;
};

// Model-free proposer: finds the latest earlier occurrence of the sequence's last n
// tokens (n from max_ngram down to min_ngram) in its prompt + output and proposes the
// tokens that followed it. Confidence: a fixed 0.5 per draft.
class NgramProposer final : public Proposer {
 public:
  explicit NgramProposer(int min_ngram = 1, int max_ngram = 3);
  std::string name() const override { return "ngram"; }
  void propose(std::span<const ProposeSeq> seqs, std::vector<Proposal>& out) override;
  // One sequence (exposed for tests).
  static std::vector<int32_t> lookup(std::span<const int32_t> tokens, int max_drafts, int min_ngram,
                                     int max_ngram);

 private:
  int min_ngram_, max_ngram_;
};

// What the MTP proposer needs from the runner: run the model's MTP layer over rows and
// return the argmax token of each row with want_logits (chosen on the device), and the
// host logits of those rows only when asked (confidences).
struct MtpRows {
  // Row tokens: next_tokens[p] is the token after position p (the sequence's tokens
  // shifted by one, drafts appended); rows are positions [begin, begin + count).
  std::span<const int32_t> next_tokens;
  int begin = 0;
  int count = 0;
  std::span<const int32_t> block_ids;
  bool want_logits = false;  // logits of the last row
  int hidden_row = 0;        // hidden input of row p: source row hidden_row + (p - begin)
  std::span<const std::vector<int32_t>> more_block_ids = {};  // ProposeSeq::more_block_ids
};
struct MtpResult {
  // [rows with want_logits]: argmax over the first vocab_size() columns, lowest id on ties.
  std::span<const int32_t> tokens;
  // Host F32 [rows with want_logits, >= vocab_size()] when run_mtp was asked for them;
  // else null (no [rows, vocab] copy to the host).
  const Tensor* logits = nullptr;
};
class MtpExecutor {
 public:
  virtual ~MtpExecutor() = default;
  // Issues one pass over `rows` and returns without waiting; its result comes from
  // collect_mtp, in issue order, at most two pending. hidden_from_target: the rows' hidden
  // inputs are rows of the last target step's hidden states; else rows of the previous
  // pass's output hidden states (chaining). tokens_from_previous (a chained pass, one row
  // per sequence): row r's token is the previous pass's draft r, taken on the device (the
  // host's next_tokens entry is not read), so passes follow each other without a host wait.
  virtual void submit_mtp(std::span<const MtpRows> rows, bool hidden_from_target, bool want_logits,
                          bool tokens_from_previous) = 0;
  virtual MtpResult collect_mtp() = 0;
  // Two pending passes that want logits may have this many logits rows each.
  virtual int max_overlapped_rows() const = 0;
  MtpResult run_mtp(std::span<const MtpRows> rows, bool hidden_from_target, bool want_logits) {
    submit_mtp(rows, hidden_from_target, want_logits, false);
    return collect_mtp();
  }
  // Columns drafts are chosen from (the engine's sample_vocab: padding rows never drafted).
  virtual int vocab_size() const = 0;
  // The MTP layer's attention window W (0: none). With one, a step's rows before its last
  // W positions are not run: no later MTP query reads their rows (the window group has
  // freed them).
  virtual int kv_window() const { return 0; }
};

// DeepSeek-V3 MTP: draft 1 from the MTP layer on the target's last hidden state (after
// the final norm) and the sequence's last token; drafts 2..k chain the same layer on its
// own output hidden state and the previous draft. Each step it first runs the layer over
// every newly verified position (so its latent KV covers the whole sequence) and takes
// draft 1 from the last one. Chained passes take their tokens on the device and are issued
// one ahead of the host reading the previous pass's drafts (sequences ordered by drafts
// wanted, so the ones that stop drafting leave the tail); a sequence whose draft is not a
// token (NaN row) keeps being computed and its later drafts are dropped. Drafts are the argmax of the MTP logits (on the device). With
// `confidences` (confidence-scheduled verification) each draft's confidence is its softmax
// probability (the logits come to the host for it); without, Proposal::confidences stays
// empty and nothing of [rows, vocab] leaves the device.
class MtpProposer final : public Proposer {
 public:
  explicit MtpProposer(MtpExecutor& executor, bool confidences = true)
      : exec_(executor), confidences_(confidences) {}
  std::string name() const override { return "mtp"; }
  void propose(std::span<const ProposeSeq> seqs, std::vector<Proposal>& out) override;

 private:
  MtpExecutor& exec_;
  bool confidences_;
  std::vector<std::vector<int32_t>> next_;  // per sequence: shifted tokens + drafts
  std::vector<MtpRows> rows_;
  std::vector<size_t> drafting_;  // seqs index per drafting row, by max_drafts descending
  std::vector<int> hidden_of_;
  std::vector<char> alive_;
};

// What a block drafter (one forward drafts a block: DSpark) needs from the runner.
struct BlockDraftSeq {
  int32_t anchor = 0;      // the sequence's last token (sampled, not computed yet)
  int64_t anchor_pos = 0;  // its position (= the tokens computed before it)
  std::span<const int32_t> block_ids;  // the drafter's KV blocks (ProposeSeq::block_ids)
};
class BlockDraftExecutor {
 public:
  virtual ~BlockDraftExecutor() = default;
  // out[i]: up to block_size() drafts of seqs[i] (ids < the engine's sample_vocab) and, with a
  // confidence head, one confidence per draft.
  virtual void draft_blocks(std::span<const BlockDraftSeq> seqs, std::vector<Proposal>& out) = 0;
  virtual int block_size() const = 0;
};

// DeepSeek's DSpark drafter (bench/NOTES.md "V4.1 DSpark drafter"; model/deepseek_v41/dspark.h):
// the target's own steps write the drafter's context rows (every computed position; a block reads
// only the rows before its anchor, which are verified), so proposing is one block forward per
// sequence whose last token is sampled and not computed: drafts 1..min(block, max_drafts) and, with
// the drafter's confidence head, c_j = P(draft j accepted | drafts < j were), what
// schedule_verify_lengths reads. A sequence drafting nothing is not run.
class DsparkProposer final : public Proposer {
 public:
  explicit DsparkProposer(BlockDraftExecutor& executor) : exec_(executor) {}
  std::string name() const override { return "dspark"; }
  void propose(std::span<const ProposeSeq> seqs, std::vector<Proposal>& out) override;

 private:
  BlockDraftExecutor& exec_;
  std::vector<BlockDraftSeq> in_;
  std::vector<size_t> index_;
  std::vector<Proposal> got_;
};

// Softmax probability of `token` in a logits row of `vocab` columns.
float softmax_probability(const float* logits, int64_t vocab, int32_t token);

}  // namespace deepinfer
