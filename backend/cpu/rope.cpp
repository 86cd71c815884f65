// rope: rotates x[t, h, rope_offset : rope_offset + rope_dim] in place by the angle
// table row positions[t] (cos_sin [max_positions, rope_dim] = [cos | sin], any YaRN
// attention factor already folded in). Interleaved (DeepSeek rope_interleave): pairs
// (2i, 2i+1) rotate by angle i. Halves: pairs (i, i + rope_dim/2) rotate by angle i.
// Pairs stay in place; transformers' interleaved variant writes the rotated pairs
// de-interleaved, which permutes q and k the same way and leaves q·k unchanged.
#include "backend/cpu/cpu_backend.h"

namespace deepinfer::cpu {

void CpuBackend::rope(Tensor& x, const Tensor& positions, const Tensor& cos_sin, int rope_offset,
                      int rope_dim, bool interleave) {
  check_cpu(x, DType::F32, "rope x");
  check_cpu(positions, DType::I32, "rope positions");
  check_cpu(cos_sin, DType::F32, "rope cos_sin");
  DI_CHECK(x.ndim == 2 || x.ndim == 3, "rope: x must be [T, dim] or [T, heads, dim], got ",
           x.describe());
  DI_CHECK(x.stride[x.ndim - 1] == 1, "rope: x's last dimension must be contiguous, got ",
           x.describe());
  const int64_t T = x.shape[0];
  const int64_t heads = x.ndim == 3 ? x.shape[1] : 1;
  const int64_t head_stride = x.ndim == 3 ? x.stride[1] : 0;
  const int64_t dim = x.shape[x.ndim - 1];
  DI_CHECK(rope_dim > 0 && rope_dim % 2 == 0 && rope_offset >= 0 && rope_offset + rope_dim <= dim,
           "rope: rope_offset ", rope_offset, " + rope_dim ", rope_dim, " outside the last dim ",
           dim, " of ", x.describe());
  DI_CHECK(positions.numel() == T, "rope: positions ", positions.describe(), " must have ", T,
           " entries");
  DI_CHECK(cos_sin.ndim == 2 && cos_sin.size(1) == rope_dim && cos_sin.is_contiguous(),
           "rope: cos_sin must be F32 [max_positions, ", rope_dim, "], got ", cos_sin.describe());
  const int32_t* pos = positions.ptr<int32_t>();
  const int64_t max_positions = cos_sin.size(0);
  for (int64_t t = 0; t < T; ++t) {
    DI_CHECK(pos[t] >= 0 && pos[t] < max_positions, "rope: position ", pos[t], " of token ", t,
             " outside the table [0, ", max_positions, ")");
  }
  const int64_t half = rope_dim / 2;
  pool_->parallel_for(T, 8, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* cs = cos_sin.ptr<float>() + static_cast<int64_t>(pos[t]) * rope_dim;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x.ptr<float>() + t * x.stride[0] + h * head_stride + rope_offset;
        for (int64_t i = 0; i < half; ++i) {
          const float c = cs[i], s = cs[half + i];
          float& a = interleave ? v[2 * i] : v[i];
          float& bb = interleave ? v[2 * i + 1] : v[half + i];
          const float x0 = a, x1 = bb;
          a = x0 * c - x1 * s;
          bb = x1 * c + x0 * s;
        }
      }
    }
  });
}

}  // namespace deepinfer::cpu
