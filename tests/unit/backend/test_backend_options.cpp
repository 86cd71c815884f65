// cuda_options (backend/backend_options.cpp): the DEEPINFER_CUDA_* settings table's
// defaults give exactly CudaOptions{} (the measured defaults), DEEPINFER_CUDA_SYNC arrives in
// its field, a bad value is refused naming the variable, and the switches whose variants lost
// their A/Bs (bench/NOTES.md, "Kernel switches against their A/Bs") are no longer read.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "backend/backend.h"
#include "core/error.h"
#include "core/settings.h"

namespace deepinfer {
namespace {

Settings from_map(const std::map<std::string, std::string>& env) {
  return Settings::from([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

void expect_defaults(const CudaOptions& o) {
  const CudaOptions d;
  EXPECT_EQ(o.stream_gemm, d.stream_gemm);
  EXPECT_EQ(o.stream_max_rows, d.stream_max_rows);
  EXPECT_EQ(o.pipe_stages, d.pipe_stages);
  EXPECT_EQ(o.pipe_fp8, d.pipe_fp8);
  EXPECT_EQ(o.pipe_max_tokens, d.pipe_max_tokens);
  EXPECT_EQ(o.attn_chunk, d.attn_chunk);
  EXPECT_EQ(o.fp8_act_min_rows, d.fp8_act_min_rows);
  EXPECT_EQ(o.moe_cutlass, d.moe_cutlass);
  EXPECT_EQ(o.moe_cutlass_tile, d.moe_cutlass_tile);
  EXPECT_EQ(o.moe_cutlass_fp8, d.moe_cutlass_fp8);
  EXPECT_EQ(o.moe_qgemm_fp4, d.moe_qgemm_fp4);
  EXPECT_EQ(o.moe_qgemm_fp8, d.moe_qgemm_fp8);
  EXPECT_EQ(o.moe_qgemm_min_tokens, d.moe_qgemm_min_tokens);
  EXPECT_EQ(o.pipe_dense_fp8_rows, d.pipe_dense_fp8_rows);
  EXPECT_EQ(o.pipe_dense_bf16_rows, d.pipe_dense_bf16_rows);
  EXPECT_EQ(o.pdl, d.pdl);
}

TEST(BackendOptions, TableDefaultsAreTheCudaOptionsDefaults) {
  const CudaOptions o = cuda_options(from_map({}));
  EXPECT_EQ(o.sync_each_op, CudaOptions{}.sync_each_op);
  expect_defaults(o);
  // The winners of the A/Bs of 2026-12-03: dense few-row BF16 on cuBLASLt, FP8 experts on the
  // pipeline kernel.
  EXPECT_EQ(CudaOptions{}.stream_max_rows, 0);
  EXPECT_TRUE(CudaOptions{}.pipe_fp8);
  // dec18 (H200, bench/NOTES.md): dense few-row GEMMs on the pipeline kernel with PDL up to 32 FP8 /
  // 8 BF16 rows.
  EXPECT_EQ(CudaOptions{}.pipe_dense_fp8_rows, 32);
  EXPECT_EQ(CudaOptions{}.pipe_dense_bf16_rows, 8);
  EXPECT_TRUE(CudaOptions{}.pdl);
}

TEST(BackendOptions, SyncArrivesInItsField) {
  EXPECT_TRUE(cuda_options(from_map({{"DEEPINFER_CUDA_SYNC", "1"}})).sync_each_op);
}

// Setting a retired switch changes nothing, and none is left in the table.
TEST(BackendOptions, RetiredSwitchesAreNotRead) {
  const std::map<std::string, std::string> retired = {
      {"DEEPINFER_CUDA_STREAM", "0"},         {"DEEPINFER_CUDA_STREAM_MAX_ROWS", "16"},
      {"DEEPINFER_CUDA_FUSE", "0"},           {"DEEPINFER_CUDA_PIPE", "4"},
      {"DEEPINFER_CUDA_PIPE_TOKENS", "64"},   {"DEEPINFER_CUDA_ATTN_CHUNK", "16"},
      {"DEEPINFER_CUDA_FP8_ACT_MIN_ROWS", "1"}, {"DEEPINFER_CUDA_FP8_MOE_ACT", "0"},
      {"DEEPINFER_CUDA_FP8_MOE_MIN_ROWS", "32"}, {"DEEPINFER_CUDA_MOE_GEMM", "own"}};
  expect_defaults(cuda_options(from_map(retired)));
  for (const SettingInfo& s : setting_table()) EXPECT_EQ(retired.count(s.name), 0u) << s.name;
}

TEST(BackendOptions, BadCudaValuesNameTheVariable) {
  try {
    cuda_options(from_map({{"DEEPINFER_CUDA_SYNC", "maybe"}}));
    ADD_FAILURE() << "DEEPINFER_CUDA_SYNC=maybe accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DEEPINFER_CUDA_SYNC"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer
