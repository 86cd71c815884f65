#pragma once
#include <memory>

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

inline SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

}  // namespace deepinfer::testing
