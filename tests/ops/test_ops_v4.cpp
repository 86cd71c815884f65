// Parity of DeepSeek-V4's ops (backend.h, issue 16): hc_pre / hc_post / hc_head (hyper-
// connections with Sinkhorn), moe_routing_sqrt_softplus (selection-only bias, hash routing,
// exact ties), silu_mul_clamped, sink_attention (window + compressed rows, holes, an empty
// query), compressor_pool (overlapping with and without prior rows, HCA-style, a tail that
// waits) and the V4 indexer_topk (scores + top-k, best first; keys per query too), and the
// decode step's device-built addressing (v4_decode_rows, compressor_pool_rows). CUDA against the CPU reference
// in the default and the batch-invariant configuration; outputs are NaN-poisoned inside guard
// sentinels; shapes are odd on purpose (widths that are not multiples of 32, one token, a tail).
// Every V4 op works per token (or per output), so rows computed alone must equal the same rows
// in a batch bit for bit in both configurations.
#include <algorithm>
#include <limits>
#include <numeric>
#include <tuple>

#include "tests/ops/parity.h"

namespace deepinfer::ops_test {
namespace {

// F32 outputs of fp32 math on the same (BF16-exact) inputs the CPU reads in double or fp32.
constexpr double kTolF32 = 1e-4;

class V4Ops : public Parity {
 protected:
  static std::vector<float> slice(const std::vector<float>& v, int64_t row0, int64_t row1, int64_t row_len) {
    return std::vector<float>(v.begin() + row0 * row_len, v.begin() + row1 * row_len);
  }
  static void expect_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what << ": bits differ";
  }
  static Backend::HyperConnectionParams hc_params(int hc) {
    Backend::HyperConnectionParams p;
    p.hc_mult = hc;
    return p;
  }
};

struct HcCase {
  int64_t T, hc, H;
};
const std::vector<HcCase> kHcCases = {{1, 4, 64}, {5, 3, 33}, {9, 4, 96}, {3, 4, 4096}, {2, 1, 40}};

TEST_F(V4Ops, HcPre) {
  for (const HcCase& c : kHcCases) {
    const int64_t T = c.T, hc = c.hc, H = c.H, mixes = (2 + hc) * hc;
    const std::vector<float> x = randn(T * hc * H), fn = randn(mixes * hc * H, 1.0f / std::sqrt(float(hc * H)), false);
    const std::vector<float> base = randn(mixes, 1.0f, false), scale = randn(3, 1.0f, false);
    const Backend::HyperConnectionParams p = hc_params(static_cast<int>(hc));
    Tensor cc = cpu_f32(std::vector<float>(T * H), {T, H}), pc = cpu_f32(std::vector<float>(T * hc), {T, hc});
    Tensor mc = cpu_f32(std::vector<float>(T * hc * hc), {T, hc, hc});
    Tensor fnc = cpu_f32(fn, {mixes, hc * H}), bc = cpu_f32(base, {mixes}), sc = cpu_f32(scale, {3});
    cpu_->hc_pre(cpu_f32(x, {T, hc, H}), fnc, bc, sc, p, cc, pc, mc);
    for (Backend* g : gpus()) {
      for (DType dt : {DType::F32, DType::BF16}) {
        const std::string what = "hc_pre T " + std::to_string(T) + " hc " + std::to_string(hc) + " H " +
                                 std::to_string(H) + " " + std::string(dtype_name(dt)) + tag(*g);
        Tensor fng = gpu_copy(*g, fnc), bg = gpu_copy(*g, bc), sg = gpu_copy(*g, sc);
        auto run = [&](int64_t t0, int64_t t1, std::vector<float>* col, std::vector<float>* post,
                       std::vector<float>* comb) {
          const int64_t n = t1 - t0;
          Tensor cg = gpu_guarded(*g, dt, {n, H}), pg = gpu_guarded(*g, DType::F32, {n, hc});
          Tensor mg = gpu_guarded(*g, DType::F32, {n, hc, hc});
          g->hc_pre(gpu_float(*g, slice(x, t0, t1, hc * H), {n, hc, H}, dt), fng, bg, sg, p, cg, pg, mg);
          *col = download(*g, cg);
          *post = download(*g, pg);
          *comb = download(*g, mg);
          expect_guards_intact(what);
        };
        std::vector<float> col, post, comb;
        run(0, T, &col, &post, &comb);
        expect_close(col, values(cc), dt == DType::F32 ? kTolF32 : kTolBF16, what + " collapsed");
        expect_close(post, values(pc), kTolF32, what + " post");
        expect_close(comb, values(mc), kTolF32, what + " comb");
        if (T > 1) {  // the last row alone: the same bits
          std::vector<float> c1, p1, m1;
          run(T - 1, T, &c1, &p1, &m1);
          expect_bits(c1, slice(col, T - 1, T, H), what + " collapsed alone vs in batch");
          expect_bits(p1, slice(post, T - 1, T, hc), what + " post alone vs in batch");
          expect_bits(m1, slice(comb, T - 1, T, hc * hc), what + " comb alone vs in batch");
        }
      }
    }
  }
}

TEST_F(V4Ops, HcHead) {
  for (const HcCase& c : kHcCases) {
    const int64_t T = c.T, hc = c.hc, H = c.H;
    const std::vector<float> x = randn(T * hc * H), fn = randn(hc * hc * H, 1.0f / std::sqrt(float(hc * H)), false);
    const std::vector<float> base = randn(hc, 1.0f, false), scale = randn(1, 1.0f, false);
    const Backend::HyperConnectionParams p = hc_params(static_cast<int>(hc));
    Tensor oc = cpu_f32(std::vector<float>(T * H), {T, H});
    Tensor fnc = cpu_f32(fn, {hc, hc * H}), bc = cpu_f32(base, {hc}), sc = cpu_f32(scale, {1});
    cpu_->hc_head(cpu_f32(x, {T, hc, H}), fnc, bc, sc, p, oc);
    for (Backend* g : gpus()) {
      for (DType dt : {DType::F32, DType::BF16}) {
        const std::string what = "hc_head T " + std::to_string(T) + " hc " + std::to_string(hc) + " H " +
                                 std::to_string(H) + " " + std::string(dtype_name(dt)) + tag(*g);
        Tensor og = gpu_guarded(*g, dt, {T, H});
        g->hc_head(gpu_float(*g, x, {T, hc, H}, dt), gpu_copy(*g, fnc), gpu_copy(*g, bc), gpu_copy(*g, sc), p, og);
        expect_close(download(*g, og), values(oc), dt == DType::F32 ? kTolF32 : kTolBF16, what);
        expect_guards_intact(what);
      }
    }
  }
}

TEST_F(V4Ops, HcPost) {
  for (const HcCase& c : kHcCases) {
    const int64_t T = c.T, hc = c.hc, H = c.H;
    const std::vector<float> x = randn(T * hc * H), f = randn(T * H), post = randn(T * hc, 1.0f, false);
    const std::vector<float> comb = randn(T * hc * hc, 0.5f, false);
    Tensor oc = cpu_f32(std::vector<float>(T * hc * H), {T, hc, H});
    cpu_->hc_post(cpu_f32(x, {T, hc, H}), cpu_f32(f, {T, H}), cpu_f32(post, {T, hc}), cpu_f32(comb, {T, hc, hc}), oc);
    for (Backend* g : gpus()) {
      for (DType dt : {DType::F32, DType::BF16}) {
        const std::string what = "hc_post T " + std::to_string(T) + " hc " + std::to_string(hc) + " H " +
                                 std::to_string(H) + " " + std::string(dtype_name(dt)) + tag(*g);
        Tensor og = gpu_guarded(*g, dt, {T, hc, H});
        g->hc_post(gpu_float(*g, x, {T, hc, H}, dt), gpu_float(*g, f, {T, H}, dt),
                   gpu_float(*g, post, {T, hc}, DType::F32), gpu_float(*g, comb, {T, hc, hc}, DType::F32), og);
        expect_close(download(*g, og), values(oc), dt == DType::F32 ? 1e-6 : kTolBF16, what);
        expect_guards_intact(what);
      }
    }
  }
}

TEST_F(V4Ops, SqrtSoftplusRouting) {
  struct Case {
    int64_t T, E, k;
    bool bias, hash;
  };
  for (const Case& c : {Case{1, 256, 6, true, false}, Case{37, 256, 6, true, false}, Case{9, 72, 8, false, false},
                        Case{130, 33, 1, true, false}, Case{5, 256, 6, false, true}, Case{17, 40, 40, true, false}}) {
    std::vector<float> logits = randn(c.T * c.E, 2.0f, false);
    for (int64_t t = 0; t < c.T; ++t) {
      logits[t * c.E + randint(0, int(c.E) - 1)] = 25.0f + float(randint(0, 3));  // softplus' linear branch
      if (!c.bias && c.E > 3) logits[t * c.E + 3] = logits[t * c.E + 1] = 9.5f;  // an exact tie: index 1 wins
    }
    const std::vector<float> bias = randn(c.E, 0.3f, false);
    std::vector<int32_t> hash;
    for (int64_t t = 0; t < c.T; ++t) {
      std::vector<int32_t> e(static_cast<size_t>(c.E));
      std::iota(e.begin(), e.end(), 0);
      std::shuffle(e.begin(), e.end(), rng_);
      hash.insert(hash.end(), e.begin(), e.begin() + c.k);
    }
    Tensor lc = cpu_f32(logits, {c.T, c.E}), bc = c.bias ? cpu_f32(bias, {c.E}) : Tensor();
    Tensor hc = c.hash ? cpu_i32(hash, {c.T, c.k}) : Tensor();
    Tensor ic = cpu_i32(std::vector<int32_t>(c.T * c.k), {c.T, c.k}), wc = cpu_f32(std::vector<float>(c.T * c.k), {c.T, c.k});
    cpu_->moe_routing_sqrt_softplus(lc, bc, hc, static_cast<int>(c.k), 1.5f, ic, wc);
    std::vector<float> want_ids(ic.ptr<int32_t>(), ic.ptr<int32_t>() + c.T * c.k);
    for (Backend* g : gpus()) {
      const std::string what = "moe_routing_sqrt_softplus T " + std::to_string(c.T) + " E " + std::to_string(c.E) +
                               " k " + std::to_string(c.k) + (c.bias ? " bias" : "") + (c.hash ? " hash" : "") + tag(*g);
      Tensor ig = gpu_guarded(*g, DType::I32, {c.T, c.k}), wg = gpu_guarded(*g, DType::F32, {c.T, c.k});
      g->moe_routing_sqrt_softplus(gpu_copy(*g, lc), c.bias ? gpu_copy(*g, bc) : Tensor(),
                                   c.hash ? gpu_copy(*g, hc) : Tensor(), static_cast<int>(c.k), 1.5f, ig, wg);
      EXPECT_EQ(download(*g, ig), want_ids) << what << ", seed " << seed_;
      expect_close(download(*g, wg), values(wc), 1e-5, what + " weights");
      expect_guards_intact(what);
    }
  }
}

TEST_F(V4Ops, SiluMulClamped) {
  for (auto [T, I] : {std::pair<int64_t, int64_t>{1, 32}, {7, 33}, {64, 2048}}) {
    const std::vector<float> gu = randn(T * 2 * I, 8.0f);  // beyond the limit often
    for (float limit : {7.0f, std::numeric_limits<float>::infinity()}) {
      Tensor oc = cpu_f32(std::vector<float>(T * I), {T, I});
      cpu_->silu_mul_clamped(cpu_f32(gu, {T, 2 * I}), limit, oc);
      for (Backend* g : gpus()) {
        for (DType dt : {DType::F32, DType::BF16}) {
          const std::string what = "silu_mul_clamped T " + std::to_string(T) + " I " + std::to_string(I) +
                                   " limit " + std::to_string(limit) + " " + std::string(dtype_name(dt)) + tag(*g);
          Tensor in = gpu_float(*g, gu, {T, 2 * I}, dt);
          Tensor og = gpu_guarded(*g, dt, {T, I});
          g->silu_mul_clamped(in, limit, og);
          const std::vector<float> got = download(*g, og);
          expect_close(got, values(oc), dt == DType::F32 ? 1e-5 : kTolBF16, what);
          expect_guards_intact(what);
          if (std::isinf(limit)) {  // no clamp: silu_mul's bits
            Tensor plain = gpu_poisoned(*g, dt, {T, I});
            g->silu_mul(in, plain);
            expect_bits(got, download(*g, plain), what + " vs silu_mul");
          }
        }
      }
    }
  }
}

TEST_F(V4Ops, SinkAttention) {
  struct Case {
    int64_t T, heads, D, S, N;
  };
  for (const Case& c : {Case{1, 64, 512, 200, 140}, Case{7, 3, 40, 50, 33}, Case{4, 5, 72, 9, 20},
                        Case{12, 16, 128, 700, 640}}) {
    const std::vector<float> q = randn(c.T * c.heads * c.D), kv = randn(c.S * c.D);
    const std::vector<float> sinks = randn(c.heads, 2.0f, false);
    std::vector<int32_t> idx(static_cast<size_t>(c.T * c.N));
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t n = 0; n < c.N; ++n) idx[t * c.N + n] = randint(0, 5) == 0 ? -1 : randint(0, int(c.S) - 1);
    if (c.T > 2) std::fill(idx.begin() + c.N, idx.begin() + 2 * c.N, -1);  // query 1 has no row: 0
    const float scale = 1.0f / std::sqrt(float(c.D));
    Tensor oc = cpu_f32(std::vector<float>(c.T * c.heads * c.D), {c.T, c.heads, c.D});
    Tensor sc = cpu_f32(sinks, {c.heads});
    cpu_->sink_attention(cpu_f32(q, {c.T, c.heads, c.D}), cpu_f32(kv, {c.S, c.D}), cpu_i32(idx, {c.T, c.N}), sc,
                         scale, oc);
    for (Backend* g : gpus()) {
      for (DType dt : {DType::F32, DType::BF16}) {
        const std::string what = "sink_attention T " + std::to_string(c.T) + " heads " + std::to_string(c.heads) +
                                 " D " + std::to_string(c.D) + " N " + std::to_string(c.N) + " " + std::string(dtype_name(dt)) + tag(*g);
        Tensor kvg = gpu_float(*g, kv, {c.S, c.D}, dt), sg = gpu_copy(*g, sc);
        Tensor og = gpu_guarded(*g, dt, {c.T, c.heads, c.D});
        g->sink_attention(gpu_float(*g, q, {c.T, c.heads, c.D}, dt), kvg, gpu_copy(*g, cpu_i32(idx, {c.T, c.N})), sg,
                          scale, og);
        const std::vector<float> got = download(*g, og);
        expect_close(got, values(oc), dt == DType::F32 ? kTolF32 : kTolBF16, what);
        expect_guards_intact(what);
        // The last query alone with 7 more empty slots: the same bits.
        const int64_t N2 = c.N + 7;
        std::vector<int32_t> last(idx.end() - c.N, idx.end());
        last.resize(static_cast<size_t>(N2), -1);
        Tensor o1 = gpu_poisoned(*g, dt, {1, c.heads, c.D});
        g->sink_attention(gpu_float(*g, slice(q, c.T - 1, c.T, c.heads * c.D), {1, c.heads, c.D}, dt), kvg,
                          gpu_copy(*g, cpu_i32(last, {1, N2})), sg, scale, o1);
        expect_bits(download(*g, o1), slice(got, c.T - 1, c.T, c.heads * c.D), what + " alone, padded, vs in batch");
      }
    }
  }
}

TEST_F(V4Ops, CompressorPool) {
  struct Case {
    int64_t T, D;
    int ratio;
    bool overlap, prior;
  };
  for (const Case& c : {Case{16, 64, 4, true, false}, Case{19, 33, 4, true, true}, Case{4, 128, 4, true, true},
                        Case{24, 40, 8, false, false}, Case{256, 72, 128, false, false}, Case{5, 16, 4, true, false},
                        Case{130, 128, 4, true, true}}) {
    const int64_t C = c.overlap ? 2 * c.D : c.D, r = c.ratio, n = c.T / r;
    const std::vector<float> kv = randn(c.T * C), gate = randn(c.T * C, 2.0f), ape = randn(r * C, 1.0f, false);
    const std::vector<float> pkv = randn(r * c.D, 1.0f, false), pg = randn(r * c.D, 2.0f, false);
    Tensor apec = cpu_f32(ape, {r, C});
    Tensor pkc = c.prior ? cpu_f32(pkv, {r, c.D}) : Tensor(), pgc = c.prior ? cpu_f32(pg, {r, c.D}) : Tensor();
    Tensor oc = cpu_f32(std::vector<float>(std::max<int64_t>(n, 0) * c.D), {n, c.D});
    cpu_->compressor_pool(cpu_f32(kv, {c.T, C}), cpu_f32(gate, {c.T, C}), apec, c.ratio, c.overlap, pkc, pgc, oc);
    for (Backend* g : gpus()) {
      for (DType dt : {DType::F32, DType::BF16}) {
        const std::string what = "compressor_pool T " + std::to_string(c.T) + " D " + std::to_string(c.D) + " ratio " +
                                 std::to_string(c.ratio) + (c.overlap ? " overlap" : "") + (c.prior ? " prior" : "") +
                                 " " + std::string(dtype_name(dt)) + tag(*g);
        Tensor og = gpu_guarded(*g, dt, {n, c.D});
        g->compressor_pool(gpu_float(*g, kv, {c.T, C}, dt), gpu_float(*g, gate, {c.T, C}, dt), gpu_copy(*g, apec),
                           c.ratio, c.overlap, c.prior ? gpu_copy(*g, pkc) : Tensor(),
                           c.prior ? gpu_copy(*g, pgc) : Tensor(), og);
        expect_close(download(*g, og), values(oc), dt == DType::F32 ? kTolF32 : kTolBF16, what);
        expect_guards_intact(what);
      }
    }
  }
}

// kv and gate as columns of wider rows (the model pools them straight from gathered pending
// rows [kv | gate | ...]): the same results as contiguous inputs.
TEST_F(V4Ops, CompressorPoolReadsColumnsOfWiderRows) {
  for (auto [T, D, ratio, overlap] : {std::tuple<int64_t, int64_t, int, bool>{20, 33, 4, true}, {24, 40, 8, false}}) {
    const int64_t C = overlap ? 2 * D : D, W = 2 * C + 5, r = ratio, n = T / r;
    const std::vector<float> rows = randn(T * W, 1.5f), ape = randn(r * C, 1.0f, false);
    std::vector<float> kv, gate;
    for (int64_t t = 0; t < T; ++t) {
      kv.insert(kv.end(), rows.begin() + t * W + 1, rows.begin() + t * W + 1 + C);
      gate.insert(gate.end(), rows.begin() + t * W + C + 3, rows.begin() + t * W + 2 * C + 3);
    }
    Tensor apec = cpu_f32(ape, {r, C});
    Tensor oc = cpu_f32(std::vector<float>(n * D), {n, D});
    cpu_->compressor_pool(cpu_f32(kv, {T, C}), cpu_f32(gate, {T, C}), apec, ratio, overlap, Tensor(), Tensor(), oc);
    auto cols = [](Tensor t, int64_t c0, int64_t width) {
      t.data = static_cast<char*>(t.data) + c0 * static_cast<int64_t>(dtype_size(t.dtype));
      t.shape[1] = width;
      return t;
    };
    Tensor strided_cpu = cpu_f32(rows, {T, W});
    Tensor oc2 = cpu_f32(std::vector<float>(n * D), {n, D});
    cpu_->compressor_pool(cols(strided_cpu, 1, C), cols(strided_cpu, C + 3, C), apec, ratio, overlap, Tensor(),
                          Tensor(), oc2);
    expect_bits(values(oc2), values(oc), "CPU compressor_pool on columns");
    for (Backend* g : gpus()) {
      const std::string what = "compressor_pool on columns T " + std::to_string(T) + tag(*g);
      Tensor rg = gpu_float(*g, rows, {T, W}, DType::BF16);
      Tensor og = gpu_guarded(*g, DType::F32, {n, D});
      g->compressor_pool(cols(rg, 1, C), cols(rg, C + 3, C), gpu_copy(*g, apec), ratio, overlap, Tensor(), Tensor(), og);
      expect_close(download(*g, og), values(oc), kTolF32, what);
      expect_guards_intact(what);
    }
  }
}

// Integer-valued q, keys and weights with power-of-two scales (not the model's 1/sqrt(d) and
// 1/sqrt(heads), which round differently in fp32 and double) make every score exact on both
// sides, with many exact ties (and zeros from the ReLU): the indices must then agree exactly,
// which checks the order (best first, ties to the lower entry) and the visibility rule.
TEST_F(V4Ops, IndexerTopkV4) {
  struct Case {
    int64_t T, heads, d, S, k;
    int ratio;
  };
  for (const Case& c : {Case{1, 16, 64, 10, 512, 4}, Case{6, 16, 64, 700, 512, 4}, Case{9, 4, 16, 50, 7, 4},
                        Case{5, 64, 128, 1100, 512, 4}, Case{3, 16, 64, 3, 8, 4}, Case{4, 16, 64, 33, 16, 1}}) {
    auto ints = [&](int64_t n, int lo, int hi) {
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = float(randint(lo, hi));
      return v;
    };
    const std::vector<float> q = ints(c.T * c.heads * c.d, -2, 2), keys = ints(c.S * c.d, -2, 2);
    const std::vector<float> w = ints(c.T * c.heads, -2, 3);
    std::vector<int32_t> pos(static_cast<size_t>(c.T));
    for (int32_t& p : pos) p = randint(0, int(c.S * c.ratio) + 5);
    pos[0] = int32_t(c.S * c.ratio) + 3;  // sees every key
    const float ss = 1.0f / 16, ws = 1.0f / 8;  // powers of two: every product and sum exact
    Tensor oc = cpu_i32(std::vector<int32_t>(c.T * c.k), {c.T, c.k});
    cpu_->indexer_topk(cpu_f32(q, {c.T, c.heads, c.d}), cpu_f32(keys, {c.S, c.d}), cpu_f32(w, {c.T, c.heads}),
                       cpu_i32(pos, {c.T}), c.ratio, ss, ws, oc);
    std::vector<float> want(oc.ptr<int32_t>(), oc.ptr<int32_t>() + c.T * c.k);
    for (Backend* g : gpus()) {
      for (DType dt : {DType::F32, DType::BF16}) {
        const std::string what = "indexer_topk (V4) T " + std::to_string(c.T) + " heads " + std::to_string(c.heads) +
                                 " d " + std::to_string(c.d) + " S " + std::to_string(c.S) + " k " +
                                 std::to_string(c.k) + " " + std::string(dtype_name(dt)) + tag(*g);
        Tensor og = gpu_guarded(*g, DType::I32, {c.T, c.k});
        g->indexer_topk(gpu_float(*g, q, {c.T, c.heads, c.d}, dt), gpu_float(*g, keys, {c.S, c.d}, dt),
                        gpu_float(*g, w, {c.T, c.heads}, DType::F32), gpu_copy(*g, cpu_i32(pos, {c.T})), c.ratio, ss,
                        ws, og);
        EXPECT_EQ(download(*g, og), want) << what << ", seed " << seed_;
        expect_guards_intact(what);
      }
    }
  }
}

// A decode step's addressing (v4_decode_rows, every rule) from random context lengths and
// block tables with freed (-1) and out-of-range entries: CUDA writes the CPU's integers, slots
// and index columns of a wider row (a strided view) alike.
TEST_F(V4Ops, V4DecodeRows) {
  using Rule = Backend::V4RowRule;
  using Kind = Rule::Kind;
  const int64_t S = 37, width = 9, bs = 16, nblocks = 50;
  std::vector<int32_t> table(static_cast<size_t>(S * width)), keys(static_cast<size_t>(S));
  for (int32_t& b : table) b = randint(-1, int(nblocks) + 2);
  for (int32_t& e : keys) e = randint(0, int(width * bs) + 3);
  keys[0] = 0;
  keys[1] = 128;
  struct Case {
    Kind kind;
    int ratio;
    bool overlap;
    int64_t n;
  };
  for (const Case& c : {Case{Kind::Window, 1, false, 24}, Case{Kind::Visible, 4, false, 40}, Case{Kind::Group, 4, true, 8},
                        Case{Kind::Group, 8, false, 8}, Case{Kind::Completed, 4, false, 1},
                        Case{Kind::GroupStart, 8, false, 1}, Case{Kind::Listed, 1, false, 11},
                        Case{Kind::TableRows, 1, false, 6}}) {
    Rule r;
    r.kind = c.kind;
    r.ratio = c.ratio;
    r.window = 24;
    r.overlap = c.overlap;
    r.fill = c.kind == Kind::Visible ? 0 : -1;
    r.block_size = bs;
    r.num_blocks = nblocks;
    r.index_base = 1000;
    std::vector<int32_t> listed(static_cast<size_t>(S * c.n)), tid(static_cast<size_t>(300 * c.n)), tok(keys);
    for (int32_t& x : listed) x = randint(-1, int(width * bs) + 5);
    for (int32_t& x : tid) x = randint(0, 255);
    for (int32_t& x : tok) x = randint(0, 299);
    const bool rows_table = c.kind == Kind::TableRows;
    Tensor kc = cpu_i32(rows_table ? tok : keys, {S}), tc = rows_table ? cpu_i32(tid, {300, c.n}) : cpu_i32(table, {S, width});
    Tensor lc = c.kind == Kind::Listed ? cpu_i32(listed, {S, c.n}) : Tensor();
    Tensor sc = cpu_i32(std::vector<int32_t>(static_cast<size_t>(S * c.n)), {S, c.n});
    Tensor ic = cpu_i32(std::vector<int32_t>(static_cast<size_t>(S * (c.n + 3))), {S, c.n + 3});
    Tensor icv = ic;
    icv.shape[1] = c.n;
    cpu_->v4_decode_rows(kc, lc, tc, r, sc, icv);
    const std::vector<float> want_s(sc.ptr<int32_t>(), sc.ptr<int32_t>() + S * c.n);
    const std::vector<float> want_i(ic.ptr<int32_t>(), ic.ptr<int32_t>() + S * (c.n + 3));
    for (Backend* g : gpus()) {
      const std::string what = "v4_decode_rows kind " + std::to_string(static_cast<int>(c.kind)) + tag(*g);
      Tensor sg = gpu_guarded(*g, DType::I32, {S, c.n}), ig = gpu_copy(*g, ic);
      Tensor igv = ig;
      igv.shape[1] = c.n;
      g->v4_decode_rows(gpu_copy(*g, kc), c.kind == Kind::Listed ? gpu_copy(*g, lc) : Tensor(), gpu_copy(*g, tc), r, sg,
                        igv);
      EXPECT_EQ(download(*g, sg), want_s) << what << ", seed " << seed_;
      EXPECT_EQ(download(*g, ig), want_i) << what << " index, seed " << seed_;
      expect_guards_intact(what);
    }
  }
}

// compressor_pool_rows reads listed rows of a wider table (columns of a paged cache's rows,
// -1 slots empty): CUDA against the CPU, and against its own compressor_pool over the same rows
// laid out consecutively (the decode path must give the host-built path's bits).
TEST_F(V4Ops, CompressorPoolRows) {
  for (auto [D, ratio, overlap] : {std::tuple<int64_t, int, bool>{33, 4, true}, {40, 8, false}, {128, 128, false}}) {
    const int64_t C = overlap ? 2 * D : D, W = 2 * C + 5, r = ratio, R = 3 * r + 7, slots = overlap ? 2 * r : r;
    const std::vector<float> rows = randn(R * W, 1.5f), ape = randn(r * C, 1.0f, false);
    // Window 0: a first group (no previous one); window 1: two groups; window 2: nothing to pool.
    std::vector<int32_t> perm(static_cast<size_t>(R));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng_);
    std::vector<int32_t> ids(static_cast<size_t>(3 * slots), -1), order;
    for (int64_t j = 0; j < r; ++j) ids[static_cast<size_t>(slots - r + j)] = perm[static_cast<size_t>((overlap ? r : 0) + j)];
    for (int64_t j = 0; j < slots; ++j) ids[static_cast<size_t>(slots + j)] = perm[static_cast<size_t>(r + j)];
    for (int64_t j = 0; j < 2 * r; ++j) order.push_back(perm[static_cast<size_t>(overlap ? r + j : j)]);
    Tensor apec = cpu_f32(ape, {r, C});
    auto cols = [](Tensor t, int64_t c0, int64_t width) {
      t.data = static_cast<char*>(t.data) + c0 * static_cast<int64_t>(dtype_size(t.dtype));
      t.shape[1] = width;
      return t;
    };
    Tensor rc = cpu_f32(rows, {R, W}), oc = cpu_f32(std::vector<float>(static_cast<size_t>(3 * D)), {3, D});
    Tensor idc = cpu_i32(ids, {3, slots});
    cpu_->compressor_pool_rows(cols(rc, 1, C), cols(rc, C + 3, C), apec, idc, ratio, overlap, oc);
    for (Backend* g : gpus()) {
      const std::string what = "compressor_pool_rows D " + std::to_string(D) + " ratio " + std::to_string(ratio) + tag(*g);
      Tensor rg = gpu_float(*g, rows, {R, W}, DType::BF16), og = gpu_guarded(*g, DType::F32, {3, D});
      g->compressor_pool_rows(cols(rg, 1, C), cols(rg, C + 3, C), gpu_copy(*g, apec), gpu_copy(*g, idc), ratio, overlap,
                              og);
      const std::vector<float> got = download(*g, og);
      expect_close(got, values(oc), kTolF32, what);
      // The same rows consecutively through compressor_pool: windows 0 and 1 bit for bit.
      std::vector<float> seq;
      for (int32_t row : order) seq.insert(seq.end(), rows.begin() + row * W, rows.begin() + (row + 1) * W);
      Tensor sg = gpu_float(*g, seq, {2 * r, W}, DType::BF16), pg = gpu_guarded(*g, DType::F32, {2, D});
      g->compressor_pool(cols(sg, 1, C), cols(sg, C + 3, C), gpu_copy(*g, apec), ratio, overlap, Tensor(), Tensor(), pg);
      const std::vector<float> ref = download(*g, pg);
      expect_bits(slice(got, 0, 2, D), ref, what + " vs compressor_pool");
      expect_guards_intact(what);
    }
  }
}

// The indexer with each query's own keys ([T, S, d], a decode step's sequences): CUDA against
// the CPU with exact integer scores, as IndexerTopkV4.
TEST_F(V4Ops, IndexerTopkV4PerQueryKeys) {
  const int64_t T = 7, heads = 16, d = 64, S = 300, k = 64;
  auto ints = [&](int64_t n, int lo, int hi) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = float(randint(lo, hi));
    return v;
  };
  const std::vector<float> q = ints(T * heads * d, -2, 2), keys = ints(T * S * d, -2, 2), w = ints(T * heads, -2, 3);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int32_t& p : pos) p = randint(0, int(S * 4) + 5);
  const float ss = 1.0f / 16, ws = 1.0f / 8;
  Tensor oc = cpu_i32(std::vector<int32_t>(T * k), {T, k});
  cpu_->indexer_topk(cpu_f32(q, {T, heads, d}), cpu_f32(keys, {T, S, d}), cpu_f32(w, {T, heads}), cpu_i32(pos, {T}), 4,
                     ss, ws, oc);
  std::vector<float> want(oc.ptr<int32_t>(), oc.ptr<int32_t>() + T * k);
  for (Backend* g : gpus()) {
    const std::string what = "indexer_topk (V4, per-query keys)" + tag(*g);
    Tensor og = gpu_guarded(*g, DType::I32, {T, k});
    g->indexer_topk(gpu_float(*g, q, {T, heads, d}, DType::BF16), gpu_float(*g, keys, {T, S, d}, DType::BF16),
                    gpu_float(*g, w, {T, heads}, DType::F32), gpu_copy(*g, cpu_i32(pos, {T})), 4, ss, ws, og);
    EXPECT_EQ(download(*g, og), want) << what << ", seed " << seed_;
    expect_guards_intact(what);
  }
}

// Routed experts kept packed as DeepSeek-V4 ships them (FP4 e2m1, two per byte, E8M0 scale per
// 32 along K): CUDA reads the bytes, the reference dequantizes them first. F32 outputs; the
// clamp on and off. The batch-invariant configuration (and one token anywhere) keeps the CUDA-core
// kernel of moe_fp4.cu, F32 throughout: within F32 rounding, and a row alone equals itself in the
// batch. From 2 tokens the default configuration takes the tensor-core grouped GEMM of
// moe_qgemm.cu, whose gate | up outputs and activations are BF16 as for BF16 / FP8 experts: within
// the BF16 tolerance (QuantizedExpertsMatchCpu in test_ops_attention_moe.cpp tests it further).
TEST_F(V4Ops, MoeExpertsFp4) {
  struct Case {
    int64_t T, H, I, E, K;
  };
  for (const Case& c : {Case{1, 64, 32, 8, 3}, Case{5, 256, 96, 16, 6}, Case{40, 128, 64, 8, 2}}) {
    auto packed = [&](int64_t n, int64_t k, std::vector<Tensor>* cpu_side) {
      std::vector<uint8_t> w(static_cast<size_t>(n * k / 2)), sc(static_cast<size_t>(n * k / 32));
      for (uint8_t& b : w) b = static_cast<uint8_t>(randint(0, 255));
      for (uint8_t& b : sc) b = static_cast<uint8_t>(127 - randint(3, 6));  // 2^-3 .. 2^-6
      cpu_side->push_back(cpu_raw(DType::U8, w.data(), {n, k / 2}));
      cpu_side->push_back(cpu_raw(DType::F8_E8M0, sc.data(), {n, k / 32}));
    };
    std::vector<ExpertWeights> cpu_experts;
    for (int64_t e = 0; e < c.E; ++e) {
      std::vector<Tensor> t;
      packed(c.I, c.H, &t);
      packed(c.I, c.H, &t);
      packed(c.H, c.I, &t);
      ExpertWeights ew;
      ew.gate.w = t[0], ew.gate.scale_inv = t[1], ew.up.w = t[2], ew.up.scale_inv = t[3];
      ew.down.w = t[4], ew.down.scale_inv = t[5];
      for (Weight* w : {&ew.gate, &ew.up, &ew.down}) w->block_n = 1, w->block_k = 32;
      cpu_experts.push_back(ew);
    }
    const std::vector<float> x = randn(c.T * c.H), tw = randn(c.T * c.K, 0.5f, false);
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < c.T; ++t) {
      std::vector<int32_t> e(static_cast<size_t>(c.E));
      std::iota(e.begin(), e.end(), 0);
      std::shuffle(e.begin(), e.end(), rng_);
      ids.insert(ids.end(), e.begin(), e.begin() + c.K);
    }
    for (float limit : {0.75f, std::numeric_limits<float>::infinity()}) {
      Tensor oc = cpu_f32(std::vector<float>(c.T * c.H), {c.T, c.H});
      cpu_->moe_experts_clamped(cpu_f32(x, {c.T, c.H}), cpu_i32(ids, {c.T, c.K}), cpu_f32(tw, {c.T, c.K}), cpu_experts,
                                limit, oc);
      for (Backend* g : gpus()) {
        const std::string what = "moe_experts_clamped FP4 T " + std::to_string(c.T) + " H " + std::to_string(c.H) +
                                 " I " + std::to_string(c.I) + " limit " + std::to_string(limit) + tag(*g);
        std::vector<ExpertWeights> ge = cpu_experts;
        for (ExpertWeights& ew : ge)
          for (Weight* w : {&ew.gate, &ew.up, &ew.down}) {
            w->w = gpu_copy(*g, w->w);
            w->scale_inv = gpu_copy(*g, w->scale_inv);
          }
        auto run = [&](int64_t t0, int64_t t1) {
          const int64_t n = t1 - t0;
          Tensor og = gpu_guarded(*g, DType::F32, {n, c.H});
          g->moe_experts_clamped(gpu_float(*g, slice(x, t0, t1, c.H), {n, c.H}, DType::BF16),
                                 gpu_copy(*g, cpu_i32(std::vector<int32_t>(ids.begin() + t0 * c.K, ids.begin() + t1 * c.K),
                                                      {n, c.K})),
                                 gpu_float(*g, slice(tw, t0, t1, c.K), {n, c.K}, DType::F32), ge, limit, og);
          std::vector<float> v = download(*g, og);
          expect_guards_intact(what);
          return v;
        };
        const std::vector<float> got = run(0, c.T);
        const bool cuda_cores = g == gpu_inv_.get() || c.T == 1;
        expect_close(got, values(oc), cuda_cores ? kTolF32 : kTolBF16, what);
        if (g == gpu_inv_.get())
          expect_bits(run(c.T - 1, c.T), slice(got, c.T - 1, c.T, c.H), what + " last row alone vs in batch");
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer::ops_test
