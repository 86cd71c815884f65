// PagedDriver: a minimal test-only stand-in for runner/ + kv/: owns a paged cache per
// layer of every KV group the model declares (kv/kv_groups.h), hands out blocks in a
// scattered order (so block tables are never contiguous, and each group's differ), builds
// StepBatches and runs Model::forward on any backend. Compressed groups (tokens_per_row N)
// get one row per N tokens; window groups free the blocks a step's queries can no longer
// read, fill them with NaN and hand them out again first, so a model reading a freed row
// or another group's rows gives wrong (or NaN) logits.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace deepinfer::test {

class PagedDriver {
 public:
  PagedDriver(Model& model, Backend& backend, int block_size = 16, int num_blocks = 64);

  // Starts an empty sequence and returns its id.
  int add_sequence();
  int seq_len(int seq) const { return static_cast<int>(seqs_[seq].tokens.size()); }
  // Gives back every block of `seq` (filled with NaN); the sequence is empty afterwards.
  void release(int seq);
  // Blocks of KV group g that `seq` holds (freed window entries not counted).
  int held_blocks(int seq, int g) const;
  // Fills every cache row with NaN, so a model reading a row no step wrote gives NaN logits.
  void fill_nan();

  struct Chunk {
    int seq = 0;
    std::vector<int32_t> tokens;  // appended after the sequence's cached tokens
    bool all_logits = false;      // logits for every new token, else only the last
    bool logits = true;           // false: no logits row at all (a prompt chunk before the last)
    int replay_floor = 0;         // StepBatch::host_replay_floor (a model's prefill truncation)
  };
  // One forward step over several sequences. Returns one logits row per requested
  // position, in chunk order ([rows][vocab]).
  std::vector<std::vector<float>> step(const std::vector<Chunk>& chunks);

  // With capture_hidden, step() also asks forward for its hidden rows (Model::mtp_hidden_size()
  // columns per new token) and keeps them in last_hidden ([tokens][columns], chunk order).
  bool capture_hidden = false;
  std::vector<float> last_hidden;
  // The caches and a sequence's table in group g (-1: freed), for a drafter reading them.
  KvCaches& caches() { return caches_; }
  const std::vector<int32_t>& table(int seq, int g) const { return seqs_[seq].blocks[g]; }

 private:
  struct Seq {
    std::vector<int32_t> tokens;
    std::vector<std::vector<int32_t>> blocks;  // [group][table entry]; -1: freed
  };
  Tensor upload_i32(const std::vector<int32_t>& values, std::vector<int64_t> dims);
  void free_block(int g, int32_t block);

  Model& model_;
  Backend& backend_;
  int block_size_;
  int num_blocks_ = 0;
  std::vector<KvGroupSpec> groups_;
  std::vector<std::vector<int32_t>> free_blocks_;  // [group]; back = next taken
  std::vector<Seq> seqs_;
  std::vector<DeviceBuffer> cache_buffers_;
  KvCaches caches_;  // [group][layer]
  std::vector<DeviceBuffer> step_buffers_;
};

}  // namespace deepinfer::test
