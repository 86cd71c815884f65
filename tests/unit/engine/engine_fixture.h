#pragma once
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

inline SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

}  // namespace deepinfer::testing
