// fake_quant, store_packed_rows, gather_packed_rows: DeepSeek-V4.1's cache formats (FP8 window KV,
// FP4 indexer keys and queries, FP4 compressed KV): F32 rows rounded in place, or packed into and
// read back from byte rows of a paged cache (host reference; backend.h spells out the math).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/backend.h"
#include "core/dtype.h"

namespace deepinfer {

namespace {

// 2^ceil(log2(t)) for a normal t > 0 (exponent field plus one unless the mantissa is zero).
float pow2_ceil(float t) {
  uint32_t bits;
  std::memcpy(&bits, &t, sizeof bits);
  const int k = static_cast<int>((bits >> 23) & 0xff) - 127 + ((bits & 0x7fffff) != 0 ? 1 : 0);
  return std::ldexp(1.0f, k);
}

// The e2m1 code (sign in bit 3) of a value already clamped to [-6, 6], rounded to nearest even.
uint8_t e2m1_code(float q) {
  static const float kBoundary[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const float m = std::fabs(q);
  int code = 0;
  for (int i = 0; i < 7; ++i)
    code +=
        (i % 2 == 1 ? m >= kBoundary[i] : m > kBoundary[i]) ? 1 : 0;  // a tie goes to the even code
  return static_cast<uint8_t>(code | (std::signbit(q) ? 8 : 0));
}

}  // namespace

namespace {

int64_t block_of(Backend::FakeQuant kind) {
  return kind == Backend::FakeQuant::Fp4E4m3x16 ? 16 : 32;
}

// One block of `block` values: its scale (and the scale's byte: E8M0 2^(b - 127), or e4m3) and each
// value's code (an e4m3 byte, or an e2m1 nibble with the sign in bit 3).
float quantize_block(const float* v, int64_t block, Backend::FakeQuant kind, uint8_t* codes,
                     uint8_t* scale_byte) {
  float amax = 0.0f;
  for (int64_t i = 0; i < block; ++i) amax = std::fmax(amax, std::fabs(v[i]));
  float scale, qmax;
  switch (kind) {
    case Backend::FakeQuant::Fp8Ue8m0x32:
      scale = pow2_ceil(std::fmax(amax, 1e-4f) * (1.0f / 448.0f));
      qmax = 448.0f;
      break;
    case Backend::FakeQuant::Fp4Ue8m0x32:
      scale = pow2_ceil(std::fmax(amax, 6.0f * 0x1p-126f) * (1.0f / 6.0f));
      qmax = 6.0f;
      break;
    default:
      *scale_byte = float_to_fp8_e4m3(std::fmax(amax, 6.0f * 0x1p-9f) / 6.0f);
      scale = fp8_e4m3_to_float(*scale_byte);
      qmax = 6.0f;
      break;
  }
  if (kind != Backend::FakeQuant::Fp4E4m3x16)
    *scale_byte = static_cast<uint8_t>(std::ilogb(scale) + 127);
  for (int64_t i = 0; i < block; ++i) {
    const float q = std::fmin(std::fmax(v[i] / scale, -qmax), qmax);
    codes[i] = kind == Backend::FakeQuant::Fp8Ue8m0x32 ? float_to_fp8_e4m3(q) : e2m1_code(q);
  }
  return scale;
}

float decode(uint8_t code, Backend::FakeQuant kind) {
  return kind == Backend::FakeQuant::Fp8Ue8m0x32 ? fp8_e4m3_to_float(code)
                                                 : fp4_e2m1_to_float(code);
}

float scale_of(uint8_t b, Backend::FakeQuant kind) {
  return kind == Backend::FakeQuant::Fp4E4m3x16 ? fp8_e4m3_to_float(b) : e8m0_to_float(b);
}

void check_rows(const Tensor& x, Backend::FakeQuant kind, const char* op) {
  DI_CHECK(x.defined() && x.device == Device::CPU && x.dtype == DType::F32 && x.ndim == 2 &&
               x.stride[1] == 1,
           op, ": rows must be host F32 [R, C] (the CPU reference), got ", x.describe());
  DI_CHECK(x.size(1) % block_of(kind) == 0, op, ": ", x.size(1),
           " channels are not whole blocks of ", block_of(kind));
}

}  // namespace

int64_t packed_row_bytes(Backend::FakeQuant kind, int64_t channels) {
  const int64_t values = kind == Backend::FakeQuant::Fp8Ue8m0x32 ? channels : channels / 2;
  return values + channels / block_of(kind);
}

void Backend::fake_quant(Tensor& x, FakeQuant kind) {
  check_rows(x, kind, "fake_quant");
  const int64_t block = block_of(kind), R = x.size(0), C = x.size(1), ld = R > 1 ? x.stride[0] : C;
  uint8_t codes[32], scale_byte = 0;
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t b0 = 0; b0 < C; b0 += block) {
      float* v = x.ptr<float>() + r * ld + b0;
      const float scale = quantize_block(v, block, kind, codes, &scale_byte);
      for (int64_t i = 0; i < block; ++i) v[i] = decode(codes[i], kind) * scale;
    }
  }
}

void Backend::store_packed_rows(const Tensor& x, FakeQuant kind, const PagedKV& kv) {
  check_rows(x, kind, "store_packed_rows");
  const int64_t block = block_of(kind), R = x.size(0), C = x.size(1), ld = R > 1 ? x.stride[0] : C;
  const int64_t bytes = packed_row_bytes(kind, C), nb = C / block;
  const bool fp8 = kind == FakeQuant::Fp8Ue8m0x32;
  DI_CHECK(kv.cache.device == Device::CPU && kv.cache.dtype == DType::U8 && kv.cache.ndim == 3 &&
               kv.cache.is_contiguous() && kv.cache.size(2) == bytes,
           "store_packed_rows: cache must be host U8 [blocks, block_size, ", bytes, "], got ",
           kv.cache.describe());
  DI_CHECK(kv.slot_mapping.dtype == DType::I32 && kv.slot_mapping.numel() == R,
           "store_packed_rows: slot_mapping must be I32 [", R, "], got ",
           kv.slot_mapping.describe());
  const int64_t num_slots = kv.cache.size(0) * kv.cache.size(1);
  uint8_t codes[32];
  for (int64_t r = 0; r < R; ++r) {
    const int32_t slot = kv.slot_mapping.ptr<const int32_t>()[r];
    DI_CHECK(slot >= -1 && slot < num_slots, "store_packed_rows: slot ", slot, " of row ", r,
             " outside the cache's ", num_slots);
    if (slot < 0) continue;
    uint8_t* row = kv.cache.ptr<uint8_t>() + static_cast<int64_t>(slot) * bytes;
    uint8_t* scales = row + (fp8 ? C : C / 2);
    for (int64_t b = 0; b < nb; ++b) {
      quantize_block(x.ptr<const float>() + r * ld + b * block, block, kind, codes, &scales[b]);
      for (int64_t i = 0; i < block; ++i) {
        const int64_t c = b * block + i;
        if (fp8)
          row[c] = codes[i];
        else if (c % 2 == 0)
          row[c / 2] = codes[i];  // low nibble first
        else
          row[c / 2] = static_cast<uint8_t>(row[c / 2] | (codes[i] << 4));
      }
    }
  }
}

void Backend::gather_packed_rows(const Tensor& ids, const Tensor& cache, FakeQuant kind,
                                 Tensor& out) {
  check_rows(out, kind, "gather_packed_rows");
  const int64_t block = block_of(kind), N = out.size(0), C = out.size(1);
  const int64_t ld = N > 1 ? out.stride[0] : C, bytes = packed_row_bytes(kind, C);
  const bool fp8 = kind == FakeQuant::Fp8Ue8m0x32;
  DI_CHECK(cache.device == Device::CPU && cache.dtype == DType::U8 && cache.ndim == 2 &&
               cache.is_contiguous() && cache.size(1) == bytes,
           "gather_packed_rows: cache rows must be host U8 [rows, ", bytes, "], got ",
           cache.describe());
  DI_CHECK(ids.dtype == DType::I32 && ids.numel() == N, "gather_packed_rows: ids must be I32 [", N,
           "], got ", ids.describe());
  for (int64_t n = 0; n < N; ++n) {
    const int32_t id = ids.ptr<const int32_t>()[n];
    DI_CHECK(id >= 0 && id < cache.size(0), "gather_packed_rows: row ", id, " outside the cache's ",
             cache.size(0));
    const uint8_t* row = cache.ptr<const uint8_t>() + static_cast<int64_t>(id) * bytes;
    const uint8_t* scales = row + (fp8 ? C : C / 2);
    float* o = out.ptr<float>() + n * ld;
    for (int64_t c = 0; c < C; ++c) {
      const uint8_t code =
          fp8 ? row[c] : static_cast<uint8_t>(c % 2 == 0 ? row[c / 2] & 0xf : row[c / 2] >> 4);
      o[c] = decode(code, kind) * scale_of(scales[c / block], kind);
    }
  }
}

}  // namespace deepinfer
