// Speculative verification needs every op to give a position the same bits whether it is
// computed alone (a decode step of 1 token) or inside a verify run of 1 + k tokens: paged
// MLA attention over the cache, GEMM rows, RMS norm rows (the engine-level check is
// tests/unit/spec/test_spec_engine.cpp).
#include <gtest/gtest.h>

#include <cstring>

#include "op_test_util.h"

namespace deepinfer {
namespace {

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, sizeof(float) * n) == 0; }

TEST(CpuVerifyInvariance, PagedAttentionRowAloneEqualsRowInsideRun) {
  auto backend = make_cpu_backend();
  const int64_t block_size = 4, num_blocks = 8, row_dim = 24, v_dim = 16, H = 3;
  const int k = 4, cached = 9;  // rows at positions 9..13 over a context of 14
  HostBuffer cache = test::random_f32({num_blocks, block_size, row_dim}, 11);
  HostBuffer q = test::random_f32({k + 1, H, row_dim}, 12);
  HostBuffer tb = test::i32_buffer({6, 1, 7, 3});
  auto run = [&](int first, int count, HostBuffer& out) {
    HostBuffer qs = test::i32_buffer({0, count}), lens = test::i32_buffer({cached + first + count});
    PagedKV kv;
    kv.cache = cache.tensor();
    HostBuffer tables(DType::I32, {1, 4});
    std::memcpy(tables.ptr<int32_t>(), tb.ptr<int32_t>(), 4 * sizeof(int32_t));
    kv.block_tables = tables.tensor();
    kv.seq_lens = lens.tensor();
    kv.query_start = qs.tensor();
    kv.num_seqs = 1;
    kv.max_query_len = count;
    kv.max_seq_len = cached + first + count;
    Tensor qv(q.ptr<float>() + first * H * row_dim, DType::F32, {count, H, row_dim});
    backend->mla_attention_paged(qv, kv, 0.2f, static_cast<int>(v_dim), out.tensor());
  };
  HostBuffer all = test::f32_buffer({k + 1, H, v_dim}, NAN);
  run(0, k + 1, all);
  for (int j = 0; j <= k; ++j) {
    HostBuffer one = test::f32_buffer({1, H, v_dim}, NAN);
    run(j, 1, one);
    EXPECT_TRUE(same_bits(one.ptr<float>(), all.ptr<float>() + j * H * v_dim, H * v_dim)) << "row " << j;
  }
}

TEST(CpuVerifyInvariance, GemmAndNormRowAloneEqualsRowInsideRun) {
  auto backend = make_cpu_backend();
  const int64_t M = 6, K = 200, N = 70;
  HostBuffer x = test::random_f32({M, K}, 21), w = test::random_f32({N, K}, 22), g = test::random_f32({K}, 23);
  Weight wt;
  wt.w = w.tensor();
  HostBuffer all = test::f32_buffer({M, N}), all_n = test::f32_buffer({M, K});
  Tensor all_t = all.tensor(), all_nt = all_n.tensor();
  backend->gemm(x.tensor(), wt, all_t);
  backend->rms_norm(x.tensor(), g.tensor(), 1e-6f, all_nt);
  for (int64_t r = 0; r < M; ++r) {
    Tensor xr(x.ptr<float>() + r * K, DType::F32, {1, K});
    HostBuffer one = test::f32_buffer({1, N}), one_n = test::f32_buffer({1, K});
    Tensor one_t = one.tensor(), one_nt = one_n.tensor();
    backend->gemm(xr, wt, one_t);
    backend->rms_norm(xr, g.tensor(), 1e-6f, one_nt);
    EXPECT_TRUE(same_bits(one.ptr<float>(), all.ptr<float>() + r * N, N)) << "gemm row " << r;
    EXPECT_TRUE(same_bits(one_n.ptr<float>(), all_n.ptr<float>() + r * K, K)) << "norm row " << r;
  }
}

}  // namespace
}  // namespace deepinfer
