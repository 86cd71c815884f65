// Default Backend::fill_random: element i = scale * random_uniform(seed, i) (backend/random.h),
// generated on the host in chunks and copied into t with the backend's own copy(), so it
// serves the CPU backend directly and any device backend that does not override it.
#include <algorithm>

#include "backend/backend.h"
#include "backend/random.h"

namespace deepinfer {

void Backend::fill_random(Tensor& t, uint64_t seed, float scale) {
  DI_CHECK(t.is_contiguous(), "fill_random: tensor must be contiguous, got ", t.describe());
  DI_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16 || t.dtype == DType::F8_E4M3,
           "fill_random: dtype must be F32, BF16 or F8_E4M3, got ", t.describe());
  const int64_t n = t.numel();
  const int64_t chunk = int64_t{1} << 20;
  HostBuffer host(t.dtype, {std::min(n, chunk)});
  const size_t elem = dtype_size(t.dtype);
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t count = std::min(chunk, n - begin);
    for (int64_t i = 0; i < count; ++i) {
      const float v = scale * random_uniform(seed, static_cast<uint64_t>(begin + i));
      switch (t.dtype) {
        case DType::F32: host.ptr<float>()[i] = v; break;
        case DType::BF16: host.ptr<uint16_t>()[i] = float_to_bf16(v); break;
        default: host.ptr<uint8_t>()[i] = float_to_fp8_e4m3(v); break;
      }
    }
    Tensor src(host.tensor().data, t.dtype, {count}, Device::CPU);
    Tensor dst(static_cast<char*>(t.data) + begin * static_cast<int64_t>(elem), t.dtype, {count},
               t.device);
    copy(src, dst);
  }
}

}  // namespace deepinfer
