// cuda_options (backend/backend_options.cpp): the DEEPINFER_CUDA_* settings table's
// defaults give exactly CudaOptions{} (the measured defaults), set values arrive in the
// fields, and bad values are refused naming the variable.
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

TEST(BackendOptions, TableDefaultsAreTheCudaOptionsDefaults) {
  const CudaOptions d;
  const CudaOptions o = cuda_options(from_map({}));
  EXPECT_EQ(o.sync_each_op, d.sync_each_op);
  EXPECT_EQ(o.stream_gemm, d.stream_gemm);
  EXPECT_EQ(o.stream_max_rows, d.stream_max_rows);
  EXPECT_EQ(o.fuse_mask, d.fuse_mask);
  EXPECT_EQ(o.pipe_stages, d.pipe_stages);
  EXPECT_EQ(o.pipe_fp8, d.pipe_fp8);
  EXPECT_EQ(o.pipe_max_tokens, d.pipe_max_tokens);
  EXPECT_EQ(o.attn_chunk, d.attn_chunk);
  EXPECT_EQ(o.fp8_act_min_rows, d.fp8_act_min_rows);
  EXPECT_EQ(o.fp8_moe_act, d.fp8_moe_act);
  EXPECT_EQ(o.fp8_moe_min_rows, d.fp8_moe_min_rows);
  EXPECT_EQ(o.moe_cutlass, d.moe_cutlass);
  EXPECT_EQ(o.moe_cutlass_tile, d.moe_cutlass_tile);
}

TEST(BackendOptions, SettingsArriveInTheFields) {
  const CudaOptions o = cuda_options(from_map({{"DEEPINFER_CUDA_SYNC", "1"},
                                               {"DEEPINFER_CUDA_PIPE", "0"},
                                               {"DEEPINFER_CUDA_ATTN_CHUNK", "32"},
                                               {"DEEPINFER_CUDA_FP8_MOE_ACT", "0"},
                                               {"DEEPINFER_CUDA_FP8_MOE_MIN_ROWS", "32"},
                                               {"DEEPINFER_CUDA_MOE_GEMM", "cutlass:64"},
                                               {"DEEPINFER_CUDA_STREAM", "0"}}));
  EXPECT_TRUE(o.sync_each_op);
  EXPECT_EQ(o.pipe_stages, 0);
  EXPECT_TRUE(o.pipe_fp8);  // set at all: FP8 experts take the pipe switch too
  EXPECT_EQ(o.attn_chunk, 32);
  EXPECT_FALSE(o.fp8_moe_act);
  EXPECT_EQ(o.fp8_moe_min_rows, 32);
  EXPECT_TRUE(o.moe_cutlass);
  EXPECT_EQ(o.moe_cutlass_tile, 64);
  EXPECT_FALSE(o.stream_gemm);
  EXPECT_EQ(o.stream_max_rows, 0);  // no stream kernel: no rows for it
}

TEST(BackendOptions, BadCudaValuesNameTheVariable) {
  for (const auto& [name, value] : std::map<std::string, std::string>{
           {"DEEPINFER_CUDA_ATTN_CHUNK", "48"}, {"DEEPINFER_CUDA_MOE_GEMM", "cublas"},
           {"DEEPINFER_CUDA_PIPE", "-1"}}) {
    try {
      cuda_options(from_map({{name, value}}));
      ADD_FAILURE() << name << "=" << value << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace deepinfer
