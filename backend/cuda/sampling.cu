// Backend::sample on the device: the rule of backend/sample_rule.h (the CPU reference is
// backend/cpu/sampling_rows.cpp) in three launches.
//
//   row_max_kernel  grid (blocks_per_row, R): per-block max of s = l / T  -> partial [R, nb]
//   pack_kernel     grid (blocks_per_row, R): each element's rule values computed ONCE
//                   (fdiv, own exp, weight, key, min-p) -> packed [R, V] uint64
//   sample_kernel   one 1024-thread block per row, reading only the packed elements:
//                   (1) top-k cut: radix select over the order (s desc, id asc) with count
//                   weights; (2) top-p cut: the same select with the integer weights W;
//                   (3) draw: prefix sum of the kept W in id order.
// The selects walk the 32-bit order key 8 bits per pass with a 256-bin histogram (warp-
// aggregated atomics on integers: the result does not depend on thread timing), then settle
// ties at the cut key by a prefix sum in id order. Every sum is an integer and the max is an
// exact fmax, so the token equals the reference's bit for bit, and a row's token depends only
// on its own row. The packed rows of a step (R x V x 8 bytes: 64 x 1 MB) stay in L2 on the
// H200 (50 MB) for the ~8 passes of the per-row block. Greedy rows skip the first two launches.
// A row holding a NaN logit gets sample_rule::kNoToken (-1), as the reference: row_max_kernel
// marks it with a +inf partial max (greedy rows: the argmax pass sees it).
#include "backend/cuda/cuda_backend.h"
#include "backend/sample_rule.h"

namespace deepinfer::cuda {
namespace {

namespace rule = ::deepinfer::sample_rule;
constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
// The many-block launches: kPrepThreads threads x kPrepItems elements per block.
constexpr int kPrepThreads = 256;
constexpr int kPrepItems = 4;
constexpr int64_t kPrepSpan = kPrepThreads * kPrepItems;

// One logit seen by the rule: its order key, weight and whether it is a candidate
// (finite, and e >= min_p).
struct Elem {
  uint32_t key = 0;
  uint32_t weight = 0;
  bool candidate = false;
};

// Packed element (uint64): key in the high 32 bits; the low 32 bits hold the weight
// (<= 2^26) and bit 31 the candidate flag. A non-candidate packs to 0.
__device__ __forceinline__ uint64_t pack(const Elem& e) {
  return e.candidate ? (static_cast<uint64_t>(e.key) << 32) | 0x80000000ull | e.weight : 0ull;
}
__device__ __forceinline__ Elem unpack(uint64_t x) {
  Elem e;
  e.key = static_cast<uint32_t>(x >> 32);
  const uint32_t lo = static_cast<uint32_t>(x);
  e.candidate = (lo >> 31) != 0;
  e.weight = lo & 0x7fffffffu;
  return e;
}

// The rule for element v of a row with max s = max_s (computed once per element, in
// pack_kernel).
__device__ Elem rule_at(float logit, float temperature, float min_p, float max_s) {
  Elem e;
  const float s = rule::fdiv(logit, temperature);
  if (!rule::is_finite(s)) return e;
  const float x = rule::fadd(s, -max_s);
  if (min_p > 0.0f && !(rule::exp_neg(x) >= min_p)) return e;
  e.key = rule::order_key(s);
  e.weight = rule::weight(x);
  e.candidate = true;
  return e;
}

// A row's packed elements [V].
struct PackedRow {
  const uint64_t* p;
  __device__ Elem at(int64_t v) const { return unpack(p[v]); }
};

// A cut of the order (key desc, id asc): elements at or before (key, id) stay.
struct Cut {
  bool active = false;
  uint32_t key = 0;
  int64_t id = 0;
  __device__ bool keeps(uint32_t k, int64_t v) const {
    return !active || k > key || (k == key && v <= id);
  }
};

struct Shared {
  unsigned long long hist[256];
  unsigned long long warp_sums[kWarps];
  float warp_max[kWarps];
  unsigned long long bcast[4];
  int64_t found_id;
};

// Max over the block's threads of v (any block size that is a multiple of 32, <= 1024).
__device__ float block_max(float v, float* warp_max) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int num_warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  v = lane < num_warps ? warp_max[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Max of the row's per-block partial maxima partial[nb] (fmax is exact: any order).
__device__ float row_max_of(const float* partial, int64_t nb, float* warp_max) {
  float m = -INFINITY;
  for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) m = fmaxf(m, partial[b]);
  return block_max(m, warp_max);
}

// partial[r, blockIdx.x] = max of the finite s = l / T over the block's kPrepSpan ids.
__global__ void __launch_bounds__(kPrepThreads)
    row_max_kernel(const float* logits, int64_t ld_row, int64_t V, const SampleRowParams* params,
                   float* partial) {
  __shared__ float warp_max[kPrepThreads / 32];
  const int64_t r = blockIdx.y;
  const float temperature = params[r].temperature;
  if (rule::is_greedy(temperature)) return;  // greedy: sample_kernel reads the logits itself
  const float* l = logits + r * ld_row;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kPrepSpan;
  float m = -INFINITY;
  int nan = 0;
#pragma unroll
  for (int i = 0; i < kPrepItems; ++i) {
    const int64_t v = base + i * kPrepThreads + threadIdx.x;
    if (v < V) {
      nan |= rule::is_nan(l[v]);
      const float s = rule::fdiv(l[v], temperature);
      if (rule::is_finite(s)) m = fmaxf(m, s);
    }
  }
  m = block_max(m, warp_max);
  // A NaN logit marks the block's partial +inf (never a max of finite s): the row has no token.
  if (__syncthreads_or(nan)) m = INFINITY;
  if (threadIdx.x == 0) partial[r * gridDim.x + blockIdx.x] = m;
}

// packed[r, v] = pack(rule_at(l[r, v])) for the block's kPrepSpan ids.
__global__ void __launch_bounds__(kPrepThreads)
    pack_kernel(const float* logits, int64_t ld_row, int64_t V, const SampleRowParams* params,
                const float* partial, uint64_t* packed) {
  __shared__ float warp_max[kPrepThreads / 32];
  const int64_t r = blockIdx.y;
  const SampleRowParams& p = params[r];
  const float temperature = p.temperature, min_p = p.min_p;
  if (rule::is_greedy(temperature)) return;
  const float max_s = row_max_of(partial + r * gridDim.x, gridDim.x, warp_max);
  const float* l = logits + r * ld_row;
  uint64_t* out = packed + r * V;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kPrepSpan;
#pragma unroll
  for (int i = 0; i < kPrepItems; ++i) {
    const int64_t v = base + i * kPrepThreads + threadIdx.x;
    if (v < V) out[v] = pack(rule_at(l[v], temperature, min_p, max_s));
  }
}

// The first id v (in id order) whose running sum of weight_of(v) reaches need =
// need_of(total), total being the row's sum of weight_of; -1 when need is 0 or above the
// total. Warp w owns the contiguous ids [w * chunk, (w + 1) * chunk) and reads them 32 at a
// time (coalesced); the warp holding the point then walks its chunk with a warp scan.
template <class WeightOf, class NeedOf>
__device__ int64_t first_reaching(int64_t V, WeightOf weight_of, NeedOf need_of, Shared& sh) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // every thread has read the previous call's found_id
  const int64_t chunk = ((V + kWarps - 1) / kWarps + 31) / 32 * 32;
  const int64_t begin = warp * chunk, end = min(V, begin + chunk);
  unsigned long long mine = 0;
  for (int64_t v = begin + lane; v < end; v += 32) mine += weight_of(v);
  for (int o = 16; o > 0; o >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, o);  // warp total
  if (lane == 0) sh.warp_sums[warp] = mine;
  if (threadIdx.x == 0) sh.found_id = -1;
  __syncthreads();
  unsigned long long before = 0, total = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += sh.warp_sums[w];
    total += sh.warp_sums[w];
  }
  const unsigned long long need = need_of(total);
  if (need > 0 && before < need && need <= before + mine) {  // warp-uniform
    unsigned long long cum = before;
    for (int64_t base = begin; base < end; base += 32) {
      const int64_t v = base + lane;
      unsigned long long inc = v < end ? weight_of(v) : 0ull;
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
      }
      const unsigned reached = __ballot_sync(0xffffffffu, cum + inc >= need);
      if (reached != 0) {
        if (lane == __ffs(reached) - 1) sh.found_id = v;
        break;
      }
      cum += __shfl_sync(0xffffffffu, inc, 31);
    }
  }
  __syncthreads();
  return sh.found_id;
}

// Cut of the order (key desc, id asc) over members at the first element where the running
// weight reaches need_of(total weight); inactive when need_of returns 0 (no cut).
// member_of says membership (a member may weigh 0); weight_of(elem) is a member's weight.
template <class MemberOf, class WeightOf, class NeedOf>
__device__ Cut radix_cut(const PackedRow& row, int64_t V, MemberOf member_of, WeightOf weight_of,
                         NeedOf need_of, Shared& sh) {
  const int lane = threadIdx.x % 32;
  uint32_t prefix = 0, prefix_mask = 0;
  unsigned long long above = 0, need = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) sh.hist[b] = 0;
    __syncthreads();
    const int64_t rounds = (V + kThreads - 1) / kThreads;
    for (int64_t i = 0; i < rounds; ++i) {
      const int64_t v = i * kThreads + threadIdx.x;
      bool in = false;
      uint32_t digit = 0, w = 0;
      if (v < V) {
        const Elem e = row.at(v);
        in = e.candidate && member_of(e, v) && (e.key & prefix_mask) == prefix;
        digit = (e.key >> shift) & 255u;
        w = in ? weight_of(e) : 0u;
      }
      // Lanes with the same bucket add their weights (<= 32 * 2^26 < 2^32) in one atomic.
      const unsigned active = __ballot_sync(0xffffffffu, in);
      if (in) {
        const unsigned peers = __match_any_sync(active, digit);
        const uint32_t sum = __reduce_add_sync(peers, w);
        if (lane == __ffs(peers) - 1) atomicAdd(&sh.hist[digit], static_cast<unsigned long long>(sum));
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      if (shift == 24) {
        unsigned long long total = 0;
        for (int b = 0; b < 256; ++b) total += sh.hist[b];
        need = need_of(total);
      }
      unsigned long long acc = above;
      int chosen = -1;
      if (need > 0) {
        for (int b = 255; b >= 0; --b) {
          if (acc + sh.hist[b] >= need) {
            chosen = b;
            break;
          }
          acc += sh.hist[b];
        }
      }
      sh.bcast[0] = need;
      sh.bcast[1] = acc;
      sh.bcast[2] = static_cast<unsigned long long>(chosen + 1);
    }
    __syncthreads();
    need = sh.bcast[0];
    above = sh.bcast[1];
    const int chosen = static_cast<int>(sh.bcast[2]) - 1;
    __syncthreads();
    if (chosen < 0) return Cut{};  // no cut (need 0, or fewer members than need)
    prefix |= static_cast<uint32_t>(chosen) << shift;
    prefix_mask |= 255u << shift;
  }
  // Ties at the cut key: the first (lowest id) where the running weight reaches need.
  const unsigned long long tie_need = need - above;
  auto tie_weight = [&](int64_t v) -> unsigned long long {
    const Elem e = row.at(v);
    return e.candidate && e.key == prefix && member_of(e, v) ? weight_of(e) : 0u;
  };
  Cut cut;
  cut.active = true;
  cut.key = prefix;
  cut.id = first_reaching(V, tie_weight, [tie_need](unsigned long long) { return tie_need; }, sh);
  return cut;
}

// One block per row. packed [R, V] and partial [R, nb] from the two launches before
// (unused for greedy rows).
__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* logits, int64_t ld_row, int64_t V, const SampleRowParams* params,
                  const float* partial, int64_t nb, const uint64_t* packed, int32_t* ids) {
  __shared__ Shared sh;
  const int64_t r = blockIdx.x;
  const float* l = logits + r * ld_row;
  const SampleRowParams p = params[r];
  if (rule::is_greedy(p.temperature)) {
    // Greedy: argmax, lowest id on ties; a row with a NaN has no token (as Backend::argmax).
    float best = -INFINITY;
    int64_t best_id = V;
    int nan = 0;
    for (int64_t v = threadIdx.x; v < V; v += kThreads) {
      const float x = l[v];
      nan |= rule::is_nan(x);
      if (x > best || (x == best && best_id == V)) best = x, best_id = v;
    }
    const float m = block_max(best, sh.warp_max);
    if (threadIdx.x == 0) sh.found_id = V;
    const int any_nan = __syncthreads_or(nan);
    if (best_id < V && best == m) atomicMin(reinterpret_cast<unsigned long long*>(&sh.found_id),
                                            static_cast<unsigned long long>(best_id));
    __syncthreads();
    if (threadIdx.x == 0)
      ids[r] = any_nan ? rule::kNoToken : static_cast<int32_t>(sh.found_id < V ? sh.found_id : 0);
    return;
  }
  const float row_max = row_max_of(partial + r * nb, nb, sh.warp_max);
  if (row_max == -INFINITY || row_max == INFINITY) {
    // no finite logit, or a NaN logit (row_max_kernel's +inf mark): no token
    if (threadIdx.x == 0) ids[r] = rule::kNoToken;
    return;
  }
  const PackedRow row{packed + r * V};
  auto all = [](const Elem&, int64_t) { return true; };
  Cut top_k;
  if (p.top_k > 0) {
    const unsigned long long k = static_cast<unsigned long long>(p.top_k);
    top_k = radix_cut(
        row, V, all, [](const Elem&) { return 1u; },
        [k](unsigned long long count) { return k < count ? k : 0ull; }, sh);
  }
  auto in_top_k = [top_k](const Elem& e, int64_t v) { return top_k.keeps(e.key, v); };
  auto w_of = [](const Elem& e) { return e.weight; };
  Cut top_p;
  if (p.top_p < 1.0f) {
    const float top_p_frac = p.top_p;
    top_p = radix_cut(
        row, V, in_top_k, w_of,
        [top_p_frac](unsigned long long total) { return rule::top_p_need(top_p_frac, total); }, sh);
  }
  auto kept_weight = [&](int64_t v) -> unsigned long long {
    const Elem e = row.at(v);
    return e.candidate && top_k.keeps(e.key, v) && top_p.keeps(e.key, v) ? e.weight : 0u;
  };
  // The draw's point from the kept total, then the token (one pass for both).
  const uint64_t bits = rule::philox_bits53(p.seed, p.stream, p.position);
  const int64_t id = first_reaching(
      V, kept_weight,
      [bits](unsigned long long total) { return rule::draw_target(bits, total) + 1; }, sh);
  if (threadIdx.x == 0) ids[r] = static_cast<int32_t>(id >= 0 ? id : rule::kNoToken);
}

}  // namespace

void CudaBackend::sample(const Tensor& logits, const Tensor& row_params, Tensor& ids) {
  const RowView l = rows_of(logits, "sample logits");
  check_dtype(logits, DType::F32, "sample logits");
  check_dtype(row_params, DType::I32, "sample row_params");
  check_dtype(ids, DType::I32, "sample ids");
  DI_CHECK(row_params.is_contiguous() && row_params.numel() == l.rows * kSampleRowWords,
           "sample: row_params ", row_params.describe(), " must be contiguous I32 [", l.rows, ", ",
           kSampleRowWords, "] (SampleRowParams per row of ", logits.describe(), ")");
  DI_CHECK(ids.is_contiguous() && ids.numel() == l.rows, "sample: ids ", ids.describe(),
           " must have one entry per row of ", logits.describe());
  if (l.rows == 0) return;
  DI_CHECK(l.rows <= 65535, "sample: ", logits.describe(), " has ", l.rows,
           " rows; at most 65535 per call (grid y of the pack launches)");
  const int64_t V = l.cols;
  const int64_t nb = (V + kPrepSpan - 1) / kPrepSpan;
  // Scratch: packed [R, V] uint64, then the partial maxima [R, nb] float. Grows only on a
  // larger R x V than before (sample runs outside the runner's graph captures).
  const size_t packed_bytes = static_cast<size_t>(l.rows * V) * sizeof(uint64_t);
  const size_t partial_bytes = static_cast<size_t>(l.rows * nb) * sizeof(float);
  char* base = static_cast<char*>(scratch(kSlotSample, packed_bytes + partial_bytes, "sample"));
  uint64_t* packed = reinterpret_cast<uint64_t*>(base);
  float* partial = reinterpret_cast<float*>(base + packed_bytes);
  const float* lp = static_cast<const float*>(l.data);
  const auto* pp = static_cast<const SampleRowParams*>(row_params.data);
  if (V > 0) {
    const dim3 grid(static_cast<unsigned>(nb), static_cast<unsigned>(l.rows));
    row_max_kernel<<<grid, kPrepThreads, 0, stream_>>>(lp, l.row_stride, V, pp, partial);
    check_launch("sample (row max)", logits.describe());
    pack_kernel<<<grid, kPrepThreads, 0, stream_>>>(lp, l.row_stride, V, pp, partial, packed);
    check_launch("sample (pack)", logits.describe());
  }
  sample_kernel<<<static_cast<unsigned>(l.rows), kThreads, 0, stream_>>>(
      lp, l.row_stride, V, pp, partial, nb, packed, ids.ptr<int32_t>());
  check_launch("sample", logits.describe());
}

}  // namespace deepinfer::cuda
