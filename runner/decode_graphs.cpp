#include "runner/decode_graphs.h"

#include <algorithm>

namespace deepinfer {
namespace {
// More graphs than this (many context buckets x batch buckets) are released and
// re-captured on use rather than kept: each holds a few hundred kernel nodes.
constexpr int kMaxLiveGraphs = 96;  // decode and verify (1 + k) shapes
constexpr int kMinContextBucket = 256;
}  // namespace

DecodeGraphs::DecodeGraphs(int max_num_seqs, int max_blocks_per_seq, int block_size, int max_tokens)
    : buckets_(batch_buckets(max_num_seqs)),
      max_blocks_per_seq_(max_blocks_per_seq),
      block_size_(block_size),
      max_tokens_(max_tokens > 0 ? max_tokens : max_num_seqs) {}

std::vector<int> DecodeGraphs::batch_buckets(int max_num_seqs) {
  std::vector<int> out;
  for (int b = 1; b < max_num_seqs;) {
    out.push_back(b);
    b = b < 8 ? 2 * b : b < 64 ? b + 8 : b < 128 ? b + 16 : b + 32;
  }
  if (max_num_seqs > 0) out.push_back(max_num_seqs);
  return out;
}

DecodePadding DecodeGraphs::shape_for(int num_seqs, int tokens_per_seq, int max_seq_len) const {
  DecodePadding pad;
  auto it = std::lower_bound(buckets_.begin(), buckets_.end(), num_seqs);
  if (num_seqs <= 0 || tokens_per_seq <= 0 || it == buckets_.end() ||
      int64_t{*it} * tokens_per_seq > max_tokens_)
    return pad;
  int64_t context = kMinContextBucket;
  while (context < max_seq_len) context *= 2;
  const int64_t width = std::min<int64_t>((context + block_size_ - 1) / block_size_,
                                          max_blocks_per_seq_);
  if (width * block_size_ < max_seq_len) return pad;
  pad.num_seqs = *it;
  pad.tokens_per_seq = tokens_per_seq;
  pad.max_blocks = static_cast<int>(width);
  pad.max_seq_len = static_cast<int>(width * block_size_);
  return pad;
}

int DecodeGraphs::find(Backend& backend, const DecodePadding& shape,
                       std::pair<uint64_t, uint64_t> epoch) {
  if (epoch != epoch_) {
    release_all(backend);
    epoch_ = epoch;
  }
  auto it = graphs_.find(key(shape));
  return it == graphs_.end() ? -1 : it->second;
}

void DecodeGraphs::add(Backend& backend, const DecodePadding& shape, int graph_id,
                       std::pair<uint64_t, uint64_t> epoch) {
  if (epoch != epoch_ || num_live() >= kMaxLiveGraphs) {
    release_all(backend);
    epoch_ = epoch;
  }
  graphs_[key(shape)] = graph_id;
}

void DecodeGraphs::release_all(Backend& backend) {
  if (graphs_.empty()) return;
  backend.synchronize();  // none of them may still be running
  for (const auto& [k, id] : graphs_) backend.graph_release(id);
  graphs_.clear();
}

}  // namespace deepinfer
