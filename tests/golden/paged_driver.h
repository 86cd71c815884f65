// PagedDriver: a minimal test-only stand-in for runner/ + kv/: owns a paged latent
// cache per layer, hands out blocks in a scattered order (so block tables are never
// contiguous), builds StepBatches and runs Model::forward on any backend.
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

  struct Chunk {
    int seq = 0;
    std::vector<int32_t> tokens;  // appended after the sequence's cached tokens
    bool all_logits = false;      // logits for every new token, else only the last
  };
  // One forward step over several sequences. Returns one logits row per requested
  // position, in chunk order ([rows][vocab]).
  std::vector<std::vector<float>> step(const std::vector<Chunk>& chunks);

 private:
  struct Seq {
    std::vector<int32_t> tokens;
    std::vector<int32_t> blocks;
  };
  Tensor upload_i32(const std::vector<int32_t>& values, std::vector<int64_t> dims);

  Model& model_;
  Backend& backend_;
  int block_size_;
  std::vector<int32_t> free_blocks_;
  std::vector<Seq> seqs_;
  std::vector<DeviceBuffer> cache_buffers_;
  KvCaches caches_;  // one group
  std::vector<DeviceBuffer> step_buffers_;
};

}  // namespace deepinfer::test
