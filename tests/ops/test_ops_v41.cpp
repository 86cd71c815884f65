// Parity of DeepSeek-V4.1's ops (backend.h, issue 19): the cache formats (fake_quant,
// store_packed_rows, gather_packed_rows: FP8 with E8M0 per 32, FP4 with E8M0 per 32, FP4 with e4m3
// per 16), single-pass hyper-connections (hc_mix, hc_collapse), Engram (engram_gate,
// embedding_fp8_rows) and the two-level indexer selection (indexer_scores_visible, candidate_blocks,
// topk_finite). CUDA against the CPU reference in the default and the batch-invariant configuration;
// outputs NaN-poisoned inside guard sentinels; odd row counts and widths.
//  - The quantizers are compared bit for bit: values, codes and scale bytes (the packed caches
//    whole, untouched slots still holding their poison). Inputs are finite (a NaN or inf input has
//    no defined scale byte; the CPU's ilogb would overflow).
//  - embedding_fp8_rows is one float multiply per value on both sides: bit-equal.
//  - indexer_scores_visible, topk_finite and candidate_blocks run on integer-valued inputs with
//    power-of-two scales: every score is exact on both sides, with many exact ties, so the chosen
//    indices and biases must agree exactly (order, ties to the lower index, -inf / NaN skipped).
//  - hc_mix, hc_collapse and engram_gate sum in another order than the CPU (fp32 tree sums against
//    the CPU's double or sequential fp32): compared within fp32 rounding.
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "tests/ops/parity.h"

namespace deepinfer::ops_test {
namespace {

constexpr double kTolF32 = 1e-4;
using FQ = Backend::FakeQuant;

class V41Ops : public Parity {
 protected:
  static const char* kind_name(FQ k) {
    return k == FQ::Fp8Ue8m0x32 ? "fp8/e8m0x32" : k == FQ::Fp4Ue8m0x32 ? "fp4/e8m0x32" : "fp4/e4m3x16";
  }
  static void expect_same(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i) {
      const bool same = std::memcmp(&got[i], &want[i], sizeof(float)) == 0 || (std::isnan(got[i]) && std::isnan(want[i]));
      ASSERT_TRUE(same) << what << ": element " << i << " is " << got[i] << ", the CPU's " << want[i];
    }
  }
  std::vector<uint8_t> bytes(Backend& b, const Tensor& t) {
    std::vector<uint8_t> v(static_cast<size_t>(t.num_bytes()));
    Tensor h(v.data(), t.dtype, t.dims());
    b.copy(t, h);
    return v;
  }
  // Rows whose blocks span many magnitudes: each block of 16 channels scaled by 2^u, u in [-30, 12],
  // one all-zero block, some exact +-0 and tie values.
  std::vector<float> quant_input(int64_t R, int64_t C, bool bf16) {
    std::vector<float> v = randn(R * C, 1.0f, bf16);
    for (int64_t b0 = 0; b0 < R * C; b0 += 16) {
      const float s = std::ldexp(1.0f, randint(-30, 12));
      for (int64_t i = b0; i < std::min(R * C, b0 + 16); ++i) {
        v[i] *= s;
        if (bf16) v[i] = bf16_to_float(float_to_bf16(v[i]));
      }
    }
    for (int64_t i = 0; i < std::min<int64_t>(16, R * C); ++i) v[i] = 0.0f;
    if (R * C > 40) {
      v[20] = -0.0f;
      v[33] = 1.25f;  // e2m1 / e4m3 ties when their block's scale is 1
      v[34] = 0.75f;
    }
    return v;
  }
};

struct QuantCase {
  int64_t R, C;
};
std::vector<QuantCase> quant_cases(FQ k) {
  if (k == FQ::Fp4E4m3x16) return {{1, 16}, {7, 48}, {5, 512}, {3, 144}};
  return {{1, 32}, {7, 96}, {5, 512}, {3, 160}};
}

TEST_F(V41Ops, FakeQuantBitExact) {
  for (FQ kind : {FQ::Fp8Ue8m0x32, FQ::Fp4Ue8m0x32, FQ::Fp4E4m3x16}) {
    for (const QuantCase& c : quant_cases(kind)) {
      for (DType dt : {DType::F32, DType::BF16}) {
        const std::vector<float> x = quant_input(c.R, c.C, dt == DType::BF16);
        Tensor xc = cpu_f32(x, {c.R, c.C});
        cpu_->fake_quant(xc, kind);
        for (Backend* g : gpus()) {
          const std::string what = std::string("fake_quant ") + kind_name(kind) + " [" + std::to_string(c.R) + ", " +
                                   std::to_string(c.C) + "] " + std::string(dtype_name(dt)) + tag(*g);
          Tensor xg = gpu_float(*g, x, {c.R, c.C}, dt);
          g->fake_quant(xg, kind);
          expect_same(download(*g, xg), values(xc), what);  // every value of the formats is exact in BF16
        }
      }
    }
  }
}

TEST_F(V41Ops, StoreAndGatherPackedRowsBitExact) {
  for (FQ kind : {FQ::Fp8Ue8m0x32, FQ::Fp4Ue8m0x32, FQ::Fp4E4m3x16}) {
    for (const QuantCase& c : quant_cases(kind)) {
      const int64_t bytes_per_row = packed_row_bytes(kind, c.C), blocks = 3, bs = 5, slots = blocks * bs;
      ASSERT_LE(c.R, slots);
      // Distinct slots in shuffled order, one row not stored (-1).
      std::vector<int32_t> slot(static_cast<size_t>(slots));
      for (int64_t i = 0; i < slots; ++i) slot[i] = static_cast<int32_t>(i);
      std::shuffle(slot.begin(), slot.end(), rng_);
      slot.resize(static_cast<size_t>(c.R));
      if (c.R > 2) slot[1] = -1;
      std::vector<int32_t> ids;
      for (int i = 0; i < 11; ++i) {
        const int32_t s = slot[static_cast<size_t>(randint(0, static_cast<int>(c.R) - 1))];
        ids.push_back(s >= 0 ? s : slot[0]);
      }
      const int64_t N = static_cast<int64_t>(ids.size());
      for (DType dt : {DType::F32, DType::BF16}) {
        const std::vector<float> x = quant_input(c.R, c.C, dt == DType::BF16);
        HostBuffer cache_c(DType::U8, {blocks, bs, bytes_per_row});
        std::fill(cache_c.ptr<uint8_t>(), cache_c.ptr<uint8_t>() + cache_c.tensor().numel(), uint8_t{0x7f});
        PagedKV kc;
        kc.cache = cache_c.tensor();
        kc.slot_mapping = cpu_i32(slot, {c.R});
        cpu_->store_packed_rows(cpu_f32(x, {c.R, c.C}), kind, kc);
        Tensor oc = cpu_f32(std::vector<float>(N * c.C), {N, c.C});
        const Tensor rows_c = cache_c.tensor().view({slots, bytes_per_row});
        cpu_->gather_packed_rows(cpu_i32(ids, {N}), rows_c, kind, oc);
        const std::vector<uint8_t> want(cache_c.ptr<uint8_t>(), cache_c.ptr<uint8_t>() + cache_c.tensor().numel());
        for (Backend* g : gpus()) {
          const std::string what = std::string("packed rows ") + kind_name(kind) + " [" + std::to_string(c.R) + ", " +
                                   std::to_string(c.C) + "] " + std::string(dtype_name(dt)) + tag(*g);
          Tensor cache_g = gpu_guarded(*g, DType::U8, {blocks, bs, bytes_per_row});  // poisoned 0x7f like the CPU's
          PagedKV kg;
          kg.cache = cache_g;
          kg.slot_mapping = gpu_copy(*g, cpu_i32(slot, {c.R}));
          g->store_packed_rows(gpu_float(*g, x, {c.R, c.C}, dt), kind, kg);
          EXPECT_EQ(bytes(*g, cache_g), want) << what << ": cache bytes, seed " << seed_;
          Tensor og = gpu_guarded(*g, dt, {N, c.C});
          g->gather_packed_rows(gpu_copy(*g, cpu_i32(ids, {N})), cache_g.view({slots, bytes_per_row}), kind, og);
          expect_same(download(*g, og), values(oc), what + " gathered");
          expect_guards_intact(what);
        }
      }
    }
  }
}

struct HcCase {
  int64_t T, hc, H;
};
const std::vector<HcCase> kHcCases = {{1, 4, 64}, {5, 3, 33}, {9, 4, 96}, {3, 4, 4096}, {2, 1, 40}};

TEST_F(V41Ops, HcMix) {
  for (const HcCase& c : kHcCases) {
    const int64_t T = c.T, hc = c.hc, H = c.H, mixes = (2 + hc) * hc;
    const std::vector<float> x = randn(T * hc * H), fn = randn(mixes * hc * H, 1.0f / std::sqrt(float(hc * H)), false);
    const std::vector<float> base = randn(mixes, 1.0f, false), scale = randn(3, 1.0f, false);
    Backend::HyperConnectionParams p;
    p.hc_mult = static_cast<int>(hc);
    Tensor prc = cpu_f32(std::vector<float>(T * hc), {T, hc}), pc = cpu_f32(std::vector<float>(T * hc), {T, hc});
    Tensor mc = cpu_f32(std::vector<float>(T * hc * hc), {T, hc, hc});
    Tensor fnc = cpu_f32(fn, {mixes, hc * H}), bc = cpu_f32(base, {mixes}), sc = cpu_f32(scale, {3});
    cpu_->hc_mix(cpu_f32(x, {T, hc, H}), fnc, bc, sc, p, prc, pc, mc);
    for (Backend* g : gpus()) {
      for (DType dt : {DType::F32, DType::BF16}) {
        const std::string what = "hc_mix T " + std::to_string(T) + " hc " + std::to_string(hc) + " H " +
                                 std::to_string(H) + " " + std::string(dtype_name(dt)) + tag(*g);
        Tensor prg = gpu_guarded(*g, DType::F32, {T, hc}), pg = gpu_guarded(*g, DType::F32, {T, hc});
        Tensor mg = gpu_guarded(*g, DType::F32, {T, hc, hc});
        g->hc_mix(gpu_float(*g, x, {T, hc, H}, dt), gpu_copy(*g, fnc), gpu_copy(*g, bc), gpu_copy(*g, sc), p, prg, pg,
                  mg);
        expect_close(download(*g, prg), values(prc), kTolF32, what + " pre");
        expect_close(download(*g, pg), values(pc), kTolF32, what + " post");
        expect_close(download(*g, mg), values(mc), kTolF32, what + " comb");
        expect_guards_intact(what);
      }
    }
  }
}

TEST_F(V41Ops, HcCollapse) {
  for (const HcCase& c : kHcCases) {
    const int64_t T = c.T, hc = c.hc, H = c.H;
    const std::vector<float> x = randn(T * hc * H), pre = randn(T * hc, 1.0f, false);
    Tensor oc = cpu_f32(std::vector<float>(T * H), {T, H});
    cpu_->hc_collapse(cpu_f32(x, {T, hc, H}), cpu_f32(pre, {T, hc}), oc);
    for (Backend* g : gpus()) {
      for (DType dt : {DType::F32, DType::BF16}) {
        const std::string what = "hc_collapse T " + std::to_string(T) + " hc " + std::to_string(hc) + " H " +
                                 std::to_string(H) + " " + std::string(dtype_name(dt)) + tag(*g);
        Tensor og = gpu_guarded(*g, dt, {T, H});
        g->hc_collapse(gpu_float(*g, x, {T, hc, H}, dt), gpu_float(*g, pre, {T, hc}, DType::F32), og);
        expect_close(download(*g, og), values(oc), dt == DType::F32 ? 1e-6 : kTolBF16, what);
        expect_guards_intact(what);
      }
    }
  }
}

TEST_F(V41Ops, EngramGate) {
  for (const HcCase& c : kHcCases) {
    const int64_t T = c.T, hc = c.hc, H = c.H;
    const std::vector<float> s = randn(T * hc * H, 1.0f, false), kv = randn(T * (hc + 1) * H, 1.0f, false);
    const std::vector<float> w = randn(hc * H, 1.0f, false);
    Tensor oc = cpu_f32(std::vector<float>(T * hc * H), {T, hc, H});
    cpu_->engram_gate(cpu_f32(s, {T, hc, H}), cpu_f32(kv, {T, (hc + 1) * H}), cpu_f32(w, {hc, H}), 1e-20f, oc);
    for (Backend* g : gpus()) {
      for (bool in_place : {false, true}) {
        const std::string what = "engram_gate T " + std::to_string(T) + " hc " + std::to_string(hc) + " H " +
                                 std::to_string(H) + (in_place ? " in place" : "") + tag(*g);
        Tensor sg = gpu_float(*g, s, {T, hc, H}, DType::F32);
        Tensor og = in_place ? sg : gpu_guarded(*g, DType::F32, {T, hc, H});
        g->engram_gate(sg, gpu_float(*g, kv, {T, (hc + 1) * H}, DType::F32), gpu_float(*g, w, {hc, H}, DType::F32),
                       1e-20f, og);
        expect_close(download(*g, og), values(oc), kTolF32, what);
        expect_guards_intact(what);
      }
    }
  }
}

TEST_F(V41Ops, EmbeddingFp8RowsBitExact) {
  for (const auto& [R, C, N] : {std::tuple<int64_t, int64_t, int64_t>{5, 32, 1}, {17, 96, 9}, {40, 256, 33}}) {
    const int64_t B = C / 32;
    std::vector<uint8_t> table(static_cast<size_t>(R * C)), e8(static_cast<size_t>(R * B));
    for (uint8_t& b : table) {
      b = static_cast<uint8_t>(randint(0, 255));
      if ((b & 0x7f) == 0x7f) b = 0x3c;  // no NaN codes
    }
    for (uint8_t& b : e8) b = static_cast<uint8_t>(randint(100, 140));
    std::vector<float> f32_scales(e8.size());
    for (size_t i = 0; i < e8.size(); ++i) f32_scales[i] = std::ldexp(1.0f, e8[i] - 127) * 1.5f;
    std::vector<int32_t> ids(static_cast<size_t>(N));
    for (int32_t& i : ids) i = randint(0, static_cast<int>(R) - 1);
    const Tensor tc = cpu_raw(DType::F8_E4M3, table.data(), {R, C});
    for (bool e8m0 : {true, false}) {
      const Tensor scc = e8m0 ? cpu_raw(DType::U8, e8.data(), {R, B}) : cpu_f32(f32_scales, {R, B});
      Tensor oc = cpu_f32(std::vector<float>(N * C), {N, C});
      cpu_->embedding_fp8_rows(cpu_i32(ids, {N}), tc, scc, oc);
      for (Backend* g : gpus()) {
        for (DType dt : {DType::F32, DType::BF16}) {
          const std::string what = "embedding_fp8_rows [" + std::to_string(R) + ", " + std::to_string(C) + "] x " +
                                   std::to_string(N) + (e8m0 ? " e8m0" : " f32") + " scales, " +
                                   std::string(dtype_name(dt)) + tag(*g);
          Tensor og = gpu_guarded(*g, dt, {N, C});
          g->embedding_fp8_rows(gpu_copy(*g, cpu_i32(ids, {N})), gpu_copy(*g, tc), gpu_copy(*g, scc), og);
          std::vector<float> want = values(oc);
          if (dt == DType::BF16)
            for (float& v : want) v = bf16_to_float(float_to_bf16(v));
          expect_same(download(*g, og), want, what);
          expect_guards_intact(what);
        }
      }
    }
  }
}

// Integer scores with power-of-two scales: exact on both sides, many ties.
TEST_F(V41Ops, IndexerScoresVisibleExact) {
  struct Case {
    int64_t T, heads, d, S;
    int ratio;
  };
  for (const Case& c : {Case{1, 16, 64, 10, 2}, Case{6, 32, 128, 300, 2}, Case{9, 4, 16, 50, 1}, Case{3, 8, 32, 3, 2}}) {
    auto ints = [&](int64_t n, int lo, int hi) {
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = float(randint(lo, hi));
      return v;
    };
    const std::vector<float> q = ints(c.T * c.heads * c.d, -2, 2), keys = ints(c.S * c.d, -2, 2);
    const std::vector<float> w = ints(c.T * c.heads, -2, 3);
    std::vector<int32_t> pos(static_cast<size_t>(c.T));
    for (int32_t& p : pos) p = randint(0, int(c.S * c.ratio) + 5);
    pos[0] = int32_t(c.S * c.ratio) + 3;
    const float ss = 1.0f / 16, ws = 1.0f / 8;
    Tensor oc = cpu_f32(std::vector<float>(c.T * c.S), {c.T, c.S});
    cpu_->indexer_scores_visible(cpu_f32(q, {c.T, c.heads, c.d}), cpu_f32(keys, {c.S, c.d}),
                                 cpu_f32(w, {c.T, c.heads}), cpu_i32(pos, {c.T}), c.ratio, ss, ws, oc);
    for (Backend* g : gpus()) {
      for (DType dt : {DType::F32, DType::BF16}) {
        const std::string what = "indexer_scores_visible T " + std::to_string(c.T) + " heads " +
                                 std::to_string(c.heads) + " S " + std::to_string(c.S) + " " +
                                 std::string(dtype_name(dt)) + tag(*g);
        Tensor og = gpu_guarded(*g, DType::F32, {c.T, c.S});
        g->indexer_scores_visible(gpu_float(*g, q, {c.T, c.heads, c.d}, dt), gpu_float(*g, keys, {c.S, c.d}, dt),
                                  gpu_float(*g, w, {c.T, c.heads}, DType::F32), gpu_copy(*g, cpu_i32(pos, {c.T})),
                                  c.ratio, ss, ws, og);
        expect_same(download(*g, og), values(oc), what);
        expect_guards_intact(what);
      }
    }
  }
}

// Scores of few distinct integers (ties), -inf and NaN entries, rows with fewer finite entries than k.
std::vector<float> tie_scores(int64_t T, int64_t S, std::mt19937_64& rng) {
  std::vector<float> v(static_cast<size_t>(T * S));
  std::uniform_int_distribution<int> d(-4, 4), kind(0, 9);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t finite_upto = t % 3 == 1 ? std::min<int64_t>(S, 3) : S;  // a short row
    for (int64_t s = 0; s < S; ++s) {
      float x = float(d(rng)) * 0.5f;
      const int k = kind(rng);
      if (s >= finite_upto || k == 0) x = -INFINITY;
      if (k == 1 && s < finite_upto) x = std::nanf("");
      v[static_cast<size_t>(t * S + s)] = x;
    }
  }
  return v;
}

TEST_F(V41Ops, TopkFiniteExact) {
  for (const auto& [T, S, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 10, 4}, {7, 300, 64}, {5, 1000, 512},
                                {4, 33, 40}, {3, 2, 1}, {2, 5000, 512}}) {
    const std::vector<float> sc = tie_scores(T, S, rng_);
    Tensor oc = cpu_i32(std::vector<int32_t>(T * k), {T, k});
    cpu_->topk_finite(cpu_f32(sc, {T, S}), oc);
    const std::vector<int32_t> want(oc.ptr<int32_t>(), oc.ptr<int32_t>() + T * k);
    for (Backend* g : gpus()) {
      const std::string what = "topk_finite [" + std::to_string(T) + ", " + std::to_string(S) + "] k " +
                               std::to_string(k) + tag(*g);
      Tensor og = gpu_guarded(*g, DType::I32, {T, k});
      g->topk_finite(gpu_float(*g, sc, {T, S}, DType::F32), og);
      std::vector<int32_t> got(static_cast<size_t>(T * k));
      Tensor h(got.data(), DType::I32, {T, k});
      g->copy(og, h);
      EXPECT_EQ(got, want) << what << ", seed " << seed_;
      expect_guards_intact(what);
    }
  }
}

TEST_F(V41Ops, CandidateBlocksExact) {
  struct Case {
    int64_t T, S, topk_blocks, block_size;
    int ratio;
  };
  for (const Case& c : {Case{1, 20, 2, 8, 1}, Case{6, 300, 5, 8, 1}, Case{5, 2000, 64, 8, 1}, Case{4, 37, 100, 8, 2},
                        Case{3, 64, 3, 5, 1}}) {
    std::vector<float> sc = tie_scores(c.T, c.S, rng_);
    std::vector<int32_t> pos(static_cast<size_t>(c.T));
    for (int32_t& p : pos) p = randint(0, int(c.S * c.ratio) + 3);
    pos[0] = int32_t(c.S * c.ratio) - 1;
    // Scores past a query's visible entries are -inf (indexer_scores_visible's rows).
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t s = (pos[t] + 1) / c.ratio; s < c.S; ++s) sc[static_cast<size_t>(t * c.S + s)] = -INFINITY;
    Tensor oc = cpu_f32(std::vector<float>(c.T * c.S), {c.T, c.S});
    cpu_->candidate_blocks(cpu_f32(sc, {c.T, c.S}), cpu_i32(pos, {c.T}), c.ratio, c.topk_blocks, c.block_size, oc);
    for (Backend* g : gpus()) {
      const std::string what = "candidate_blocks [" + std::to_string(c.T) + ", " + std::to_string(c.S) + "] top " +
                               std::to_string(c.topk_blocks) + " blocks of " + std::to_string(c.block_size) + tag(*g);
      Tensor og = gpu_guarded(*g, DType::F32, {c.T, c.S});
      g->candidate_blocks(gpu_float(*g, sc, {c.T, c.S}, DType::F32), gpu_copy(*g, cpu_i32(pos, {c.T})), c.ratio,
                          c.topk_blocks, c.block_size, og);
      expect_same(download(*g, og), values(oc), what);
      expect_guards_intact(what);
    }
  }
}

// gemm() on FP8 weights with small blocks (V4.1's 32x32 E8M0; and 16x32, 64x16): the CUDA GEMMs keep
// the FP8 bytes and fold each block's scale into their BF16 weight tiles (kWeightFP8Fold; the stream
// kernel for few rows, the tile kernel of moe_qgemm.cu for many, or whenever K % 64 != 0).
//  - against the CPU reference (x BF16-exact, weights e4m3 x 2^u: every product exact) within F32
//    summation order for F32 outputs and BF16 rounding for BF16 ones, outputs in guard sentinels;
//  - batch-invariant configuration: each row bit-equal to that row alone, and (K % 64 == 0, the
//    stream kernel on both sides) bit-equal to the same GEMM on the BF16-dequantized weight: the
//    fold is the exact dequantization the uploader made before.
TEST_F(V41Ops, GemmFp8SmallBlocksMatchCpu) {
  struct Case {
    int64_t M, N, K;
    int bn, bk;
  };
  for (const Case& c : {Case{1, 64, 128, 32, 32}, Case{5, 200, 96, 32, 32}, Case{16, 96, 256, 32, 32},
                        Case{130, 256, 320, 32, 32}, Case{300, 130, 512, 32, 32}, Case{2100, 64, 64, 32, 32},
                        Case{7, 48, 192, 16, 32}, Case{33, 100, 160, 64, 16}}) {
    const int64_t sn = (c.N + c.bn - 1) / c.bn, sk = (c.K + c.bk - 1) / c.bk;
    std::vector<uint8_t> wq(static_cast<size_t>(c.N * c.K));
    for (uint8_t& b : wq) {
      b = static_cast<uint8_t>(randint(0, 255));
      if ((b & 0x7f) == 0x7f) b = 0x3c;  // no NaN codes
    }
    std::vector<float> sc(static_cast<size_t>(sn * sk));
    for (float& v : sc) v = std::ldexp(1.0f, randint(-10, 3));
    Weight wc;
    wc.w = cpu_raw(DType::F8_E4M3, wq.data(), {c.N, c.K});
    wc.scale_inv = cpu_f32(sc, {sn, sk});
    wc.block_n = c.bn;
    wc.block_k = c.bk;
    // The BF16 dequantization (DeviceUploader's before the fold).
    std::vector<uint16_t> deq(static_cast<size_t>(c.N * c.K));
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t k = 0; k < c.K; ++k)
        deq[static_cast<size_t>(n * c.K + k)] =
            float_to_bf16(fp8_e4m3_to_float(wq[static_cast<size_t>(n * c.K + k)]) * sc[(n / c.bn) * sk + k / c.bk]);
    const std::vector<float> x = randn(c.M * c.K, 0.5f);
    Tensor oc = cpu_f32(std::vector<float>(c.M * c.N), {c.M, c.N});
    cpu_->gemm(cpu_f32(x, {c.M, c.K}), wc, oc);
    for (Backend* g : gpus()) {
      Weight wg = wc;
      wg.w = gpu_copy(*g, wc.w);
      wg.scale_inv = gpu_copy(*g, wc.scale_inv);
      const Tensor xg = gpu_float(*g, x, {c.M, c.K}, DType::BF16);
      const std::string what = "gemm fp8 " + std::to_string(c.bn) + "x" + std::to_string(c.bk) + " blocks M " +
                               std::to_string(c.M) + " N " + std::to_string(c.N) + " K " + std::to_string(c.K) + tag(*g);
      for (DType odt : {DType::F32, DType::BF16}) {
        Tensor og = gpu_guarded(*g, odt, {c.M, c.N});
        g->gemm(xg, wg, og);
        expect_close(download(*g, og), values(oc), odt == DType::F32 ? 1e-5 : kTolBF16,
                     what + " out " + std::string(dtype_name(odt)));
        expect_guards_intact(what);
      }
      if (!g->batch_invariant()) continue;
      Tensor all = gpu_poisoned(*g, DType::F32, {c.M, c.N});
      g->gemm(xg, wg, all);
      const std::vector<float> got = download(*g, all);
      for (int64_t r : {int64_t{0}, c.M / 2, c.M - 1}) {
        Tensor one = gpu_poisoned(*g, DType::F32, {1, c.N});
        g->gemm(xg.slice_rows(r, r + 1), wg, one);
        expect_same(download(*g, one), std::vector<float>(got.begin() + r * c.N, got.begin() + (r + 1) * c.N),
                    what + ": row " + std::to_string(r) + " alone");
      }
      if (c.K % 64 != 0) continue;
      Weight wb;
      wb.w = gpu_copy(*g, cpu_raw(DType::BF16, deq.data(), {c.N, c.K}));
      Tensor ob = gpu_poisoned(*g, DType::F32, {c.M, c.N});
      g->gemm(xg, wb, ob);
      expect_same(got, download(*g, ob), what + ": vs the BF16-dequantized weight");
    }
  }
}

}  // namespace
}  // namespace deepinfer::ops_test
