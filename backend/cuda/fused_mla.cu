// Fused MLA steps that save launches at decode: rms_norm_pair (MLA's q_a and c_kv norms in
// one launch) and mla_rope_store (rope of q and of the latent row, the cache store and the
// absorbed query's rope copy in one launch). Each computes, element by element, what the
// unfused kernels of elementwise.cu compute (same per-row thread count and reduction tree
// for the norms, the same rope expression), so fused and unfused agree to the bit.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/pdl_launch.cuh"
#include "backend/cuda/rms_norm_row.cuh"

namespace deepinfer::cuda {
namespace {

struct NormSide {
  const void* x;
  void* out;
  const void* w;
  int64_t ldx, ldo, H;
  int x_kind, o_kind, w_kind, threads;  // threads: what rms_norm would launch for this H
};

// grid (rows, 2), 256 threads: blockIdx.y picks the side. Only `threads` of them work on a
// side, with the reduction tree of elementwise.cu's block_sum over that many threads.
__global__ void rms_norm_pair_kernel(NormSide a, NormSide b, float eps) {
  pdl_wait();     // a programmatic dependent (pdl_launch.cuh)
  pdl_trigger();  // q_b may start streaming its weights (dec18)
  __shared__ float scratch[32];
  const NormSide& s = blockIdx.y == 0 ? a : b;
  const int64_t r = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const bool active = tid < s.threads;
  float ss = 0.0f;
  if (active)
    for (int64_t c = tid; c < s.H; c += s.threads) {
      const float v = ld(s.x, r * s.ldx + c, s.x_kind);
      ss += v * v;
    }
  ss = warp_sum(ss);
  if (lane == 0) scratch[warp] = ss;
  __syncthreads();
  float total = lane < (s.threads >> 5) ? scratch[lane] : 0.0f;
  total = warp_sum(total);
  const float inv = rsqrtf(total / static_cast<float>(s.H) + eps);
  if (!active) return;
  for (int64_t c = tid; c < s.H; c += s.threads)
    st(s.out, r * s.ldo + c, s.o_kind, ld(s.x, r * s.ldx + c, s.x_kind) * inv * ld(s.w, c, s.w_kind));
}

// The register form (rms_norm_row.cuh): grid (rows, 2), 256 threads, both sides of 1 to
// kNormRegs x their threads columns (else the loop above). Same bits as the loop.
__global__ void rms_norm_pair_regs_kernel(NormSide a, NormSide b, float eps) {
  __shared__ float scratch[32];
  const NormSide& s = blockIdx.y == 0 ? a : b;
  const NormRow n{s.x, nullptr, s.w, s.out, s.ldx, 0, s.ldo, s.H, s.o_kind};
  rms_norm_row_regs(n, s.x_kind, s.w_kind, blockIdx.x, s.threads, eps, false, scratch);
}

struct RopeStoreArgs {
  void* q;
  int q_kind;
  int64_t q_s0, q_s1;
  int H, q_off;
  void* kv;
  int kv_kind;
  int64_t kv_s0;
  int D, kv_off;
  const int32_t* positions;
  const float* cos_sin;
  int rope_dim;
  bool interleave;
  const int32_t* slots;
  int64_t num_slots;
  void* cache;
  int cache_kind;
  void* qr;  // nullptr: no copy
  int qr_kind;
  int64_t qr_s0, qr_s1;
};

// grid (T), 256 threads: token t's q pairs (H x rope_dim / 2), its latent row's rope pairs
// and the row's other columns (copied to the cache slot).
__global__ void mla_rope_store_kernel(RopeStoreArgs a) {
  pdl_wait();  // a programmatic dependent (pdl_launch.cuh)
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const int half = a.rope_dim / 2;
  const float* cs = a.cos_sin + static_cast<int64_t>(a.positions[t]) * a.rope_dim;
  const int32_t slot = a.slots[t];
  const bool store = slot >= 0 && slot < a.num_slots;  // -1: do not store
  const int64_t crow = static_cast<int64_t>(slot) * a.D;
  const int q_pairs = a.H * half;
  const int items = q_pairs + half + (a.D - a.rope_dim);
  for (int i = threadIdx.x; i < items; i += blockDim.x) {
    if (i < q_pairs + half) {
      const bool is_q = i < q_pairs;
      const int p = is_q ? i % half : i - q_pairs;
      const int64_t h = is_q ? i / half : 0;
      const float c = cs[p], s = cs[half + p];
      const int64_t base = is_q ? t * a.q_s0 + h * a.q_s1 + a.q_off : t * a.kv_s0 + a.kv_off;
      const int ca = a.interleave ? 2 * p : p, cb = a.interleave ? 2 * p + 1 : p + half;
      void* x = is_q ? a.q : a.kv;
      const int kind = is_q ? a.q_kind : a.kv_kind;
      const float x0 = ld(x, base + ca, kind), x1 = ld(x, base + cb, kind);
      const float y0 = round_to(x0 * c - x1 * s, kind), y1 = round_to(x1 * c + x0 * s, kind);
      st(x, base + ca, kind, y0);
      st(x, base + cb, kind, y1);
      if (is_q && a.qr) {
        const int64_t o = t * a.qr_s0 + h * a.qr_s1;
        st(a.qr, o + ca, a.qr_kind, y0);
        st(a.qr, o + cb, a.qr_kind, y1);
      } else if (!is_q && store) {
        st(a.cache, crow + a.kv_off + ca, a.cache_kind, y0);
        st(a.cache, crow + a.kv_off + cb, a.cache_kind, y1);
      }
    } else if (store) {
      int c = i - q_pairs - half;  // the row's columns outside [kv_off, kv_off + rope_dim)
      if (c >= a.kv_off) c += a.rope_dim;
      st(a.cache, crow + c, a.cache_kind, ld(a.kv, t * a.kv_s0 + c, a.kv_kind));
    }
  }
}

NormSide norm_side(const Tensor& x, const Tensor& w, const Tensor& out, const char* what) {
  const RowView xv = rows_of(x, what);
  const RowView ov = rows_of(out, what);
  check_float(x, what);
  check_float(out, what);
  check_float(w, what);
  DI_CHECK(w.numel() == xv.cols && w.is_contiguous() && ov.rows == xv.rows && ov.cols == xv.cols,
           what, ": x ", x.describe(), ", weight ", w.describe(), ", out ", out.describe(),
           " do not match");
  return NormSide{xv.data, ov.data, w.data, xv.row_stride, ov.row_stride, xv.cols,
                  float_kind(xv.dtype), float_kind(ov.dtype), float_kind(w.dtype),
                  xv.cols >= 1024 ? 256 : 128};
}

}  // namespace

void CudaBackend::rms_norm_pair(const Tensor& x1, const Tensor& w1, Tensor& out1, const Tensor& x2,
                                const Tensor& w2, Tensor& out2, float eps) {
  const NormSide a = norm_side(x1, w1, out1, "rms_norm_pair (first)");
  const NormSide b = norm_side(x2, w2, out2, "rms_norm_pair (second)");
  const int64_t rows = rows_of(x1, "rms_norm_pair x1").rows;
  if (rows != rows_of(x2, "rms_norm_pair x2").rows) {  // different row counts: two launches
    rms_norm(x1, w1, eps, out1);
    rms_norm(x2, w2, eps, out2);
    return;
  }
  if (rows == 0) return;
  const bool regs = a.H >= 1 && b.H >= 1 && a.H <= int64_t{kNormRegs} * a.threads &&
                    b.H <= int64_t{kNormRegs} * b.threads;
  if (regs)
    launch_pdl(pdl_, dim3(static_cast<unsigned>(rows), 2), 256, 0, stream_, rms_norm_pair_regs_kernel, a, b, eps);
  else
    launch_pdl(pdl_, dim3(static_cast<unsigned>(rows), 2), 256, 0, stream_, rms_norm_pair_kernel, a, b, eps);
  check_launch("rms_norm_pair", x1.describe() + " / " + x2.describe());
}

void CudaBackend::mla_rope_store(Tensor& q, Tensor& kv_rows, const Tensor& positions,
                                 const Tensor& cos_sin, int q_rope_offset, int kv_rope_offset,
                                 int rope_dim, bool interleave, PagedKV& kv, Tensor& q_rope_out) {
  check_float(q, "mla_rope_store q");
  check_float(kv_rows, "mla_rope_store kv_rows");
  check_float(kv.cache, "mla_rope_store cache");
  check_dtype(positions, DType::I32, "mla_rope_store positions");
  check_dtype(cos_sin, DType::F32, "mla_rope_store cos_sin");
  check_dtype(kv.slot_mapping, DType::I32, "mla_rope_store slot_mapping");
  const RowView r = rows_of(kv_rows, "mla_rope_store kv_rows");
  DI_CHECK(q.ndim == 3 && q.stride[2] == 1, "mla_rope_store: q must be [T, heads, dim] with contiguous dim, got ",
           q.describe());
  const int64_t T = q.shape[0], H = q.shape[1];
  DI_CHECK(rope_dim > 0 && rope_dim % 2 == 0 && q_rope_offset >= 0 &&
               q_rope_offset + rope_dim <= q.shape[2] && kv_rope_offset >= 0 &&
               kv_rope_offset + rope_dim <= r.cols && r.rows == T,
           "mla_rope_store: rope [", q_rope_offset, " / ", kv_rope_offset, ", + ", rope_dim,
           ") outside q ", q.describe(), " or kv_rows ", kv_rows.describe());
  DI_CHECK(positions.numel() == T && cos_sin.ndim == 2 && cos_sin.shape[1] == rope_dim &&
               cos_sin.is_contiguous(),
           "mla_rope_store: positions ", positions.describe(), " / cos_sin ", cos_sin.describe(),
           " do not match q ", q.describe());
  DI_CHECK(kv.cache.ndim == 3 && kv.cache.is_contiguous() && kv.cache.shape[2] == r.cols &&
               kv.slot_mapping.numel() == T,
           "mla_rope_store: cache ", kv.cache.describe(), " / slot_mapping ", kv.slot_mapping.describe(),
           " do not match kv_rows ", kv_rows.describe());
  RopeStoreArgs a{};
  if (q_rope_out.defined()) {
    check_float(q_rope_out, "mla_rope_store q_rope_out");
    DI_CHECK(q_rope_out.ndim == 3 && q_rope_out.shape[0] == T && q_rope_out.shape[1] == H &&
                 q_rope_out.shape[2] == rope_dim && q_rope_out.stride[2] == 1,
             "mla_rope_store: q_rope_out ", q_rope_out.describe(), " must be [", T, ", ", H, ", ",
             rope_dim, "] with contiguous last dim");
    a.qr = q_rope_out.data;
    a.qr_kind = float_kind(q_rope_out.dtype);
    a.qr_s0 = q_rope_out.stride[0];
    a.qr_s1 = q_rope_out.stride[1];
  }
  if (T == 0) return;
  a.q = q.data;
  a.q_kind = float_kind(q.dtype);
  a.q_s0 = q.stride[0];
  a.q_s1 = q.stride[1];
  a.H = static_cast<int>(H);
  a.q_off = q_rope_offset;
  a.kv = r.data;
  a.kv_kind = float_kind(r.dtype);
  a.kv_s0 = r.row_stride;
  a.D = static_cast<int>(r.cols);
  a.kv_off = kv_rope_offset;
  a.positions = positions.ptr<int32_t>();
  a.cos_sin = cos_sin.ptr<float>();
  a.rope_dim = rope_dim;
  a.interleave = interleave;
  a.slots = kv.slot_mapping.ptr<int32_t>();
  a.num_slots = kv.cache.shape[0] * kv.cache.shape[1];
  a.cache = kv.cache.data;
  a.cache_kind = float_kind(kv.cache.dtype);
  launch_pdl(pdl_, static_cast<unsigned>(T), 256, 0, stream_, mla_rope_store_kernel, a);
  check_launch("mla_rope_store", q.describe() + " / " + kv_rows.describe() + " -> " + kv.cache.describe());
}

}  // namespace deepinfer::cuda
