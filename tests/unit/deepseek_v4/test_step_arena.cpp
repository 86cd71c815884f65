// StepArena and UploadStage (model/deepseek_v4/step_arena.h), V4's per-step temporaries and
// host-built row lists, on the CPU backend: memory given back by a scope is reused, a step
// that outgrows the arena is served from more chunks and the next step from one chunk of its
// peak (the epoch says when pointers change), and uploads keep their values even when they
// overflow the page-locked chunk. Also v4_family::grouped_output with an FP8 wo_a (step_ops.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/deepseek_v4/step_arena.h"
#include "model/deepseek_v4/step_ops.h"

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


// v4_family::grouped_output with an FP8 wo_a of 32x32 blocks (V4.1 on CUDA keeps it FP8): each
// group's row slice takes its own rows of scales. Random power-of-two scales per block, so a group
// reading another group's scales gives other values; equal (up to F32 summation order) to the same
// output with wo_a dequantized. Groups that would cut a scale block are refused naming o_lora_rank.
TEST(GroupedOutput, Fp8WoAGroupsTakeTheirOwnScaleRows) {
  V4FamilyConfig c;
  c.base.num_attention_heads = 2;
  c.head_dim = 64;
  c.o_groups = 2;
  c.o_lora_rank = 64;
  const int64_t T = 3, G = c.o_groups, ol = c.o_lora_rank, gin = 2 * 64 / G, H = 32;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255), exp2(-6, 2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  HostBuffer q(DType::F8_E4M3, {G * ol, gin}), s(DType::F32, {G * ol / 32, gin / 32}), deq(DType::F32, {G * ol, gin});
  for (int64_t i = 0; i < s.tensor().numel(); ++i) s.ptr<float>()[i] = std::ldexp(1.0f, exp2(rng));
  for (int64_t n = 0; n < G * ol; ++n)
    for (int64_t k = 0; k < gin; ++k) {
      uint8_t b = static_cast<uint8_t>(byte(rng));
      if ((b & 0x7f) == 0x7f) b = 0x38;
      q.ptr<uint8_t>()[n * gin + k] = b;
      deq.ptr<float>()[n * gin + k] = fp8_e4m3_to_float(b) * s.ptr<float>()[(n / 32) * (gin / 32) + k / 32];
    }
  HostBuffer attn(DType::F32, {T, G * gin}), wb(DType::F32, {H, G * ol}), y8(DType::F32, {T, H}),
      y32(DType::F32, {T, H});
  for (int64_t i = 0; i < attn.tensor().numel(); ++i) attn.ptr<float>()[i] = nd(rng);
  for (int64_t i = 0; i < wb.tensor().numel(); ++i) wb.ptr<float>()[i] = 0.1f * nd(rng);
  Weight wo_a8, wo_a32, wo_b;
  wo_a8.w = q.tensor();
  wo_a8.scale_inv = s.tensor();
  wo_a8.block_n = wo_a8.block_k = 32;
  wo_a32.w = deq.tensor();
  wo_b.w = wb.tensor();
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  StepArena arena(*cpu);
  v4_family::grouped_output(*cpu, arena, DType::F32, c, attn.tensor(), wo_a8, wo_b, y8.tensor());
  v4_family::grouped_output(*cpu, arena, DType::F32, c, attn.tensor(), wo_a32, wo_b, y32.tensor());
  for (int64_t i = 0; i < T * H; ++i)
    EXPECT_NEAR(y8.ptr<float>()[i], y32.ptr<float>()[i], 1e-5 * (1.0 + std::fabs(y32.ptr<float>()[i]))) << i;
  c.o_lora_rank = 48;  // groups of 48 rows: 32-row blocks cut
  wo_a8.w = q.tensor().slice_rows(0, G * 48);
  try {
    v4_family::grouped_output(*cpu, arena, DType::F32, c, attn.tensor(), wo_a8, wo_b, y8.tensor());
    ADD_FAILURE() << "groups cutting a scale block were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("o_lora_rank"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer
