// MLA attention (paged absorbed form and direct prefill form) vs a double-precision
// softmax(q·k * scale) · v over several sequences of different lengths.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "op_test_util.h"

namespace deepinfer {
namespace {

using test::naive_attention;

TEST(CpuAttention, PrefillSeveralSequences) {
  auto backend = make_cpu_backend();
  const std::vector<int32_t> qs = {0, 3, 4, 10};  // lengths 3, 1, 6
  const int64_t T = 10, H = 3, DK = 20, DV = 12;
  HostBuffer q = test::random_f32({T, H, DK}, 1), k = test::random_f32({T, H, DK}, 2);
  HostBuffer v = test::random_f32({T, H, DV}, 3);
  HostBuffer qsb = test::i32_buffer(qs);
  HostBuffer out = test::f32_buffer({T, H, DV}, NAN);
  const double scale = 0.3;
  backend->mla_attention_prefill(q.tensor(), k.tensor(), v.tensor(), qsb.tensor(), 3, float(scale),
                                 out.tensor());
  for (int s = 0; s < 3; ++s) {
    for (int32_t t = qs[s]; t < qs[s + 1]; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        std::vector<const float*> keys, values;
        for (int32_t j = qs[s]; j <= t; ++j) {
          keys.push_back(k.ptr<float>() + (j * H + h) * DK);
          values.push_back(v.ptr<float>() + (j * H + h) * DV);
        }
        auto ref = naive_attention(q.ptr<float>() + (t * H + h) * DK, keys, values, DK, DV, scale);
        EXPECT_LE(test::max_abs_diff(out.ptr<float>() + (t * H + h) * DV, ref.data(), DV), 1e-5)
            << "t=" << t << " h=" << h;
      }
    }
  }
  HostBuffer bad_qs = test::i32_buffer({0, 3, 4, 9});
  EXPECT_THROW(backend->mla_attention_prefill(q.tensor(), k.tensor(), v.tensor(), bad_qs.tensor(),
                                              3, 0.3f, out.tensor()),
               Error);
}

void check_paged(DType cache_dtype) {
  auto backend = make_cpu_backend();
  const int64_t block_size = 4, num_blocks = 16, row_dim = 20, v_dim = 12, H = 5;
  // Three sequences: 3 new tokens after 6 cached (a chunk), 1 token with no context, a decode
  // token after 13 cached. Blocks scattered through the cache.
  const std::vector<int32_t> qs = {0, 3, 4, 5};
  const std::vector<int32_t> lens = {9, 1, 14};
  const int64_t max_blocks = 4;
  const std::vector<int32_t> tables = {11, 2, 7, 0,   //
                                       5, 0, 0, 0,    //
                                       14, 3, 9, 12};
  const int64_t T = 5;
  HostBuffer cache_f32 = test::random_f32({num_blocks, block_size, row_dim}, 4);
  HostBuffer cache(cache_dtype, {num_blocks, block_size, row_dim});
  std::vector<float> cache_real(num_blocks * block_size * row_dim);  // values the op should see
  for (size_t i = 0; i < cache_real.size(); ++i) {
    const float f = cache_f32.ptr<float>()[i];
    if (cache_dtype == DType::F32) {
      cache.ptr<float>()[i] = cache_real[i] = f;
    } else {
      cache.ptr<uint16_t>()[i] = float_to_bf16(f);
      cache_real[i] = bf16_to_float(cache.ptr<uint16_t>()[i]);
    }
  }
  HostBuffer q = test::random_f32({T, H, row_dim}, 5);
  HostBuffer qsb = test::i32_buffer(qs), lb = test::i32_buffer(lens);
  HostBuffer tb(DType::I32, {3, max_blocks});
  std::copy(tables.begin(), tables.end(), tb.ptr<int32_t>());
  PagedKV kv = test::paged_kv(cache.tensor(), tb.tensor(), lb.tensor(), qsb.tensor(), 3, 3, 14);
  HostBuffer out = test::f32_buffer({T, H, v_dim}, NAN);
  const double scale = 0.25;
  backend->mla_attention_paged(q.tensor(), kv, float(scale), int(v_dim), out.tensor());
  for (int s = 0; s < 3; ++s) {
    const int32_t q_len = qs[s + 1] - qs[s];
    for (int32_t t = qs[s]; t < qs[s + 1]; ++t) {
      const int32_t pos = lens[s] - q_len + (t - qs[s]);
      std::vector<const float*> rows;
      for (int32_t j = 0; j <= pos; ++j) {
        const int64_t slot = tables[s * max_blocks + j / block_size] * block_size + j % block_size;
        rows.push_back(cache_real.data() + slot * row_dim);
      }
      for (int64_t h = 0; h < H; ++h) {
        auto ref = naive_attention(q.ptr<float>() + (t * H + h) * row_dim, rows, rows, row_dim,
                                   v_dim, scale);
        EXPECT_LE(test::max_abs_diff(out.ptr<float>() + (t * H + h) * v_dim, ref.data(), v_dim),
                  1e-5)
            << "t=" << t << " h=" << h;
      }
    }
  }
  // A block id outside the cache is an Error, not a crash.
  tb.ptr<int32_t>()[1] = 99;
  EXPECT_THROW(backend->mla_attention_paged(q.tensor(), kv, 0.25f, int(v_dim), out.tensor()), Error);
}

TEST(CpuAttention, PagedNonContiguousBlocksF32) { check_paged(DType::F32); }
TEST(CpuAttention, PagedNonContiguousBlocksBf16) { check_paged(DType::BF16); }

TEST(CpuKvStore, WritesSlotsAndSkipsMinusOne) {
  auto backend = make_cpu_backend();
  HostBuffer cache = test::f32_buffer({3, 2, 5}, -1.0f);
  HostBuffer rows = test::random_f32({3, 5}, 6);
  HostBuffer slots = test::i32_buffer({4, -1, 1});
  PagedKV kv;
  kv.cache = cache.tensor();
  kv.slot_mapping = slots.tensor();
  backend->kv_store(rows.tensor(), kv);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(cache.ptr<float>()[4 * 5 + i], rows.ptr<float>()[i]);
    EXPECT_EQ(cache.ptr<float>()[1 * 5 + i], rows.ptr<float>()[2 * 5 + i]);
  }
  int untouched = 0;
  for (int i = 0; i < 30; ++i) untouched += cache.ptr<float>()[i] == -1.0f;
  EXPECT_EQ(untouched, 20);
  HostBuffer bad = test::i32_buffer({6, -1, 1});
  kv.slot_mapping = bad.tensor();
  EXPECT_THROW(backend->kv_store(rows.tensor(), kv), Error);
}

}  // namespace
}  // namespace deepinfer
