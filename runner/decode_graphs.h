// DecodeGraphs: the runner's CUDA graphs of uniform steps, one per padded shape. A uniform
// step has every sequence compute q new tokens after cached context, each with its logits
// row: q = 1 is a decode step, q = 1 + k a speculative verify step.
//
// A uniform step of S sequences of q tokens whose longest context is C tokens runs padded
// to (B, q, W): B = the smallest batch bucket >= S (1, 2, 4, 8, then steps of 8 to 64, of
// 16 to 128, of 32 beyond; capped at the runner's capacity) with B * q tokens within the
// step buffers, and W = block table width covering the smallest power of two >= max(C, 256)
// tokens. Attention reads lengths on the device (each query token its own causal bound)
// and takes W * block_size as its split bound, so every step of one shape replays the same
// graph. Graphs are captured lazily (the first step of a shape runs eagerly, which also
// grows every workspace, then is captured) and all are released when the model or backend
// reallocates a workspace (their epochs change).
#pragma once
#include <cstdint>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "runner/step_inputs.h"

namespace deepinfer {

class DecodeGraphs {
 public:
  DecodeGraphs() = default;
  // max_num_seqs: most sequences a step may have; max_blocks_per_seq: widest block table;
  // max_tokens: most tokens (= logits rows) a padded step may have (0: max_num_seqs).
  DecodeGraphs(int max_num_seqs, int max_blocks_per_seq, int block_size, int max_tokens = 0);

  // Batch buckets up to max_num_seqs (the last one is max_num_seqs itself).
  static std::vector<int> batch_buckets(int max_num_seqs);
  // Padded shape for num_seqs sequences of tokens_per_seq tokens each with longest context
  // max_seq_len; num_seqs == 0 in the result when the step is too large for a graph.
  DecodePadding shape_for(int num_seqs, int tokens_per_seq, int max_seq_len) const;
  DecodePadding shape_for(int num_seqs, int max_seq_len) const { return shape_for(num_seqs, 1, max_seq_len); }

  // Graph of `shape` captured at `epoch`, or -1. Releases every graph first when the
  // epoch changed since they were captured.
  int find(Backend& backend, const DecodePadding& shape, std::pair<uint64_t, uint64_t> epoch);
  void add(Backend& backend, const DecodePadding& shape, int graph_id,
           std::pair<uint64_t, uint64_t> epoch);
  // Capture of this shape failed: run it eagerly from now on.
  void mark_failed(const DecodePadding& shape) { failed_[key(shape)] = true; }
  bool failed(const DecodePadding& shape) const { return failed_.count(key(shape)) > 0; }
  void release_all(Backend& backend);
  int num_live() const { return static_cast<int>(graphs_.size()); }

 private:
  using Key = std::tuple<int, int, int>;  // (sequences, tokens per sequence, width)
  static Key key(const DecodePadding& s) { return {s.num_seqs, s.tokens_per_seq, s.max_blocks}; }

  std::vector<int> buckets_;
  int max_blocks_per_seq_ = 0;
  int block_size_ = 1;
  int max_tokens_ = 0;
  std::map<Key, int> graphs_;  // shape -> graph id
  std::map<Key, bool> failed_;
  std::pair<uint64_t, uint64_t> epoch_{0, 0};
};

}  // namespace deepinfer
