// Default Backend::rms_norm_pair and Backend::mla_rope_store: compositions of rms_norm,
// rope, kv_store and copy. They are the reference for backends that fuse them (tests/ops
// compares CUDA with them) and the CPU implementation.
#include "backend/backend.h"
#include "core/dtype.h"

namespace deepinfer {

void Backend::rms_norm_pair(const Tensor& x1, const Tensor& w1, Tensor& out1, const Tensor& x2,
                            const Tensor& w2, Tensor& out2, float eps) {
  rms_norm(x1, w1, eps, out1);
  rms_norm(x2, w2, eps, out2);
}

void Backend::mla_rope_store(Tensor& q, Tensor& kv_rows, const Tensor& positions,
                             const Tensor& cos_sin, int q_rope_offset, int kv_rope_offset,
                             int rope_dim, bool interleave, PagedKV& kv, Tensor& q_rope_out) {
  rope(q, positions, cos_sin, q_rope_offset, rope_dim, interleave);
  rope(kv_rows, positions, cos_sin, kv_rope_offset, rope_dim, interleave);
  kv_store(kv_rows, kv);
  if (!q_rope_out.defined()) return;
  DI_CHECK(q.ndim == 3 && q_rope_out.ndim == 3 && q_rope_out.shape[0] == q.shape[0] &&
               q_rope_out.shape[1] == q.shape[1] && q_rope_out.shape[2] == rope_dim,
           "mla_rope_store: q_rope_out ", q_rope_out.describe(), " must be [", q.shape[0], ", ",
           q.ndim == 3 ? q.shape[1] : 0, ", ", rope_dim, "] for q ", q.describe());
  Tensor q_rope = q;  // [T, heads, rope_dim] view at q_rope_offset
  q_rope.shape[2] = rope_dim;
  q_rope.data = static_cast<char*>(q.data) + int64_t{q_rope_offset} * static_cast<int64_t>(dtype_size(q.dtype));
  copy(q_rope, q_rope_out);
}

}  // namespace deepinfer
