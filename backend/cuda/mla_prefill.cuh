// Arguments of the direct causal MLA prefill kernels (mla_attention.cu: the mma.sync kernel
// for every head-dim pair and the op entry points; mla_prefill_wgmma.cu: the wgmma kernel for
// the model's 192 / 128).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/device_utils.cuh"

namespace deepinfer::cuda {

struct PrefillArgs {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  int64_t q_s0, q_s1, k_s0, k_s1, v_s0, v_s1;
  const int32_t* query_start;
  // Context (mla_attention_prefill_context): sequence s has seq_lens[s] positions, k/v rows c_s ..
  // (c_s: the sum of the earlier seq_lens) and its queries are the last ones. nullptr: each
  // sequence's context is its own tokens (k/v rows = q rows).
  const int32_t* seq_lens;
  int num_seqs;
  int T, N;  // q rows, k/v rows
  int H, Dq, Dv;
  float scale;
  void* out;
  int out_kind;
  int64_t o_s0, o_s1;
};

// Block blockIdx.y's (sequence, query tile of kBr queries), each sequence's last (longest) tile
// first: q rows s0 .. s0 + len - 1, the tile's first query q0, the context length ctx and
// query 0's position off (ctx - len), the sequence's first k/v row c0. False for the grid's
// surplus blocks.
struct PrefillTile {
  int s0, len, q0, ctx, off, c0;
};
template <int kBr>
__device__ __forceinline__ bool prefill_tile(const PrefillArgs& a, PrefillTile& t) {
  int b = blockIdx.y, seq = -1, tile = 0, c0 = 0;
  for (int s = 0; s < a.num_seqs; ++s) {
    const int q_len = a.query_start[s + 1] - a.query_start[s], tiles = (q_len + kBr - 1) / kBr;
    if (b < tiles) {
      seq = s;
      tile = tiles - 1 - b;
      break;
    }
    b -= tiles;
    c0 += a.seq_lens != nullptr ? a.seq_lens[s] : q_len;
  }
  if (seq < 0) return false;
  t.s0 = a.query_start[seq];
  t.len = a.query_start[seq + 1] - t.s0;
  t.q0 = tile * kBr;
  t.ctx = a.seq_lens != nullptr ? a.seq_lens[seq] : t.len;
  t.off = t.ctx - t.len;
  t.c0 = a.seq_lens != nullptr ? c0 : t.s0;
  return true;
}

__device__ __forceinline__ float exp2_approx(float x) {  // 2^x; -inf -> 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// (lo, hi) as packed bf16; sum gets them as rounded (the row sum counts P as P·V sees it).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi, float& sum) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
  sum += __low2float(p) + __high2float(p);
  return *reinterpret_cast<const uint32_t*>(&p);
}

// The end of a tile: row sums over the 4 lanes of each row, then O / l into a.out for this
// thread's rows row0 and row0 + 8 of the sequence (rows past it are not written); o holds
// kOTiles column tiles of 8 in the mma accumulator layout (tile n, element e: row row0 +
// 8 (e >> 1), column 8n + 2 t4 + (e & 1)).
template <int kOTiles>
__device__ __forceinline__ void store_rows(const PrefillArgs& a, const float* o, float l0, float l1, int s0,
                                           int len, int row0, int h, int t4) {
  const int row1 = row0 + 8;
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
#pragma unroll
  for (int n = 0; n < kOTiles; ++n) {
    const int c = n * 8 + 2 * t4;
    if (c >= a.Dv) continue;  // Dv % 8 == 0: c + 1 < Dv too
    if (row0 < len) {
      const int64_t i = int64_t{s0 + row0} * a.o_s0 + int64_t{h} * a.o_s1 + c;
      st(a.out, i, a.out_kind, o[4 * n] * inv0);
      st(a.out, i + 1, a.out_kind, o[4 * n + 1] * inv0);
    }
    if (row1 < len) {
      const int64_t i = int64_t{s0 + row1} * a.o_s0 + int64_t{h} * a.o_s1 + c;
      st(a.out, i, a.out_kind, o[4 * n + 2] * inv1);
      st(a.out, i + 1, a.out_kind, o[4 * n + 3] * inv1);
    }
  }
}

// The wgmma kernel (mla_prefill_wgmma.cu): fits(a) when a's head dims pad to 192 / 128; launch
// after the caller has raised kernel()'s dynamic shared memory limit to smem_bytes().
namespace fa3 {
bool fits(const PrefillArgs& a);
const void* kernel();
size_t smem_bytes();
void launch(const PrefillArgs& a, cudaStream_t stream);
}  // namespace fa3

}  // namespace deepinfer::cuda
