// StepArena and UploadStage (model/deepseek_v4/step_arena.h), V4's per-step temporaries and
// host-built row lists, on the CPU backend: memory given back by a scope is reused, a step
// that outgrows the arena is served from more chunks and the next step from one chunk of its
// peak (the epoch says when pointers change), and uploads keep their values even when they
// overflow the page-locked chunk.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/deepseek_v4/step_arena.h"

namespace deepinfer {
namespace {

TEST(StepArena, ScopesReuseAndAStepThatOutgrowsItIsServedFromOneChunkNext) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  StepArena a(*be);
  a.reset();
  const DeviceBuffer keep = a.alloc(DType::F32, {10});
  void* first = nullptr;
  {
    ArenaScope scope(a);
    first = a.alloc(DType::F32, {1000}).tensor().data;
    EXPECT_NE(first, keep.tensor().data);
  }
  EXPECT_EQ(a.alloc(DType::F32, {1000}).tensor().data, first);  // the scope's memory again
  // Several chunks' worth at once: every buffer distinct, writable, and not overlapping.
  const uint64_t epoch = a.epoch();
  std::vector<DeviceBuffer> big;
  for (int i = 0; i < 3; ++i) big.push_back(a.alloc(DType::U8, {int64_t{20} << 20}));
  EXPECT_GT(a.epoch(), epoch);
  for (size_t i = 0; i < big.size(); ++i) {
    std::fill_n(static_cast<uint8_t*>(big[i].tensor().data), big[i].tensor().numel(), static_cast<uint8_t>(i + 1));
  }
  for (size_t i = 0; i < big.size(); ++i) {
    const auto* p = static_cast<const uint8_t*>(big[i].tensor().data);
    EXPECT_EQ(p[0], i + 1);
    EXPECT_EQ(p[big[i].tensor().numel() - 1], i + 1);
  }
  const size_t peak_capacity = a.capacity_bytes();
  big.clear();
  // The next step: one chunk of at least the last step's peak, and the same allocations again
  // leave the epoch (graphs captured over the arena) unchanged.
  a.reset();
  const uint64_t merged = a.epoch();
  EXPECT_GE(a.capacity_bytes(), size_t{60} << 20);
  EXPECT_LE(a.capacity_bytes(), peak_capacity);
  a.alloc(DType::F32, {10});
  for (int i = 0; i < 3; ++i) a.alloc(DType::U8, {int64_t{20} << 20});
  EXPECT_EQ(a.epoch(), merged);
}

TEST(UploadStage, UploadsKeepTheirValuesAcrossChunkRefills) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  StepArena a(*be);
  UploadStage stage(*be, a);
  a.reset();
  stage.reset();
  std::vector<DeviceBuffer> out;
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < 40; ++i) {  // ~2.6 M values: more than the first 1 M-value chunk
    std::vector<int32_t> v(static_cast<size_t>(1 + i * 3301));
    for (size_t j = 0; j < v.size(); ++j) v[j] = static_cast<int32_t>(i * 1000003 + j);
    out.push_back(stage.upload(v));
    want.push_back(std::move(v));
  }
  out.push_back(stage.upload({}));
  EXPECT_EQ(out.back().tensor().numel(), 0);
  for (size_t i = 0; i < want.size(); ++i) {
    const int32_t* p = out[i].tensor().ptr<int32_t>();
    ASSERT_EQ(out[i].tensor().numel(), static_cast<int64_t>(want[i].size()));
    for (size_t j = 0; j < want[i].size(); ++j) ASSERT_EQ(p[j], want[i][j]) << "upload " << i << " value " << j;
  }
}

}  // namespace
}  // namespace deepinfer
