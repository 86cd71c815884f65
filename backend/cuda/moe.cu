// moe_routing (sigmoid/softmax scores, correction bias, group limit, top-k, fused in one
// kernel: one warp per token) and moe_experts (stable permutation of (token, slot) pairs
// by expert, grouped GEMMs for gate/up and down, SiLU-mul, weighted combine). The grouped
// GEMMs: the stream / pipeline kernels in decode, CUTLASS in prefill (BF16: moe_cutlass.cu; FP8
// with FP8 activations: cutlass_fp8.cu), moe_qgemm.cu for FP4 (and FP8 where CUTLASS does not
// take the step) weights, the own tiles otherwise.
//
// Determinism: the permutation is stable (rank = order of the pair in the batch), every
// expert row is computed on its own with a fixed K order (gemm.cu), and the combine sums
// a token's k slots in slot order in fp32, so a token's output never depends on which
// other tokens share the step.
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/gemm_problem.h"
#include "backend/cuda/pdl_launch.cuh"

namespace deepinfer::cuda {
namespace {

struct RoutingArgs {
  const float* logits;
  int64_t ld;
  const float* bias;
  int T, E, K, G, KG;
  bool sigmoid, use_bias, normalize;
  float scaling;
  int32_t* ids;
  float* weights;
};

// A float's order as an unsigned key (larger value, larger key; -0 as +0; NaN above +inf, as the
// comparison's first-taken NaN could not be replaced either). 0 is below every value's key.
__device__ __forceinline__ unsigned order_key(float v) {
  const unsigned u = __float_as_uint(v + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// One warp per token; shared memory: per warp 2 * E floats (scores, choice scores).
__global__ void moe_routing_kernel(RoutingArgs a) {
  pdl_wait();  // a programmatic dependent (pdl_launch.cuh): the router's logits
  pdl_trigger();
  extern __shared__ float sm[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = blockIdx.x * (blockDim.x >> 5) + warp;
  if (t >= a.T) return;
  float* scores = sm + warp * 2 * a.E;
  float* choice = scores + a.E;
  const float* x = a.logits + int64_t{t} * a.ld;
  if (a.sigmoid) {
    for (int e = lane; e < a.E; e += 32) scores[e] = 1.0f / (1.0f + expf(-x[e]));
  } else {
    float m = -INFINITY;
    for (int e = lane; e < a.E; e += 32) m = fmaxf(m, x[e]);
    m = warp_max(m);
    float s = 0.0f;
    for (int e = lane; e < a.E; e += 32) s += (scores[e] = expf(x[e] - m));
    s = warp_sum(s);
    for (int e = lane; e < a.E; e += 32) scores[e] /= s;
  }
  for (int e = lane; e < a.E; e += 32) choice[e] = a.use_bias ? scores[e] + a.bias[e] : scores[e];
  __syncwarp();
  // Group limit: lane g scores group g; lane 0 keeps the best KG groups (ties: lowest index).
  unsigned allowed = 0xffffffffu;
  const int per_group = a.E / a.G;
  if (a.G > 1) {
    float gs = -INFINITY;
    if (lane < a.G) {
      const float* c = choice + lane * per_group;
      float a1 = -INFINITY, a2 = -INFINITY;
      for (int i = 0; i < per_group; ++i) {
        if (c[i] > a1) {
          a2 = a1;
          a1 = c[i];
        } else if (c[i] > a2) {
          a2 = c[i];
        }
      }
      gs = a.use_bias ? (per_group >= 2 ? a1 + a2 : a1) : a1;
    }
    unsigned mask = 0;
    for (int r = 0; r < a.KG; ++r) {
      float bv = -INFINITY;
      int bi = -1;
      for (int g = 0; g < a.G; ++g) {
        const float v = __shfl_sync(0xffffffffu, gs, g);
        if (!(mask >> g & 1u) && (bi < 0 || v > bv)) {
          bv = v;
          bi = g;
        }
      }
      mask |= 1u << bi;
    }
    allowed = mask;
  }
  float wsum = 0.0f;
  int chosen_lane_id = a.E;  // lane j keeps slot j's expert (K <= 32)
  uint64_t taken = 0;        // bit i: this lane's expert lane + 32 i is chosen (E <= 2048)
  for (int j = 0; j < a.K; ++j) {
    float bv = -INFINITY;
    int bi = a.E;
    for (int e = lane, i = 0; e < a.E; e += 32, ++i) {
      if (!(allowed >> (e / per_group) & 1u) || (taken >> i & 1u)) continue;
      const float v = choice[e];
      if (bi == a.E || v > bv) {  // e ascends per lane: ties keep the lower index
        bv = v;
        bi = e;
      }
    }
    // The warp's best: the largest value, ties to the lowest index, as two warp reductions on the
    // value's order-preserving key and then on the index among the lanes holding it (session 17:
    // five shuffle pairs per slot before; the same picks: -0 counts as +0, as the comparison did).
    const unsigned key = bi == a.E ? 0u : order_key(bv);
    const unsigned best = __reduce_max_sync(0xffffffffu, key);
    bi = static_cast<int>(__reduce_min_sync(0xffffffffu, key == best && bi != a.E ? static_cast<unsigned>(bi)
                                                                                  : static_cast<unsigned>(a.E)));
    if (lane == j) chosen_lane_id = bi;
    if (bi < a.E) {
      wsum += scores[bi];
      if (bi % 32 == lane) taken |= uint64_t{1} << (bi / 32);
    }
  }
  if (lane < a.K) {
    const int e = chosen_lane_id < a.E ? chosen_lane_id : 0;
    const float denom = a.normalize ? wsum + 1e-20f : 1.0f;
    a.ids[int64_t{t} * a.K + lane] = e;
    a.weights[int64_t{t} * a.K + lane] = scores[e] / denom * a.scaling;
  }
}

// Block e ranks the pairs routed to expert e in pair order (stable) and counts them.
__global__ void moe_rank_kernel(const int32_t* ids, int P, int32_t* rank, int32_t* counts) {
  __shared__ int warp_totals[32];
  const int e = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  int base = 0;
  for (int c0 = 0; c0 < P; c0 += blockDim.x) {
    const int i = c0 + threadIdx.x;
    const bool match = i < P && ids[i] == e;
    const unsigned ballot = __ballot_sync(0xffffffffu, match);
    if (lane == 0) warp_totals[warp] = __popc(ballot);
    __syncthreads();
    int before = base;
    for (int w = 0; w < warp; ++w) before += warp_totals[w];
    if (match) rank[i] = before + __popc(ballot & ((1u << lane) - 1u));
    int total = 0;
    for (int w = 0; w < num_warps; ++w) total += warp_totals[w];
    base += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) counts[e] = base;
}

// Few pairs (decode): rank, counts, offsets, tiles and scatter in one block of 1024 threads
// (one launch instead of three). A pair's rank = number of earlier pairs with its expert, so
// the permutation is the same stable one as moe_rank_kernel's. Shared: ids [P], counts [E],
// offsets [E + 1].
__global__ void moe_index_small_kernel(const int32_t* ids, int P, int K, int E, int tile_rows,
                                       int32_t* offsets_out, int2* tiles, int32_t* num_tiles,
                                       int32_t* row_token, int32_t* entry_pos, int32_t* active,
                                       int32_t* num_active) {
  pdl_wait();  // a programmatic dependent (pdl_launch.cuh): the routing's ids
  pdl_trigger();
  extern __shared__ int32_t sm_idx[];
  int32_t* sid = sm_idx;
  int32_t* cnt = sid + P;
  int32_t* off = cnt + E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  for (int i = threadIdx.x; i < P; i += blockDim.x) sid[i] = ids[i];
  __syncthreads();
  for (int i = threadIdx.x; i < P; i += blockDim.x) {
    const int e = sid[i];
    if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);  // counts only: order-free
  }
  __syncthreads();
  // Offsets, tiles and the active list by warp 0, 32 experts per pass: exclusive scans of the
  // counts and the tile counts (shuffles) and a ballot for the active experts, each pass carrying
  // its totals into the next (session 17: thread 0 walked the experts one by one before; the
  // same lists in the same order).
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int o = 0, nt = 0, na = 0;  // carries: rows, tiles, active experts before this pass
    for (int e0 = 0; e0 < E; e0 += 32) {
      const int e = e0 + lane;
      const int c = e < E ? cnt[e] : 0;
      const int ntiles = (c + tile_rows - 1) / tile_rows;
      int ci = c, ti = ntiles;  // inclusive scans
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int cu = __shfl_up_sync(0xffffffffu, ci, d), tu = __shfl_up_sync(0xffffffffu, ti, d);
        if (lane >= d) {
          ci += cu;
          ti += tu;
        }
      }
      const unsigned act = __ballot_sync(0xffffffffu, c > 0);
      const int eo = o + ci - c, et = nt + ti - ntiles;
      if (e < E) {
        off[e] = eo;
        offsets_out[e] = eo;
        if (c > 0) active[na + __popc(act & ((1u << lane) - 1u))] = e;
        for (int r = 0, i = 0; r < c; r += tile_rows, ++i) tiles[et + i] = make_int2(e, eo + r);
      }
      o += __shfl_sync(0xffffffffu, ci, 31);
      nt += __shfl_sync(0xffffffffu, ti, 31);
      na += __popc(act);
    }
    if (lane == 0) {
      off[E] = o;
      offsets_out[E] = o;
      *num_tiles = nt;
      *num_active = na;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < P; i += blockDim.x) {
    const int e = sid[i];
    if (e < 0 || e >= E) {
      entry_pos[i] = -1;
      continue;
    }
    int rank = 0;
    for (int j = 0; j < i; ++j) rank += sid[j] == e;
    const int pos = off[e] + rank;
    row_token[pos] = i / K;
    entry_pos[i] = pos;
  }
}

// One thread: offsets (exclusive scan) and the tile list (expert, first row) for tile_rows.
__global__ void moe_offsets_kernel(const int32_t* counts, int E, int tile_rows, int32_t* offsets,
                                   int2* tiles, int32_t* num_tiles) {
  if (threadIdx.x != 0) return;
  int off = 0, nt = 0;
  for (int e = 0; e < E; ++e) {
    offsets[e] = off;
    for (int r = 0; r < counts[e]; r += tile_rows) tiles[nt++] = make_int2(e, off + r);
    off += counts[e];
  }
  offsets[E] = off;
  *num_tiles = nt;
}

__global__ void moe_scatter_kernel(const int32_t* ids, int P, int K, int E, const int32_t* rank,
                                   const int32_t* offsets, int32_t* row_token, int32_t* entry_pos) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= P) return;
  const int e = ids[i];
  if (e < 0 || e >= E) {
    entry_pos[i] = -1;
    return;
  }
  const int pos = offsets[e] + rank[i];
  row_token[pos] = i / K;
  entry_pos[i] = pos;
}

// out[t, c] = sum_j w[t, j] * y[pos(t, j), c], slots in order, fp32. Blocks (token, column
// stripe); per pass a thread owns kCombineCols columns (blockDim apart) and loads the rows of
// kCombineSlots slots before adding them in slot order (dec17: one dependent load per slot
// and column took ~14 us per call at batch 1, cold, on the H200).
constexpr int kCombineCols = 4, kCombineSlots = 8, kCombineThreads = 256;
// grid.y splits a token's columns into stripes of kCombineCols x kCombineThreads (session 17: one
// block per token made each thread walk H / 1,024 passes of dependent loads one after another;
// the sums per column are unchanged, so the bits are too).
dim3 combine_grid(int64_t T, int64_t H) {
  return dim3(static_cast<unsigned>(T), static_cast<unsigned>((H + kCombineCols * kCombineThreads - 1) /
                                                              (kCombineCols * kCombineThreads)));
}
__global__ void moe_combine_kernel(const float* y, int64_t H, const int32_t* entry_pos,
                                   const float* w, int K, void* out, int out_kind, int64_t ldo) {
  pdl_wait();  // a programmatic dependent (pdl_launch.cuh): the down GEMM's rows
  pdl_trigger();
  const int t = blockIdx.x;
  const int64_t stripe = int64_t{kCombineCols} * blockDim.x;  // columns of one block pass
  for (int64_t c0 = blockIdx.y * stripe + threadIdx.x; c0 < H; c0 += stripe * gridDim.y) {
    float acc[kCombineCols] = {};
    for (int j0 = 0; j0 < K; j0 += kCombineSlots) {
      float v[kCombineSlots][kCombineCols];
      int pos[kCombineSlots];
#pragma unroll
      for (int u = 0; u < kCombineSlots; ++u) {
        pos[u] = j0 + u < K ? entry_pos[t * K + j0 + u] : -1;
#pragma unroll
        for (int i = 0; i < kCombineCols; ++i) {
          const int64_t c = c0 + int64_t{i} * blockDim.x;
          v[u][i] = pos[u] >= 0 && c < H ? y[pos[u] * H + c] : 0.0f;
        }
      }
#pragma unroll
      for (int u = 0; u < kCombineSlots; ++u) {
        if (pos[u] < 0) continue;
        const float wj = w[t * K + j0 + u];
#pragma unroll
        for (int i = 0; i < kCombineCols; ++i) acc[i] += wj * v[u][i];
      }
    }
#pragma unroll
    for (int i = 0; i < kCombineCols; ++i) {
      const int64_t c = c0 + int64_t{i} * blockDim.x;
      if (c >= H) break;
      if (out_kind)
        static_cast<bf16*>(out)[t * ldo + c] = __float2bfloat16_rn(acc[i]);
      else
        static_cast<float*>(out)[t * ldo + c] = acc[i];
    }
  }
}

__global__ void to_bf16_rows_kernel(const float* x, int64_t ldx, int64_t rows, int64_t cols, bf16* y) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = __float2bfloat16_rn(x[(i / cols) * ldx + i % cols]);
}

void check_expert_weight(const Weight& w, const Weight& ref, int64_t n, int64_t k, const char* what,
                         size_t e) {
  DI_CHECK(w.w.device == Device::CUDA && w.w.dtype == ref.w.dtype && w.w.ndim == 2 &&
               w.w.shape[0] == n && w.w.shape[1] == k && w.w.is_contiguous(),
           "moe_experts: expert ", e, " ", what, " ", w.w.describe(), " must be contiguous ",
           dtype_name(ref.w.dtype), " [", n, ", ", k, "] on cuda like expert 0");
  DI_CHECK(w.w.dtype == DType::BF16 || w.w.dtype == DType::F8_E4M3,
           "moe_experts: CUDA expert weights must be BF16 or F8_E4M3, got ", w.w.describe());
  if (w.w.dtype == DType::F8_E4M3) {
    DI_CHECK(w.block_n == 128 && w.block_k == 128 && w.scale_inv.device == Device::CUDA &&
                 w.scale_inv.dtype == DType::F32 && w.scale_inv.is_contiguous() &&
                 w.scale_inv.numel() == ((n + 127) / 128) * ((k + 127) / 128),
             "moe_experts: expert ", e, " ", what, " FP8 scale_inv ", w.scale_inv.describe(),
             " must be F32 [", (n + 127) / 128, ", ", (k + 127) / 128, "] with 128x128 blocks");
  }
}

}  // namespace

void CudaBackend::moe_routing(const Tensor& logits, const Tensor& bias, const MoeRouting& routing,
                              Tensor& topk_ids, Tensor& topk_weights) {
  const RowView l = rows_of(logits, "moe_routing logits");
  const int E = routing.num_experts, K = routing.top_k;
  DI_CHECK(l.dtype == DType::F32 && l.cols == E, "moe_routing: logits must be F32 [T, ", E, "], got ",
           logits.describe());
  const int G = routing.group_limited ? routing.num_groups : 1;
  const int KG = routing.group_limited ? routing.top_k_groups : 1;
  DI_CHECK(G >= 1 && G <= 32 && E % G == 0 && KG >= 1 && KG <= G && K >= 1 && K <= 32 &&
               K <= (E / G) * KG && E <= 2048,
           "moe_routing: ", E, " experts in ", G, " groups keeping ", KG, " with top_k ", K,
           " is not supported (CUDA: groups <= 32, top_k <= 32, experts <= 2048)");
  if (routing.use_bias) {
    check_dtype(bias, DType::F32, "moe_routing bias");
    DI_CHECK(bias.numel() == E && bias.is_contiguous(), "moe_routing: bias must be F32 [", E, "], got ",
             bias.describe());
  }
  check_dtype(topk_ids, DType::I32, "moe_routing topk_ids");
  check_dtype(topk_weights, DType::F32, "moe_routing topk_weights");
  DI_CHECK(topk_ids.numel() == l.rows * K && topk_weights.numel() == l.rows * K &&
               topk_ids.is_contiguous() && topk_weights.is_contiguous(),
           "moe_routing: topk_ids ", topk_ids.describe(), " and topk_weights ", topk_weights.describe(),
           " must be [", l.rows, ", ", K, "]");
  if (l.rows == 0) return;
  RoutingArgs a{};
  a.logits = static_cast<const float*>(l.data);
  a.ld = l.row_stride;
  a.bias = routing.use_bias ? bias.ptr<float>() : nullptr;
  a.T = static_cast<int>(l.rows);
  a.E = E;
  a.K = K;
  a.G = G;
  a.KG = KG;
  a.sigmoid = routing.scoring == MoeRouting::Scoring::Sigmoid;
  a.use_bias = routing.use_bias;
  a.normalize = routing.normalize;
  a.scaling = routing.scaling;
  a.ids = topk_ids.ptr<int32_t>();
  a.weights = topk_weights.ptr<float>();
  const int warps = 4;
  const size_t smem = size_t{warps} * 2 * E * sizeof(float);
  set_smem_limit(reinterpret_cast<const void*>(moe_routing_kernel), smem, "moe_routing");
  launch_pdl(pdl_, ceil_div(l.rows, warps), warps * 32, smem, stream_, moe_routing_kernel, a);
  check_launch("moe_routing", logits.describe());
}

void CudaBackend::moe_experts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                              const std::vector<ExpertWeights>& experts, Tensor& out) {
  routed_experts(x, topk_ids, topk_weights, experts, INFINITY, out, "moe_experts");
}

void CudaBackend::moe_experts_clamped(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                                      const std::vector<ExpertWeights>& experts, float limit, Tensor& out) {
  DI_CHECK(!std::isnan(limit), "moe_experts_clamped: limit is NaN");
  routed_experts(x, topk_ids, topk_weights, experts, limit, out, "moe_experts_clamped");
}

// A finite limit (V4) clamps each expert's SwiGLU as silu_mul_clamped does: the activation then
// always goes through silu_mul_clamped (no FP8-activation prefill path).
void CudaBackend::routed_experts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                                 const std::vector<ExpertWeights>& experts, float limit, Tensor& out,
                                 const char* op) {
  const bool clamped = !std::isinf(limit);
  const RowView xv = rows_of(x, "moe_experts x");
  const RowView ov = rows_of(out, "moe_experts out");
  check_float(x, "moe_experts x");
  check_float(out, "moe_experts out");
  check_dtype(topk_ids, DType::I32, "moe_experts topk_ids");
  check_dtype(topk_weights, DType::F32, "moe_experts topk_weights");
  DI_CHECK(!experts.empty(), op, ": no experts");
  const int64_t T = xv.rows, H = xv.cols;
  const int64_t I = experts[0].gate.w.shape[0];
  DI_CHECK(topk_ids.ndim == 2 && topk_ids.shape[0] == T && topk_ids.is_contiguous() &&
               topk_weights.ndim == 2 && topk_weights.shape[0] == T &&
               topk_weights.shape[1] == topk_ids.shape[1] && topk_weights.is_contiguous() &&
               ov.rows == T && ov.cols == H,
           op, ": x ", x.describe(), ", topk_ids ", topk_ids.describe(), ", topk_weights ",
           topk_weights.describe(), ", out ", out.describe(), " do not match");
  const int E = static_cast<int>(experts.size());
  const int K = static_cast<int>(topk_ids.shape[1]);
  const bool fp4 = experts[0].gate.w.dtype == DType::U8 || experts[0].gate.w.dtype == DType::I8;
  const bool x_aligned = xv.dtype == DType::F32 ||
                         (xv.row_stride % 8 == 0 && (reinterpret_cast<uintptr_t>(xv.data) & 15) == 0);
  const int P = static_cast<int>(T * K);
  // Quantized weights (FP4 always, FP8 in prefill when CudaOptions::moe_qgemm_fp8 and CUTLASS
  // does not take the step) on the tensor-core grouped GEMM of moe_qgemm.cu from
  // moe_qgemm_min_tokens tokens; never batch-invariant (that mode keeps the kernels below and
  // moe_fp4.cu's, which are).
  const auto qgemm_takes = [&](int kind) {
    return !options_.batch_invariant && T >= options_.cuda.moe_qgemm_min_tokens && x_aligned &&
           qgemm_supported(kind, I, H, H) && qgemm_supported(kind, H, I, I);
  };
  bool qgemm = false;
  if (fp4) {
    check_fp4_experts(experts, H, I, op);  // moe_fp4.cu
    qgemm = options_.cuda.moe_qgemm_fp4 && qgemm_takes(kWeightFP4);
    if (!qgemm) {
      moe_experts_fp4(x, topk_ids, topk_weights, experts, limit, out, op);  // CUDA cores
      return;
    }
  } else {
    for (size_t e = 0; e < experts.size(); ++e) {
      check_expert_weight(experts[e].gate, experts[0].gate, I, H, "gate", e);
      check_expert_weight(experts[e].up, experts[0].gate, I, H, "up", e);
      check_expert_weight(experts[e].down, experts[0].gate, H, I, "down", e);
    }
  }
  if (T == 0) return;
  const bool fp8 = experts[0].gate.w.dtype == DType::F8_E4M3;
  if (fp8 && options_.cuda.moe_qgemm_fp8 && P > 16 * E) qgemm = qgemm_takes(kWeightFP8);
  const ExpertTable& table = expert_table(experts);
  const void* const* ptrs = static_cast<const void* const*>(table.ptrs.tensor().data);

  // Routing bookkeeping: rank, counts, offsets, row_token, entry_pos, tiles.
  // Decode: at most ~16 rows per expert on average; weight-read bound (stream kernel).
  const bool few_rows = P <= 16 * E;
  // Decode steps of few tokens: expert GEMMs on the shared-memory-staged pipeline kernel
  // (gemm_pipe.cu; same bits as the stream kernel), whose row entries are 16-row tiles.
  // (Shapes it takes: K of both GEMMs a multiple of 64, aligned rows; otherwise the 16-row
  // tiles only reach the stream kernel or the gemv, which do not read them.)
  const bool pipe = !qgemm && pipe_stages_ > 0 && (!fp8 || pipe_fp8_) && stream_gemm_ && T <= pipe_max_tokens_ && few_rows &&
                    H % 64 == 0 && I % 64 == 0 && x_aligned;
  const int tile_rows = qgemm ? (P / E > 48 ? 128 : 64) : pipe ? 16 : tc_tile_rows(P / E);
  const int max_tiles = (P + tile_rows - 1) / tile_rows + E;
  const size_t index_ints = size_t{3} * P + 2 * E + 4 + 2 * static_cast<size_t>(max_tiles) + E + 2;
  int32_t* ib = static_cast<int32_t*>(scratch(kSlotMoeIndex, index_ints * 4, "moe_experts"));
  int32_t* rank = ib;
  int32_t* row_token = rank + P;
  int32_t* entry_pos = row_token + P;
  int32_t* counts = entry_pos + P;
  int32_t* offsets = counts + E;        // [E + 1]
  int32_t* num_tiles = offsets + E + 1;  // [1]
  int2* tiles = reinterpret_cast<int2*>(ib + ((num_tiles + 1 - ib + 1) / 2 * 2));
  int32_t* active = reinterpret_cast<int32_t*>(tiles + max_tiles);  // [E] groups with rows
  int32_t* num_active = active + E;                                  // [1]
  const bool compact = P <= 2048 && E <= 1024;  // the one-block index kernel lists them
  const std::string shapes = x.describe() + " top_k " + std::to_string(K) + " experts " +
                             std::to_string(E) + " " + experts[0].gate.w.describe();
  if (compact) {
    const size_t smem = sizeof(int32_t) * (static_cast<size_t>(P) + 2 * E + 1);
    // As many threads as pairs or experts (whole warps, at least 2, at most 1,024): a decode step's
    // few pairs do not pay a 1,024-thread block's barriers (session 17).
    const int threads = std::clamp((std::max(P, E) + 31) / 32 * 32, 64, 1024);
    launch_pdl(pdl_, 1, threads, smem, stream_, moe_index_small_kernel, topk_ids.ptr<int32_t>(), P, K, E,
               tile_rows, offsets, tiles, num_tiles, row_token, entry_pos, active, num_active);
    check_launch("moe_experts (index)", shapes);
  } else {
    moe_rank_kernel<<<E, 256, 0, stream_>>>(topk_ids.ptr<int32_t>(), P, rank, counts);
    check_launch("moe_experts (rank)", shapes);
    moe_offsets_kernel<<<1, 32, 0, stream_>>>(counts, E, tile_rows, offsets, tiles, num_tiles);
    check_launch("moe_experts (offsets)", shapes);
    moe_scatter_kernel<<<ceil_div(P, 256), 256, 0, stream_>>>(topk_ids.ptr<int32_t>(), P, K, E, rank,
                                                              offsets, row_token, entry_pos);
    check_launch("moe_experts (scatter)", shapes);
  }

  // Activations as BF16 rows.
  const void* a = xv.data;
  int64_t lda = xv.row_stride;
  if (xv.dtype == DType::F32) {
    bf16* tmp = static_cast<bf16*>(scratch(kSlotGemmA, static_cast<size_t>(T * H) * 2, "moe_experts"));
    to_bf16_rows_kernel<<<std::min(ceil_div(T * H, 256), 65535u), 256, 0, stream_>>>(
        static_cast<const float*>(a), lda, T, H, tmp);
    check_launch("moe_experts (x to bf16)", shapes);
    a = tmp;
    lda = H;
  }
  // Prefill on FP8 experts: FP8 activations (1x128) on CUTLASS's blockwise-scaled grouped GEMM
  // (cutlass_fp8.cu: no host sync, graph-capturable), when enabled and it takes the shapes;
  // never batch-invariant nor clamped.
  if (fp8 && !few_rows && !clamped && !options_.batch_invariant && moe_cutlass_fp8_ && cutlass_moe_fp8_fits(experts)) {
    const float* yc = moe_experts_cutlass_fp8(a, lda, P, E, H, I, ptrs, row_token, offsets, shapes);
    launch_pdl(pdl_, combine_grid(T, H), kCombineThreads, 0, stream_, moe_combine_kernel,
        yc, H, entry_pos, topk_weights.ptr<float>(), K, ov.data, float_kind(ov.dtype), ov.row_stride);
    check_launch("moe_experts (combine)", shapes);
    return;
  }
  // FP4, and FP8 where CUTLASS did not take the step (CudaOptions::moe_cutlass_fp8 false, H or I
  // not a multiple of 16): the tensor-core grouped GEMM of moe_qgemm.cu (W8A16 for FP8). H200
  // (bench/NOTES.md "fp8grp"): CUTLASS FP8 prefill 512 / 4096 95.2k / 166.6k tok/s against 58.6k
  // here / ~100k on cuBLASLt per expert (the path it replaced, deleted).
  if (qgemm) {
    const float* yq = moe_experts_qgemm(a, lda, P, E, H, I, fp4 ? kWeightFP4 : kWeightFP8, ptrs, row_token, offsets,
                                        tiles, num_tiles, tile_rows, max_tiles, limit, shapes);
    launch_pdl(pdl_, combine_grid(T, H), kCombineThreads, 0, stream_, moe_combine_kernel,
        yq, H, entry_pos, topk_weights.ptr<float>(), K, ov.data, float_kind(ov.dtype), ov.row_stride);
    check_launch("moe_experts (combine)", shapes);
    return;
  }
  // Prefill on BF16 experts: CUTLASS's Hopper grouped GEMMs (moe_cutlass.cu; the default,
  // CudaOptions::moe_cutlass false for the own tiles); never batch-invariant (that mode keeps the
  // own kernels) and never clamped (its SwiGLU has no clamp: V4's clamped experts take the own
  // path below; found by AttentionMoe.MoeExpertsClamped on the merged branches, H200).
  if (!fp8 && !few_rows && !clamped && !options_.batch_invariant && moe_cutlass_ && cutlass_moe_fits(H, I) &&
      lda % 8 == 0 && (reinterpret_cast<uintptr_t>(a) & 15) == 0) {
    const float* yc = moe_experts_cutlass(a, lda, P, E, H, I, ptrs, row_token, offsets, shapes);
    launch_pdl(pdl_, combine_grid(T, H), kCombineThreads, 0, stream_, moe_combine_kernel,
        yc, H, entry_pos, topk_weights.ptr<float>(), K, ov.data, float_kind(ov.dtype), ov.row_stride);
    check_launch("moe_experts (combine)", shapes);
    return;
  }
  bf16* hidden = static_cast<bf16*>(scratch(kSlotMoeHidden, size_t{2} * P * 2 * I, "moe_experts"));
  bf16* act = static_cast<bf16*>(scratch(kSlotMoeAct, size_t{2} * P * I, "moe_experts"));
  float* y = static_cast<float*>(scratch(kSlotMoeOut, size_t{4} * P * H, "moe_experts"));

  GemmProblem p;
  p.group_offsets = offsets;
  p.num_groups = E;
  p.max_rows = P;
  p.M = P;
  p.w_kind = fp8 ? kWeightFP8 : kWeightBF16;
  p.tiles = tiles;
  p.num_tiles = num_tiles;
  p.tile_rows = tile_rows;
  p.max_tiles = max_tiles;
  p.c_bf16 = 1;
  if (compact) {
    p.active_groups = active;
    p.num_active_groups = num_active;
  }
  // gate -> hidden[:, :I], up -> hidden[:, I:]   (rows gathered from x by row_token)
  p.a = a;
  p.lda = lda;
  p.a_rows = row_token;
  p.N = static_cast<int>(I);
  p.K = static_cast<int>(H);
  p.scale_cols = static_cast<int>((H + 127) / 128);
  p.ldc = 2 * I;
  // gate | up as one launch of 2I columns on the stream kernel when it takes the problem.
  GemmProblem pair = p;
  pair.N = static_cast<int>(2 * I);
  pair.n_half = static_cast<int>(I);
  pair.w_ptrs = ptrs;
  pair.s_ptrs = reinterpret_cast<const float* const*>(ptrs + size_t{3} * E);
  pair.w2_ptrs = ptrs + static_cast<size_t>(E);
  pair.s2_ptrs = reinterpret_cast<const float* const*>(ptrs + size_t{4} * E);
  pair.c = hidden;
  // On the pipeline kernel gate|up forms the SwiGLU in its epilogue (unclamped experts): act
  // directly, no silu_mul launch and no [P, 2I] hidden round trip; the same bits
  // (GemmProblem::swiglu). H200 (bench/NOTES.md moe18): graph decode step -20 / -29 / -46 / -56 us
  // bf16 at batch 1 / 8 / 32 / 64, -12 / -30 / -50 / -79 us FP8.
  GemmProblem fused = pair;
  fused.swiglu = 1;
  fused.c = act;
  fused.ldc = I;
  bool swiglu_done = false;
  // The expert GEMMs on the pipeline kernel; false when it does not take them.
  if (pipe && !clamped && launch_pipe(fused, "moe_experts (gate|up swiglu)", shapes)) {
    swiglu_done = true;
  } else if (pipe && launch_pipe(pair, "moe_experts (gate|up)", shapes)) {
  } else if ((few_rows || options_.batch_invariant) && stream_gemm_ && stream_gemm_supported(pair)) {
    launch_gemm(pair, "moe_experts (gate|up)", few_rows);
  } else {
    for (int j = 0; j < 2; ++j) {
      p.w_ptrs = ptrs + static_cast<size_t>(j) * E;
      p.s_ptrs = reinterpret_cast<const float* const*>(ptrs + (3 + static_cast<size_t>(j)) * E);
      p.c = hidden + j * I;
      launch_gemm(p, j == 0 ? "moe_experts (gate)" : "moe_experts (up)", few_rows);
    }
  }
  // down: act [P, I] -> y [P, H] (F32 for the combine), act = silu(gate) * up
  p.a_rows = nullptr;
  p.N = static_cast<int>(H);
  p.K = static_cast<int>(I);
  p.scale_cols = static_cast<int>((I + 127) / 128);
  p.w_ptrs = ptrs + size_t{2} * E;
  p.s_ptrs = reinterpret_cast<const float* const*>(ptrs + size_t{5} * E);
  p.c = y;
  p.ldc = H;
  p.c_bf16 = 0;
  Tensor hid(hidden, DType::BF16, {P, 2 * I}, Device::CUDA);
  Tensor actt(act, DType::BF16, {P, I}, Device::CUDA);
  if (clamped)
    silu_mul_clamped(hid, limit, actt);
  else if (!swiglu_done)
    silu_mul(hid, actt);
  p.a = act;
  p.lda = I;
  // On the pipeline kernel the down GEMM is a programmatic dependent that reads its tile list and
  // streams its first weight chunks before its wait (GemmProblem::tiles_early): the tile list is
  // the index kernel's, two launches back (three with silu_mul), and every kernel here triggers
  // only after its own wait (pdl_launch.cuh), so when the down GEMM starts the index kernel has
  // completed; only act comes from the kernel before. Its blocks take the SM slots that gate|up's
  // blocks free at its ragged end. H200 (bench/NOTES.md moe18), on top of the epilogue: -25 / -8 us
  // per bf16 step at batch 1 / 8, -16 / -19 / -15 us FP8 at 1 / 8 / 32, -5..+13 us at 32 / 64.
  p.tiles_early = 1;
  if (!(pipe && launch_pipe(p, "moe_experts (down)", shapes))) {
    p.tiles_early = 0;
    launch_gemm(p, "moe_experts (down)", few_rows);
  }
  launch_pdl(pdl_, combine_grid(T, H), kCombineThreads, 0, stream_, moe_combine_kernel,
      y, H, entry_pos, topk_weights.ptr<float>(), K, ov.data, float_kind(ov.dtype), ov.row_stride);
  check_launch("moe_experts (combine)", shapes);
}

// The combine alone (expert-parallel dispatch, model/expert_parallel.h): the kernel every
// moe_experts path ends with, on rows the caller placed (pos -1: skipped), so the bits are those
// of moe_experts' own combine of the same expert outputs.
void CudaBackend::moe_combine(const Tensor& y, const Tensor& pos, const Tensor& topk_weights, Tensor& out) {
  const RowView yv = rows_of(y, "moe_combine y");
  const RowView ov = rows_of(out, "moe_combine out");
  check_float(out, "moe_combine out");
  check_dtype(pos, DType::I32, "moe_combine pos");
  check_dtype(topk_weights, DType::F32, "moe_combine topk_weights");
  const int64_t T = ov.rows, H = ov.cols;
  DI_CHECK(yv.dtype == DType::F32 && yv.cols == H && yv.row_stride == H && pos.ndim == 2 && pos.shape[0] == T &&
               pos.is_contiguous() && topk_weights.ndim == 2 && topk_weights.shape[0] == T &&
               topk_weights.shape[1] == pos.shape[1] && topk_weights.is_contiguous(),
           "moe_combine: y ", y.describe(), " (F32 [P, H], contiguous), pos ", pos.describe(), " and topk_weights ",
           topk_weights.describe(), " ([T, k]) do not match out ", out.describe());
  if (T == 0) return;
  const int K = static_cast<int>(pos.shape[1]);
  launch_pdl(pdl_, combine_grid(T, H), kCombineThreads, 0, stream_, moe_combine_kernel,
      static_cast<const float*>(yv.data), H, pos.ptr<int32_t>(), topk_weights.ptr<float>(), K, ov.data,
      float_kind(ov.dtype), ov.row_stride);
  check_launch("moe_combine", out.describe());
}

}  // namespace deepinfer::cuda
