// cuda_options: the DEEPINFER_CUDA_* settings (core/settings.h) -> CudaOptions.
#include "backend/backend.h"
#include "core/error.h"
#include "core/settings.h"

namespace deepinfer {

CudaOptions cuda_options(const Settings& s) {
  CudaOptions o;
  o.sync_each_op = s.get_bool("DEEPINFER_CUDA_SYNC");
  o.stream_gemm = s.get_bool("DEEPINFER_CUDA_STREAM");
  o.stream_max_rows = o.stream_gemm ? s.get_int("DEEPINFER_CUDA_STREAM_MAX_ROWS") : 0;
  o.fuse_mask = static_cast<int>(s.get_int("DEEPINFER_CUDA_FUSE"));
  if (s.is_set("DEEPINFER_CUDA_PIPE")) {
    const int64_t stages = s.get_int("DEEPINFER_CUDA_PIPE");
    DI_CHECK(stages >= 0 && stages <= 64, "environment variable DEEPINFER_CUDA_PIPE=", stages,
             ": expected 0 (stream kernel) or a stage count up to 64");
    o.pipe_stages = static_cast<int>(stages);
    o.pipe_fp8 = true;
  }
  o.pipe_max_tokens = s.get_int("DEEPINFER_CUDA_PIPE_TOKENS");
  const int64_t chunk = s.get_int("DEEPINFER_CUDA_ATTN_CHUNK");
  DI_CHECK(chunk == 0 || chunk == 16 || chunk == 32 || chunk == 64,
           "environment variable DEEPINFER_CUDA_ATTN_CHUNK=", chunk, ": expected 16, 32, 64 or 0");
  o.attn_chunk = static_cast<int>(chunk);
  o.fp8_act_min_rows = s.get_int("DEEPINFER_CUDA_FP8_ACT_MIN_ROWS");
  o.fp8_moe_act = s.get_bool("DEEPINFER_CUDA_FP8_MOE_ACT");
  o.fp8_moe_min_rows = s.get_int("DEEPINFER_CUDA_FP8_MOE_MIN_ROWS");
  const std::string& moe_gemm = s.get_string("DEEPINFER_CUDA_MOE_GEMM");
  DI_CHECK(moe_gemm == "cutlass" || moe_gemm == "cutlass:64" || moe_gemm == "cutlass:256" || moe_gemm == "own",
           "environment variable DEEPINFER_CUDA_MOE_GEMM='", moe_gemm,
           "': expected 'cutlass', 'cutlass:64', 'cutlass:256' or 'own'");
  o.moe_cutlass = moe_gemm != "own";
  o.moe_cutlass_tile = moe_gemm == "own" || moe_gemm == "cutlass" ? 0 : std::stoi(moe_gemm.substr(8));
  return o;
}

}  // namespace deepinfer
