// Parity of the absorbed MLA chain as model/layers/mla.cpp runs it for a step with cached
// context: mla_rope_store (rope, cache store, q_abs rope part) -> gemm_heads (q_nope · W_UK
// into the strided q_abs) -> mla_attention_paged -> gemm_heads (latent · W_UV^T), CUDA against
// the CPU composition. Two steps through one paged cache with scattered, non-contiguous
// blocks: step 1 writes each sequence's first chunk, step 2 adds query_len > 1 tokens over
// that context next to a fresh sequence (odd lengths, block sizes that do not divide them).
#include <numeric>

#include "tests/ops/parity.h"

namespace deepinfer::ops_test {
namespace {

// The chain's normalised error: bf16 q_abs and latent on CUDA feed two more ops.
constexpr double kTolChain = 3e-2;

// [T, heads, dim] view of a [T, heads * stride] buffer, starting at column `offset` of each head.
Tensor heads_of(Tensor t, int64_t T, int64_t heads, int64_t stride, int64_t dim, int64_t offset = 0) {
  t.data = static_cast<char*>(t.data) + offset * static_cast<int64_t>(dtype_size(t.dtype));
  t.ndim = 3;
  t.shape = {T, heads, dim, 0, 0};
  t.stride = {heads * stride, stride, 1, 0, 0};
  return t;
}

struct ChainCase {
  int64_t heads, nope, rope, L, v;
  int64_t block_size;
  std::vector<int32_t> first, second;  // tokens per sequence in step 1 and step 2 (0: absent)
};

class MlaAbsorbed : public Parity {
 protected:
  // One backend's run of both steps; returns step 2's attn [T2, heads, v] and the cache.
  struct Run {
    std::vector<float> attn, cache;
  };
  Run run(Backend& b, bool gpu, const ChainCase& c, const std::vector<float>& uk_t,
          const std::vector<float>& uv, const std::vector<float>& cos_sin, int max_pos,
          const std::vector<std::vector<float>>& q, const std::vector<std::vector<float>>& kv,
          const std::vector<int32_t>& tables, int64_t max_blocks, int64_t num_blocks) {
    const int64_t H = c.heads, qk = c.nope + c.rope, row = c.L + c.rope;
    const DType act = gpu ? DType::BF16 : DType::F32;
    auto floats = [&](const std::vector<float>& v, std::vector<int64_t> dims, DType dt) {
      return gpu ? gpu_float(b, v, dims, dt) : cpu_f32(v, dims);
    };
    auto ints = [&](const std::vector<int32_t>& v, std::vector<int64_t> dims) {
      Tensor h = cpu_i32(v, dims);
      return gpu ? gpu_copy(b, h) : h;
    };
    Tensor cache = floats(std::vector<float>(num_blocks * c.block_size * row, 0.0f),
                          {num_blocks, c.block_size, row}, act);
    Tensor w_uk = floats(uk_t, {H, c.L, c.nope}, act);  // [heads, kv_lora, nope]
    Tensor w_uv = floats(uv, {H, c.v, c.L}, act);       // [heads, v, kv_lora]
    Tensor cs = floats(cos_sin, {max_pos, c.rope}, DType::F32);
    const int S = static_cast<int>(c.first.size());
    std::vector<int32_t> done(S, 0);
    Run out;
    for (int step = 0; step < 2; ++step) {
      const std::vector<int32_t>& lens = step == 0 ? c.first : c.second;
      std::vector<int32_t> qs = {0}, seq_lens, slots, positions, table_rows;
      std::vector<int> seqs;
      int max_q = 0, max_len = 0;
      for (int s = 0; s < S; ++s) {
        if (lens[s] == 0) continue;
        seqs.push_back(s);
        for (int32_t i = 0; i < lens[s]; ++i) {
          const int32_t p = done[s] + i;
          positions.push_back(p);
          slots.push_back(tables[s * max_blocks + p / c.block_size] * static_cast<int32_t>(c.block_size) +
                          p % static_cast<int32_t>(c.block_size));
        }
        done[s] += lens[s];
        qs.push_back(qs.back() + lens[s]);
        seq_lens.push_back(done[s]);
        table_rows.insert(table_rows.end(), tables.begin() + s * max_blocks, tables.begin() + (s + 1) * max_blocks);
        max_q = std::max(max_q, lens[s]);
        max_len = std::max(max_len, done[s]);
      }
      const int64_t T = qs.back(), ns = static_cast<int64_t>(seqs.size());
      PagedKV kvp;
      kvp.cache = cache;
      kvp.block_tables = ints(table_rows, {ns, max_blocks});
      kvp.seq_lens = ints(seq_lens, {ns});
      kvp.query_start = ints(qs, {ns + 1});
      kvp.slot_mapping = ints(slots, {T});
      kvp.num_seqs = static_cast<int>(ns);
      kvp.max_query_len = max_q;
      kvp.max_seq_len = max_len;
      Tensor qt = floats(q[step], {T, H * qk}, act);
      Tensor kvt = floats(kv[step], {T, row}, act);
      Tensor q_abs = floats(std::vector<float>(T * H * row, 0.0f), {T, H * row}, act);
      Tensor latent = floats(std::vector<float>(T * H * c.L, 0.0f), {T, H * c.L}, act);
      Tensor attn = gpu ? gpu_poisoned(b, act, {T, H * c.v}) : cpu_f32(std::vector<float>(T * H * c.v), {T, H * c.v});
      Tensor q3 = heads_of(qt, T, H, qk, qk);
      Tensor q_abs_rope = heads_of(q_abs, T, H, row, c.rope, c.L);
      b.mla_rope_store(q3, kvt, ints(positions, {T}), cs, static_cast<int>(c.nope), static_cast<int>(c.L),
                       static_cast<int>(c.rope), true, kvp, q_abs_rope);
      Tensor q_abs_nope = heads_of(q_abs, T, H, row, c.L);
      b.gemm_heads(heads_of(qt, T, H, qk, c.nope), w_uk, q_abs_nope);
      Tensor latent3 = heads_of(latent, T, H, c.L, c.L);
      b.mla_attention_paged(heads_of(q_abs, T, H, row, row), kvp, 1.0f / std::sqrt(float(qk)),
                            static_cast<int>(c.L), latent3);
      Tensor attn3 = heads_of(attn, T, H, c.v, c.v);
      b.gemm_heads(latent3, w_uv, attn3);
      if (step == 1) out.attn = gpu ? download(b, attn) : values(attn);
    }
    out.cache = gpu ? download(b, cache) : values(cache);
    return out;
  }
};

TEST_F(MlaAbsorbed, ChunkOverCachedContext) {
  const std::vector<ChainCase> cases = {
      // v3_tiny / v2_lite_tiny attention (nope 32: gemm_heads' per-head path), chunks 5 + 7
      // as the golden test runs them, next to a fresh 3-token sequence.
      {4, 32, 16, 64, 32, 16, {5, 0}, {7, 3}},
      // Odd lengths, a block size that divides nothing, a long context over several blocks.
      {3, 64, 8, 40, 24, 5, {37, 1, 0}, {1, 9, 4}},
      // V3 attention shapes (gemm_heads in one launch), query_len 70 over 130 cached.
      {16, 128, 64, 512, 128, 64, {130, 2}, {70, 1}},
  };
  for (const ChainCase& c : cases) {
    const int64_t H = c.heads, qk = c.nope + c.rope, row = c.L + c.rope;
    const int S = static_cast<int>(c.first.size());
    int64_t max_blocks = 1;
    int max_pos = 1;
    for (int s = 0; s < S; ++s) {
      const int64_t len = c.first[s] + c.second[s];
      max_blocks = std::max<int64_t>(max_blocks, (len + c.block_size - 1) / c.block_size);
      max_pos = std::max<int>(max_pos, static_cast<int>(len));
    }
    // Scattered blocks: a shuffled pool with spare blocks, so tables are never contiguous.
    const int64_t num_blocks = S * max_blocks + 5;
    std::vector<int32_t> pool(static_cast<size_t>(num_blocks));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng_);
    std::vector<int32_t> tables(pool.begin(), pool.begin() + S * max_blocks);
    std::vector<float> uk_t = randn(H * c.L * c.nope, 1.0f / std::sqrt(float(c.nope)));
    std::vector<float> uv = randn(H * c.v * c.L, 1.0f / std::sqrt(float(c.L)));
    std::vector<float> cos_sin(static_cast<size_t>(max_pos * c.rope));
    for (int p = 0; p < max_pos; ++p)
      for (int64_t i = 0; i < c.rope / 2; ++i) {
        const double angle = p * std::pow(10000.0, -2.0 * i / c.rope);
        cos_sin[p * c.rope + i] = static_cast<float>(std::cos(angle));
        cos_sin[p * c.rope + c.rope / 2 + i] = static_cast<float>(std::sin(angle));
      }
    std::vector<std::vector<float>> q, kv;
    for (const auto* lens : {&c.first, &c.second}) {
      int64_t T = 0;
      for (int32_t n : *lens) T += n;
      q.push_back(randn(T * H * qk));
      kv.push_back(randn(T * row));
    }
    const Run want = run(*cpu_, false, c, uk_t, uv, cos_sin, max_pos, q, kv, tables, max_blocks, num_blocks);
    const std::string what = "absorbed MLA heads " + std::to_string(H) + " kv_lora " + std::to_string(c.L) +
                             " block " + std::to_string(c.block_size);
    for (Backend* gpu : {gpu_.get(), gpu_inv_.get()}) {
      const Run got = run(*gpu, true, c, uk_t, uv, cos_sin, max_pos, q, kv, tables, max_blocks, num_blocks);
      const std::string tag = what + (gpu->batch_invariant() ? " (batch-invariant)" : "");
      expect_close(got.attn, want.attn, kTolChain, tag + ": step 2 attention output");
      expect_close(got.cache, want.cache, kTolBF16, tag + ": cache after both steps");
    }
  }
}

}  // namespace
}  // namespace deepinfer::ops_test
