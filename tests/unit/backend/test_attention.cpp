// MLA attention (paged absorbed form and direct prefill form) vs a double-precision
// softmax(q·k * scale) · v over several sequences of different lengths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "backend/cpu/cpu_backend.h"
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

// Chunks after cached positions: k/v hold each sequence's whole context (rows c_s + p), query i
// of sequence s sits at position seq_len - q_len + i.
TEST(CpuAttention, PrefillContextAttendsCachedPositions) {
  auto backend = make_cpu_backend();
  const std::vector<int32_t> qs = {0, 3, 4, 9}, lens = {9, 1, 12};  // 6, 0 and 7 cached positions
  const int64_t T = 9, N = 22, H = 2;
  for (int64_t DK : {24, 20}) {  // the 8-wide dot path and the scalar one
    const int64_t DV = 12;
    HostBuffer q = test::random_f32({T, H, DK}, 5), k = test::random_f32({N, H, DK}, 6);
    HostBuffer v = test::random_f32({N, H, DV}, 7);
    HostBuffer qsb = test::i32_buffer(qs), lb = test::i32_buffer(lens), tb = test::i32_buffer({0, 0, 0});
    HostBuffer out = test::f32_buffer({T, H, DV}, NAN);
    HostBuffer cache = test::f32_buffer({1, 4, 8});
    const PagedKV kv = test::paged_kv(cache.tensor(), tb.tensor().view({3, 1}), lb.tensor(), qsb.tensor(), 3, 5, 12);
    const double scale = 0.25;
    backend->mla_attention_prefill_context(q.tensor(), k.tensor(), v.tensor(), kv, float(scale), out.tensor());
    int64_t first = 0;
    for (int s = 0; s < 3; ++s) {
      for (int32_t t = qs[s]; t < qs[s + 1]; ++t) {
        const int64_t pos = lens[s] - (qs[s + 1] - qs[s]) + (t - qs[s]);
        for (int64_t h = 0; h < H; ++h) {
          std::vector<const float*> keys, values;
          for (int64_t j = 0; j <= pos; ++j) {
            keys.push_back(k.ptr<float>() + ((first + j) * H + h) * DK);
            values.push_back(v.ptr<float>() + ((first + j) * H + h) * DV);
          }
          auto ref = naive_attention(q.ptr<float>() + (t * H + h) * DK, keys, values, DK, DV, scale);
          EXPECT_LE(test::max_abs_diff(out.ptr<float>() + (t * H + h) * DV, ref.data(), DV), 1e-5)
              << "DK " << DK << " t=" << t << " h=" << h;
        }
      }
      first += lens[s];
    }
    // k/v rows other than the contexts' sum, or a context shorter than its new tokens.
    HostBuffer k_short = test::random_f32({N - 1, H, DK}, 8), v_short = test::random_f32({N - 1, H, DV}, 9);
    EXPECT_THROW(backend->mla_attention_prefill_context(q.tensor(), k_short.tensor(), v_short.tensor(), kv, 0.25f,
                                                        out.tensor()),
                 Error);
    HostBuffer bad_lens = test::i32_buffer({2, 1, 19});
    PagedKV bad = kv;
    bad.seq_lens = bad_lens.tensor();
    EXPECT_THROW(backend->mla_attention_prefill_context(q.tensor(), k.tensor(), v.tensor(), bad, 0.25f, out.tensor()),
                 Error);
  }
}

// kv_gather: every position of every sequence, from scattered blocks, in context order.
TEST(CpuAttention, KvGatherLaysOutEachSequencesContext) {
  auto backend = make_cpu_backend();
  const int64_t block_size = 4, num_blocks = 8, row_dim = 6;
  const std::vector<int32_t> qs = {0, 2, 3}, lens = {7, 1};
  HostBuffer cache = test::random_f32({num_blocks, block_size, row_dim}, 10);
  HostBuffer tb = test::i32_buffer({5, 2, 7, 0}), lb = test::i32_buffer(lens), qsb = test::i32_buffer(qs);
  const PagedKV kv = test::paged_kv(cache.tensor(), tb.tensor().view({2, 2}), lb.tensor(), qsb.tensor(), 2, 2, 7);
  HostBuffer rows = test::f32_buffer({8, row_dim}, NAN);
  backend->kv_gather(kv, rows.tensor());
  const std::vector<std::pair<int, int>> want = {{5, 0}, {5, 1}, {5, 2}, {5, 3}, {2, 0}, {2, 1}, {2, 2}, {7, 0}};
  for (size_t r = 0; r < want.size(); ++r) {
    const float* src = cache.ptr<float>() + (want[r].first * block_size + want[r].second) * row_dim;
    for (int64_t c = 0; c < row_dim; ++c) EXPECT_EQ(rows.ptr<float>()[r * row_dim + c], src[c]) << "row " << r;
  }
  HostBuffer wrong = test::f32_buffer({7, row_dim});
  EXPECT_THROW(backend->kv_gather(kv, wrong.tensor()), Error);
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

// The AVX-512 forms of attention's helpers (where the CPU has them) against the 8-lane forms,
// bit for bit: scores of three queries against four keys (n = 160, the tiny model's row, and
// n = 8), and four value rows summed into 128 and 133 outputs (the masked tail). Values with
// mixed signs and magnitudes, so a fused and an unfused step, or another lane order, differ.
TEST(CpuAttention, Avx512HelpersMatchTheEightLaneForms) {
  if (!cpu::cpu_has_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  HostBuffer src = test::random_f32({8, 160}, 91, 3.0f);
  const float* r[8];
  for (int i = 0; i < 8; ++i) r[i] = src.ptr<float>() + i * 160;
  for (int64_t n : {int64_t{160}, int64_t{8}}) {
    float want[3][4], got[3][4];
    float* pw[3] = {want[0], want[1], want[2]};
    float* pg[3] = {got[0], got[1], got[2]};
    cpu::dot8x4x3_rows(r, r + 3, n, pw);
    cpu::dot8x4x3_rows_avx512(r, r + 3, n, pg);
    EXPECT_EQ(std::memcmp(want, got, sizeof(want)), 0) << "n = " << n;
  }
  // Six queries pair-interleaved against four keys: dot8x4_rows' bits per query.
  for (int64_t n : {int64_t{160}, int64_t{8}}) {
    HostBuffer qs = test::random_f32({6, n}, 93, 2.0f);
    std::vector<float> qp(6 * n);
    for (int p = 0; p < 3; ++p)
      for (int64_t c = 0; c < n; c += 8)
        for (int l = 0; l < 8; ++l) {
          qp[p * 2 * n + 2 * c + l] = qs.ptr<float>()[(2 * p) * n + c + l];
          qp[p * 2 * n + 2 * c + 8 + l] = qs.ptr<float>()[(2 * p + 1) * n + c + l];
        }
    float want[6][4], got[6][4];
    float* pg[6];
    for (int q = 0; q < 6; ++q) {
      pg[q] = got[q];
      cpu::dot8x4_rows(qs.ptr<float>() + q * n, r[0], r[1], r[2], r[3], n, want[q]);
    }
    cpu::dot8x4_qpairs_avx512(qp.data(), r, n, pg);
    EXPECT_EQ(std::memcmp(want, got, sizeof(want)), 0) << "n = " << n;
  }
  const float alpha[4] = {0.37f, -1.91f, 0.0041f, 12.5f};
  for (int64_t n : {int64_t{128}, int64_t{133}}) {
    std::vector<float> want(r[7], r[7] + n), got(want);
    cpu::axpy4(alpha, r[0], r[1], r[2], r[3], want.data(), n);
    cpu::axpy4_avx512(alpha, r[0], r[1], r[2], r[3], got.data(), n);
    EXPECT_EQ(std::memcmp(want.data(), got.data(), n * 4), 0) << "n = " << n;
  }
  // Up to three y rows sharing the x rows (prefill's queries of a group): one axpy4 per row.
  const float alphas[3][4] = {{0.37f, -1.91f, 0.0041f, 12.5f}, {-0.5f, 3.25f, 1e-3f, -7.0f},
                              {2.0f, 0.125f, -0.75f, 0.3f}};
  const float* al[3] = {alphas[0], alphas[1], alphas[2]};
  for (int rows = 1; rows <= 3; ++rows) {
    for (int64_t n : {int64_t{128}, int64_t{133}}) {
      std::vector<float> want(3 * n), got(3 * n);
      for (int y = 0; y < 3; ++y) {
        std::copy(r[4 + y], r[4 + y] + n, want.begin() + y * n);
        std::copy(r[4 + y], r[4 + y] + n, got.begin() + y * n);
      }
      float* ys[3] = {got.data(), got.data() + n, got.data() + 2 * n};
      for (int y = 0; y < rows; ++y) cpu::axpy4(al[y], r[0], r[1], r[2], r[3], want.data() + y * n, n);
      cpu::axpy4_rows_avx512(al, rows, r[0], r[1], r[2], r[3], ys, n);
      EXPECT_EQ(std::memcmp(want.data(), got.data(), 3 * n * 4), 0) << "rows " << rows << " n " << n;
    }
  }
}

}  // namespace
}  // namespace deepinfer
