// Runner: turns the scheduler's decision into a StepBatch on the model's
// backend, owns the paged KV cache memory and the step's device buffers, runs
// the forward and hands back the logits rows that will be sampled.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "kv/block_manager.h"
#include "model/model.h"

namespace deepinfer {

struct RunnerConfig {
  int num_kv_blocks = 0;
  int kv_block_size = 16;
  int max_num_batched_tokens = 8192;  // capacity of the step buffers
  int max_num_seqs = 256;
  int max_model_len = 0;              // capacity of one block table row (in tokens)
};

// One sequence's part of a step: tokens [num_computed, num_computed + num_new)
// of token_ids are computed; their KV rows go to the slots of block_ids.
struct RunSeq {
  std::span<const int32_t> token_ids;
  int num_computed = 0;
  int num_new = 0;
  std::span<const int32_t> block_ids;
  bool needs_logits = false;  // logits of its last new token are returned
};

class Runner {
 public:
  Runner(Model& model, Backend& backend, const RunnerConfig& config);

  // Runs one step. Returns host F32 logits [number of seqs with needs_logits, vocab],
  // in the order of `seqs`; valid until the next call.
  const Tensor& execute(std::span<const RunSeq> seqs);
  // Same step, but only the argmax of each logits row comes back (lowest id on
  // ties): greedy batches skip copying [rows, vocab] logits to the host.
  const std::vector<int32_t>& execute_argmax(std::span<const RunSeq> seqs);
  // KV copy-on-write: copies every layer's rows of each src block to its dst block,
  // in order, before the next submitted step (runner/block_copy.cpp).
  void copy_blocks(std::span<const BlockCopy> copies);
  // Bytes of KV cache per block (all layers), for sizing.
  static int64_t kv_bytes_per_block(const Model& model, DType dtype, int block_size);

 private:
  // Builds the StepBatch, runs the model; returns the device logits [num_logits, vocab].
  Tensor forward(std::span<const RunSeq> seqs);
  Tensor upload(const std::vector<int32_t>& host, DeviceBuffer& buffer,
                std::initializer_list<int64_t> dims);

  Model& model_;
  Backend& backend_;
  RunnerConfig config_;
  std::vector<DeviceBuffer> kv_memory_;  // per layer [num_blocks, block_size, kv_row_dim]
  std::vector<Tensor> kv_cache_;
  DeviceBuffer token_ids_, positions_, query_start_, seq_lens_, block_tables_, slot_mapping_,
      logits_indices_, logits_, argmax_ids_;
  std::vector<int32_t> host_ids_;
  HostBuffer host_logits_;
  Tensor host_logits_view_;
};

}  // namespace deepinfer
