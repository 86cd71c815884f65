#include "model/weight_check.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/thread_pool.h"

namespace deepinfer {
namespace {

// The exponent-all-ones mask of one element (sign bit excluded), 0 for dtypes without NaN/Inf.
uint32_t bad_mask(DType dtype) {
  switch (dtype) {
    case DType::F32: return 0x7F800000u;
    case DType::BF16: return 0x7F80u;
    case DType::F16: return 0x7C00u;
    case DType::F8_E4M3: return 0x7Fu;
    default: return 0;
  }
}

// mask repeated over the lanes of a 64-bit word (lane of `bytes` bytes).
uint64_t repeat(uint64_t lane, size_t bytes) {
  uint64_t w = 0;
  for (size_t b = 0; b < 8; b += bytes) w |= lane << (8 * b);
  return w;
}

uint32_t element_bits(const unsigned char* p, size_t bytes) {
  uint32_t v = 0;
  std::memcpy(&v, p, bytes);  // little-endian hosts (as safetensors)
  return v;
}

}  // namespace

int64_t find_non_finite(const void* data, DType dtype, int64_t n) {
  const uint32_t mask = bad_mask(dtype);
  if (mask == 0 || n <= 0) return -1;
  const size_t es = dtype_size(dtype);
  const auto* p = static_cast<const unsigned char*>(data);
  // A lane is bad when (lane & mask) == mask, i.e. y = ~lane & mask is 0. mask leaves the lane's
  // top bit clear, so y + (2^(w-1) - 1) never carries out of the lane and has its top bit set
  // exactly when y != 0: the word holds a bad lane iff some top bit stays clear.
  const uint64_t m = repeat(mask, es);
  const uint64_t low = repeat((uint64_t{1} << (8 * es - 1)) - 1, es);
  const uint64_t high = repeat(uint64_t{1} << (8 * es - 1), es);
  const int64_t per_word = static_cast<int64_t>(8 / es);
  const int64_t words = n / per_word;
  auto scalar = [&](int64_t begin, int64_t end) -> int64_t {
    for (int64_t i = begin; i < end; ++i)
      if ((element_bits(p + i * es, es) & mask) == mask) return i;
    return -1;
  };
  constexpr int64_t kBlock = 64;  // words tested per branch
  for (int64_t w0 = 0; w0 < words; w0 += kBlock) {
    const int64_t w1 = std::min(words, w0 + kBlock);
    uint64_t clear = 0;  // a top bit clear in some word of the block
    for (int64_t w = w0; w < w1; ++w) {
      uint64_t x;
      std::memcpy(&x, p + w * 8, 8);
      clear |= ~((~x & m) + low) & high;
    }
    if (clear != 0) return scalar(w0 * per_word, w1 * per_word);
  }
  return scalar(words * per_word, n);
}

void check_weights_finite(const std::vector<NamedTensor>& tensors, ThreadPool& pool) {
  // Chunks of at most kChunk bytes (element-aligned) over every tensor, in list order.
  constexpr int64_t kChunk = int64_t{4} << 20;
  struct Chunk {
    size_t tensor;
    int64_t begin, end;  // elements
  };
  std::vector<Chunk> chunks;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const Tensor& x = tensors[t].tensor;
    if (bad_mask(x.dtype) == 0 || x.numel() == 0) continue;
    DI_CHECK(x.is_contiguous() && x.device == Device::CPU, "weight check: tensor '", tensors[t].name,
             "' is not a contiguous host view: ", x.describe());
    const int64_t per = kChunk / static_cast<int64_t>(dtype_size(x.dtype));
    for (int64_t b = 0; b < x.numel(); b += per) chunks.push_back({t, b, std::min(x.numel(), b + per)});
  }
  // first[i] = the bad element of chunk i (-1 none); chunks after a known bad one are skipped.
  std::vector<int64_t> first(chunks.size(), -1);
  std::atomic<int64_t> first_bad_chunk{std::numeric_limits<int64_t>::max()};
  pool.parallel_for(static_cast<int64_t>(chunks.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (i > first_bad_chunk.load(std::memory_order_relaxed)) return;
      const Chunk& c = chunks[static_cast<size_t>(i)];
      const Tensor& x = tensors[c.tensor].tensor;
      const size_t es = dtype_size(x.dtype);
      const int64_t at = find_non_finite(static_cast<const char*>(x.data) + c.begin * static_cast<int64_t>(es),
                                         x.dtype, c.end - c.begin);
      if (at < 0) continue;
      first[static_cast<size_t>(i)] = c.begin + at;
      int64_t cur = first_bad_chunk.load();
      while (i < cur && !first_bad_chunk.compare_exchange_weak(cur, i)) {
      }
    }
  });
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (first[i] < 0) continue;
    const NamedTensor& nt = tensors[chunks[i].tensor];
    const size_t es = dtype_size(nt.tensor.dtype);
    const uint32_t bits =
        element_bits(static_cast<const unsigned char*>(nt.tensor.data) + first[i] * static_cast<int64_t>(es), es);
    // Mantissa zero: Inf (e4m3fn has none: both of its codes are NaN).
    const uint32_t mantissa = nt.tensor.dtype == DType::F32 ? 0x7FFFFFu
                              : nt.tensor.dtype == DType::BF16 ? 0x7Fu
                              : nt.tensor.dtype == DType::F16 ? 0x3FFu : 0u;
    const bool inf = mantissa != 0 && (bits & mantissa) == 0;
    char hex[16];
    std::snprintf(hex, sizeof(hex), "0x%0*X", static_cast<int>(2 * es), bits);
    fail("tensor '", nt.name, "' in ", nt.source, " (", nt.tensor.describe(), ") holds ",
         inf ? "Inf" : "NaN", " at element ", first[i], " (bits ", hex,
         "): the checkpoint is corrupt (or pass --skip-weight-check / "
         "EngineConfig::skip_weight_check to load it anyway)");
  }
}

}  // namespace deepinfer
