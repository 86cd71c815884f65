#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "deepinfer/engine.h"
#include "engine/engine_impl.h"
#include "fake_model.h"

namespace deepinfer::testing {

constexpr int kVocab = 64;
constexpr int kEos = 1;

inline std::unique_ptr<Engine> make_fake_engine(EngineConfig cfg, int max_len = 4096) {
  BackendOptions bo;
  bo.num_threads = 1;
  auto impl = std::make_unique<Engine::Impl>(cfg, make_cpu_backend(bo),
                                             std::make_unique<FakeModel>(kVocab, kEos, max_len), nullptr);
  return std::make_unique<Engine>(std::move(impl));
}

// Token ids in [2, kVocab): never EOS (1) or 0.
inline std::vector<int32_t> random_tokens(std::mt19937& rng, int len) {
  std::vector<int32_t> t(len);
  for (auto& x : t) x = 2 + static_cast<int32_t>(rng() % (kVocab - 2));
  return t;
}

// Same tokens, finish and stop reasons for every sample of every request.
inline void expect_same_outputs(const std::vector<RequestOutput>& a, const std::vector<RequestOutput>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].outputs.size(), b[i].outputs.size()) << "request " << i;
    for (size_t j = 0; j < a[i].outputs.size(); ++j) {
      EXPECT_EQ(a[i].outputs[j].token_ids, b[i].outputs[j].token_ids) << "request " << i << " sample " << j;
      EXPECT_EQ(a[i].outputs[j].finish_reason, b[i].outputs[j].finish_reason) << "request " << i;
      EXPECT_EQ(a[i].outputs[j].stop_reason, b[i].outputs[j].stop_reason) << "request " << i;
    }
  }
}

inline SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

}  // namespace deepinfer::testing
