// The runner tests' fixture: a CPU backend, the engine tests' FakeModel and a small runner
// (16 blocks of 4 tokens, 4 sequences, 64 tokens per step and per sequence).
#pragma once
#include <memory>
#include <vector>

#include "../engine/fake_model.h"
#include "runner/runner.h"

namespace deepinfer {

constexpr int kVocab = 64;

struct Fixture {
  std::unique_ptr<Backend> backend;
  testing::FakeModel model{kVocab, 1, 256};
  std::unique_ptr<Runner> runner;
  Fixture() {
    BackendOptions bo;
    bo.num_threads = 1;
    backend = make_cpu_backend(bo);
    RunnerConfig rc;
    rc.num_kv_blocks = 16;
    rc.kv_block_size = 4;
    rc.max_num_batched_tokens = 64;
    rc.max_num_seqs = 4;
    rc.max_model_len = 64;
    runner = std::make_unique<Runner>(model, *backend, rc);
  }
};

// Block tables of the two sequences the tests run.
inline const std::vector<int32_t> kBlocksA = {3, 9, 5}, kBlocksB = {0, 12, 7};

}  // namespace deepinfer
