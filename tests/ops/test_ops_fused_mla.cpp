// Parity of the fused MLA ops: rms_norm_pair and mla_rope_store, CUDA against the CPU
// composition (backend/cpu/fused_mla.cpp) and against CUDA's own unfused ops bit for bit.
#include "tests/ops/parity.h"

namespace deepinfer::ops_test {
namespace {

class FusedMla : public Parity {
 protected:
  static void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    int64_t diff = 0, first = -1;
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
        if (first < 0) first = static_cast<int64_t>(i);
        ++diff;
      }
    }
    EXPECT_EQ(diff, 0) << what << ": " << diff << " elements differ, first at " << first << " ("
                       << (first >= 0 ? a[first] : 0.0f) << " vs " << (first >= 0 ? b[first] : 0.0f) << ")";
  }
  // [rows, cols] view of the first `cols` columns of a [rows, width] tensor.
  static Tensor cols_of(Tensor t, int64_t cols) {
    t.shape[1] = cols;
    return t;
  }
};

TEST_F(FusedMla, RmsNormPair) {
  // q_a [T, 1536] (256 threads per row in CUDA) and c_kv = the first 512 of [T, 576] rows
  // (128 threads), in place as MLA runs them; also odd sizes and F32 outputs.
  struct Case {
    int64_t T, H1, W2, H2;
    DType out;
  };
  for (const Case& c : {Case{1, 1536, 576, 512, DType::BF16}, Case{8, 1536, 576, 512, DType::BF16},
                        Case{5, 100, 72, 64, DType::F32}, Case{3, 2048, 2048, 1024, DType::BF16}}) {
    const std::string what = "rms_norm_pair T " + std::to_string(c.T) + " H " + std::to_string(c.H1) +
                             " / " + std::to_string(c.H2);
    std::vector<float> x1 = randn(c.T * c.H1), w1 = randn(c.H1), x2 = randn(c.T * c.W2), w2 = randn(c.H2);
    Tensor x1c = cpu_f32(x1, {c.T, c.H1}), x2c = cols_of(cpu_f32(x2, {c.T, c.W2}), c.H2);
    Tensor o1c = cpu_f32(std::vector<float>(c.T * c.H1), {c.T, c.H1});
    Tensor o2c = cpu_f32(std::vector<float>(c.T * c.H2), {c.T, c.H2});
    cpu_->rms_norm_pair(x1c, cpu_f32(w1, {c.H1}), o1c, x2c, cpu_f32(w2, {c.H2}), o2c, 1e-6f);
    // GPU fused, in place (x1 -> x1, x2 view -> x2 view), then unfused on fresh copies.
    std::vector<float> fused1, fused2;
    for (bool fused : {true, false}) {
      Tensor x1g = gpu_float(*gpu_, x1, {c.T, c.H1}, c.out);
      Tensor x2full = gpu_float(*gpu_, x2, {c.T, c.W2}, c.out);
      Tensor x2g = cols_of(x2full, c.H2);
      Tensor w1g = gpu_float(*gpu_, w1, {c.H1}, DType::BF16), w2g = gpu_float(*gpu_, w2, {c.H2}, DType::BF16);
      if (fused) {
        gpu_->rms_norm_pair(x1g, w1g, x1g, x2g, w2g, x2g, 1e-6f);
      } else {
        gpu_->rms_norm(x1g, w1g, 1e-6f, x1g);
        gpu_->rms_norm(x2g, w2g, 1e-6f, x2g);
      }
      std::vector<float> a = download(*gpu_, x1g), b = download(*gpu_, x2full);
      if (fused) {
        expect_close(a, values(o1c), kTolBF16, what + " first");
        std::vector<float> b_cols;  // the normed columns of x2
        for (int64_t t = 0; t < c.T; ++t)
          b_cols.insert(b_cols.end(), b.begin() + t * c.W2, b.begin() + t * c.W2 + c.H2);
        expect_close(b_cols, values(o2c), kTolBF16, what + " second");
        for (int64_t t = 0; t < c.T; ++t)  // the columns past H2 are untouched
          for (int64_t j = c.H2; j < c.W2; ++j)
            ASSERT_EQ(b[t * c.W2 + j], c.out == DType::BF16 ? bf16_to_float(float_to_bf16(x2[t * c.W2 + j]))
                                                              : x2[t * c.W2 + j])
                << what << ": column " << j << " of row " << t << " was written";
        fused1 = a;
        fused2 = b;
      } else {
        expect_same_bits(fused1, a, what + ": fused vs unfused (first)");
        expect_same_bits(fused2, b, what + ": fused vs unfused (second)");
      }
    }
  }
}

// rms_norm_pair's register form (rms_norm_row.cuh; the loop when a side is longer than 8 x its
// threads) against the CPU and against two rms_norm calls bit for bit: MLA's q_a / c_kv (1536 /
// the first 512 of 576), odd widths, one side too long for the register form (the loop for both
// sides, the register form for the second rms_norm), F32 and BF16 rows and weights; in place as
// MLA runs it, and into NaN-poisoned outputs between guard bytes.
TEST_F(FusedMla, RmsNormPairRegisterForm) {
  struct Case {
    int64_t T, H1, W2, H2;
  };
  for (const Case& c : {Case{1, 1536, 576, 512}, Case{8, 1536, 576, 512}, Case{3, 100, 72, 64},
                        Case{2, 2048, 2048, 1024}, Case{4, 1000, 130, 129}, Case{2, 2050, 576, 512},
                        Case{1, 1, 3, 1}}) {
    for (DType act : {DType::BF16, DType::F32}) {
      for (DType wdt : {DType::BF16, DType::F32}) {
        const std::string what = "rms_norm_pair T " + std::to_string(c.T) + " H " + std::to_string(c.H1) + " / " +
                                 std::to_string(c.H2) + " of " + std::to_string(c.W2) + " " +
                                 std::string(dtype_name(act)) + " w " + std::string(dtype_name(wdt));
        std::vector<float> x1 = randn(c.T * c.H1), w1 = randn(c.H1), x2 = randn(c.T * c.W2), w2 = randn(c.H2);
        Tensor x1c = cpu_f32(x1, {c.T, c.H1}), x2c = cols_of(cpu_f32(x2, {c.T, c.W2}), c.H2);
        Tensor o1c = cpu_f32(std::vector<float>(c.T * c.H1), {c.T, c.H1});
        Tensor o2c = cpu_f32(std::vector<float>(c.T * c.H2), {c.T, c.H2});
        cpu_->rms_norm_pair(x1c, cpu_f32(w1, {c.H1}), o1c, x2c, cpu_f32(w2, {c.H2}), o2c, 1e-6f);
        Backend& b = *gpu_;
        Tensor w1g = gpu_float(b, w1, {c.H1}, wdt), w2g = gpu_float(b, w2, {c.H2}, wdt);
        Tensor x1g = gpu_float(b, x1, {c.T, c.H1}, act), x2full = gpu_float(b, x2, {c.T, c.W2}, act);
        Tensor x2g = cols_of(x2full, c.H2);
        Tensor o1 = gpu_guarded(b, act, {c.T, c.H1}), o2 = gpu_guarded(b, act, {c.T, c.H2});
        Tensor s1 = gpu_guarded(b, act, {c.T, c.H1}), s2 = gpu_guarded(b, act, {c.T, c.H2});
        b.rms_norm_pair(x1g, w1g, o1, x2g, w2g, o2, 1e-6f);
        b.rms_norm(x1g, w1g, 1e-6f, s1);
        b.rms_norm(x2g, w2g, 1e-6f, s2);
        b.rms_norm_pair(x1g, w1g, x1g, x2g, w2g, x2g, 1e-6f);  // in place, after the calls above read them
        const std::vector<float> out1 = download(b, o1), out2 = download(b, o2), in1 = download(b, x1g),
                                 in2 = download(b, x2full);
        expect_guards_intact(what);
        expect_close(out1, values(o1c), kTolBF16, what + " first");
        expect_close(out2, values(o2c), kTolBF16, what + " second");
        expect_same_bits(download(b, s1), out1, what + ": rms_norm vs the pair (first)");
        expect_same_bits(download(b, s2), out2, what + ": rms_norm vs the pair (second)");
        expect_same_bits(in1, out1, what + ": in place vs out of place (first)");
        for (int64_t t = 0; t < c.T; ++t)
          for (int64_t j = 0; j < c.W2; ++j) {
            const float want = j < c.H2 ? out2[t * c.H2 + j]
                                        : (act == DType::BF16 ? bf16_to_float(float_to_bf16(x2[t * c.W2 + j]))
                                                              : x2[t * c.W2 + j]);
            ASSERT_EQ(std::memcmp(&in2[t * c.W2 + j], &want, sizeof(float)), 0)
                << what << ": in place, second, row " << t << " column " << j;
          }
      }
    }
  }
}

TEST_F(FusedMla, RopeStore) {
  // MLA shapes: q [T, heads, nope + rope] at offset nope, latent rows [T, kv_lora + rope] at
  // offset kv_lora, rope part of q copied into q_abs [T, heads, kv_lora + rope] at kv_lora.
  struct Case {
    int64_t T, heads, nope, L, rope;
    bool interleave, with_copy;
  };
  for (const Case& c : {Case{1, 16, 128, 512, 64, true, true}, Case{8, 16, 128, 512, 64, true, true},
                        Case{5, 3, 8, 24, 16, false, true}, Case{7, 16, 128, 512, 64, true, false}}) {
    const std::string what = "mla_rope_store T " + std::to_string(c.T) + " heads " + std::to_string(c.heads) +
                             (c.interleave ? " interleaved" : "") + (c.with_copy ? " + q copy" : "");
    const int64_t qk = c.nope + c.rope, row = c.L + c.rope, maxpos = 700, blocks = 4, bs = 16;
    std::vector<float> q = randn(c.T * c.heads * qk), kv = randn(c.T * row), cs = randn(maxpos * c.rope, 1.0f, false);
    std::vector<float> cache = randn(blocks * bs * row), qabs = randn(c.T * c.heads * row);
    std::vector<int32_t> pos(c.T), slots(blocks * bs);
    for (auto& p : pos) p = randint(0, maxpos - 1);
    for (int32_t i = 0; i < blocks * bs; ++i) slots[i] = i;
    std::shuffle(slots.begin(), slots.end(), rng_);
    slots.resize(c.T);
    if (c.T > 2) slots[2] = -1;  // not stored
    auto rope_part = [&](Tensor t) {  // q_abs[:, :, L : L + rope] view of [T, heads, row]
      t.shape[2] = c.rope;
      t.data = static_cast<char*>(t.data) + c.L * static_cast<int64_t>(dtype_size(t.dtype));
      return t;
    };
    // CPU reference (composition).
    Tensor qc = cpu_f32(q, {c.T, c.heads, qk}), kvc = cpu_f32(kv, {c.T, row}), qac = cpu_f32(qabs, {c.T, c.heads, row});
    PagedKV kc;
    kc.cache = cpu_f32(cache, {blocks, bs, row});
    kc.slot_mapping = cpu_i32(slots, {c.T});
    Tensor qrc = c.with_copy ? rope_part(qac) : Tensor{};
    cpu_->mla_rope_store(qc, kvc, cpu_i32(pos, {c.T}), cpu_f32(cs, {maxpos, c.rope}), static_cast<int>(c.nope),
                         static_cast<int>(c.L), static_cast<int>(c.rope), c.interleave, kc, qrc);
    std::vector<std::vector<float>> fused;
    for (bool use_fused : {true, false}) {
      Tensor qg = gpu_float(*gpu_, q, {c.T, c.heads, qk}, DType::BF16);
      Tensor kvg = gpu_float(*gpu_, kv, {c.T, row}, DType::BF16);
      Tensor qag = gpu_float(*gpu_, qabs, {c.T, c.heads, row}, DType::BF16);
      Tensor posg = gpu_copy(*gpu_, cpu_i32(pos, {c.T}));
      Tensor csg = gpu_float(*gpu_, cs, {maxpos, c.rope}, DType::F32);
      PagedKV kg;
      kg.cache = gpu_float(*gpu_, cache, {blocks, bs, row}, DType::BF16);
      kg.slot_mapping = gpu_copy(*gpu_, kc.slot_mapping);
      Tensor qrg = c.with_copy ? rope_part(qag) : Tensor{};
      if (use_fused) {
        gpu_->mla_rope_store(qg, kvg, posg, csg, static_cast<int>(c.nope), static_cast<int>(c.L),
                             static_cast<int>(c.rope), c.interleave, kg, qrg);
      } else {
        gpu_->rope(qg, posg, csg, static_cast<int>(c.nope), static_cast<int>(c.rope), c.interleave);
        gpu_->rope(kvg, posg, csg, static_cast<int>(c.L), static_cast<int>(c.rope), c.interleave);
        gpu_->kv_store(kvg, kg);
        if (c.with_copy) {
          Tensor src = qg;
          src.shape[2] = c.rope;
          src.data = static_cast<char*>(qg.data) + c.nope * 2;
          gpu_->copy(src, qrg);
        }
      }
      std::vector<std::vector<float>> got = {download(*gpu_, qg), download(*gpu_, kvg), download(*gpu_, kg.cache),
                                             download(*gpu_, qag)};
      if (use_fused) {
        expect_close(got[0], values(qc), kTolBF16, what + ": q");
        expect_close(got[1], values(kvc), kTolBF16, what + ": kv rows");
        expect_close(got[2], values(kc.cache), kTolBF16, what + ": cache");
        expect_close(got[3], values(qac), kTolBF16, what + ": q_abs");
        fused = got;
      } else {
        const char* names[] = {"q", "kv rows", "cache", "q_abs"};
        for (int i = 0; i < 4; ++i) expect_same_bits(fused[i], got[i], what + ": fused vs unfused " + names[i]);
      }
    }
  }
}

// Paged attention at both chunk sizes (32 and 64, forced by CudaOptions::attn_chunk) against
// the CPU reference, and each chunk size batch-invariant: a token alone == in a batch; then
// the default mode's per-launch chunk against the CPU reference. Any other forced chunk (16
// lost its A/B and is gone) is refused when the backend is made.
TEST_F(FusedMla, PagedAttentionChunkSizes) {
  const int64_t heads = 16, row = 576, L = 512, bs = 64;
  const std::vector<int32_t> lens = {1, 17, 64, 65, 300, 577};
  const int64_t T = static_cast<int64_t>(lens.size());
  int64_t blocks_per_seq = 0;
  for (int32_t n : lens) blocks_per_seq = std::max<int64_t>(blocks_per_seq, (n + bs - 1) / bs);
  const int64_t num_blocks = T * blocks_per_seq;
  std::vector<float> q = randn(T * heads * row), cache = randn(num_blocks * bs * row);
  std::vector<int32_t> qs(T + 1), tables(T * blocks_per_seq);
  for (int64_t i = 0; i <= T; ++i) qs[i] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < T * blocks_per_seq; ++i) tables[i] = static_cast<int32_t>(i);
  std::shuffle(tables.begin(), tables.end(), rng_);
  const float scale = 1.0f / std::sqrt(192.0f);
  const int max_len = *std::max_element(lens.begin(), lens.end());
  auto kv_for = [&](Backend* g, Tensor cache_t, int64_t first, int64_t n) {
    PagedKV kv;
    kv.cache = cache_t;
    std::vector<int32_t> q0(n + 1), l0(lens.begin() + first, lens.begin() + first + n),
        t0(tables.begin() + first * blocks_per_seq, tables.begin() + (first + n) * blocks_per_seq);
    for (int64_t i = 0; i <= n; ++i) q0[i] = static_cast<int32_t>(i);
    Tensor a = cpu_i32(q0, {n + 1}), b = cpu_i32(l0, {n}), c = cpu_i32(t0, {n, blocks_per_seq});
    kv.query_start = g ? gpu_copy(*g, a) : a;
    kv.seq_lens = g ? gpu_copy(*g, b) : b;
    kv.block_tables = g ? gpu_copy(*g, c) : c;
    kv.num_seqs = static_cast<int>(n);
    kv.max_query_len = 1;
    kv.max_seq_len = max_len;
    return kv;
  };
  Tensor oc = cpu_f32(std::vector<float>(T * heads * L), {T, heads, L});
  cpu_->mla_attention_paged(cpu_f32(q, {T, heads, row}), kv_for(nullptr, cpu_f32(cache, {num_blocks, bs, row}), 0, T),
                            scale, static_cast<int>(L), oc);
  Tensor cache_g = gpu_float(*gpu_, cache, {num_blocks, bs, row}, DType::BF16);
  Tensor q_g = gpu_float(*gpu_, q, {T, heads, row}, DType::BF16);
  gpu_->synchronize();  // the inputs are read by backends with their own streams below
  for (int bad_chunk : {16, 128}) {
    BackendOptions bad = env_backend_options();
    bad.cuda.attn_chunk = bad_chunk;
    EXPECT_THROW(make_cuda_backend(bad), Error) << "attn_chunk " << bad_chunk;
  }
  for (int chunk_size : {32, 64}) {
    const std::string chunk = std::to_string(chunk_size);
    // The chunk is a backend option (only tests set it: the engine keeps the per-launch choice).
    BackendOptions forced = env_backend_options();
    forced.cuda.attn_chunk = chunk_size;
    const std::unique_ptr<Backend> gpu = make_cuda_backend(forced);
    Tensor og = gpu_poisoned(*gpu, DType::BF16, {T, heads, L});
    gpu->mla_attention_paged(q_g, kv_for(gpu.get(), cache_g, 0, T), scale, static_cast<int>(L), og);
    const std::vector<float> batch = download(*gpu, og);
    expect_close(batch, values(oc), kTolAttention, std::string("paged attention chunk ") + chunk);
    // The last token alone (max_seq_len kept: it must not matter) gives the same bits.
    Tensor q1 = q_g.slice_rows(T - 1, T);
    Tensor o1 = gpu_poisoned(*gpu, DType::BF16, {1, heads, L});
    gpu->mla_attention_paged(q1, kv_for(gpu.get(), cache_g, T - 1, 1), scale, static_cast<int>(L), o1);
    const std::vector<float> alone = download(*gpu, o1);
    expect_same_bits(alone, std::vector<float>(batch.end() - heads * L, batch.end()),
                     std::string("paged attention chunk ") + chunk + ": alone vs in batch");
  }
  // No override: the default mode picks the chunk per launch (32 for a launch of <= 4
  // token x head-block items, 64 above), so the 6-token batch and the token alone take
  // different chunks: each must still match the CPU reference.
  {
    Tensor og = gpu_poisoned(*gpu_, DType::BF16, {T, heads, L});
    gpu_->mla_attention_paged(q_g, kv_for(gpu_.get(), cache_g, 0, T), scale, static_cast<int>(L), og);
    expect_close(download(*gpu_, og), values(oc), kTolAttention, "paged attention, per-launch chunk, batch");
    Tensor o1 = gpu_poisoned(*gpu_, DType::BF16, {1, heads, L});
    gpu_->mla_attention_paged(q_g.slice_rows(T - 1, T), kv_for(gpu_.get(), cache_g, T - 1, 1), scale,
                              static_cast<int>(L), o1);
    const std::vector<float> want = values(oc);
    expect_close(download(*gpu_, o1), std::vector<float>(want.end() - heads * L, want.end()), kTolAttention,
                 "paged attention, per-launch chunk, last token alone");
  }
}

}  // namespace
}  // namespace deepinfer::ops_test
