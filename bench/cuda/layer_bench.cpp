// deepinfer_cuda_bench: times the op sequence of one DeepSeek-V3 forward step of the bench
// model (../shared/models/bench-v3-7b: 12 layers, hidden 2048, 16 heads, q_lora 1536,
// kv_lora 512, 64 experts top-6 + 2 shared (I 1408), dense layer 0 (I 11264), vocab 129280)
// through the Backend op table only, with random weights made on the device
// (fill_random). It mirrors model/layers/mla.cpp's absorbed (decode) and direct (prefill)
// forms, so the figures stand even before the model and `deepinfer bench` run on CUDA.
// Differences from the real model are listed in bench/NOTES.md (fixed context per run,
// random routing from random weights, no k_rope broadcast copy).
//
// Usage: deepinfer_cuda_bench [--fp8] [--graphs] [--decode-only | --prefill-only]
//                             [--profile | --profile-prefill] [--unfused-mla] [--prefill-context]
//                             [--no-side] [--rope-inline] [--attn-chunk 32|64] [--pipe-tokens N]
//                             [--dense-pipe-rows F,B] [--no-pdl]
//                             [--ncu-steps B1,B2,...] [--prefill-lens L1,L2,...]
//                             [--no-qgemm] [--no-fp8-cutlass] [--moe-tile 64|256]
//                             [--decode-batches B1,B2,...] [--decode-ctx N] [--ablate] [--out FILE.jsonl]
// Prints one line per figure; appends JSONL records with the raw quantities.
// --profile: eager decode at batch 1 and 8 with CUDA events around every op, summed by op
// site over a few steps (us per step and % of the summed step), then exits; --profile-prefill:
// the same for prefill of 512 and 4096 tokens (or --prefill-lens L1,L2,...: also the timed
// prefill steps' lengths).
// --ncu-steps: one eager decode step per listed batch (context 576) between
// cudaProfilerStart/Stop, after an unprofiled warm-up step, then exits: run it under
// `ncu --profile-from-start off` for every kernel's time and DRAM bytes.
// --unfused-mla: rms_norm x2 + rope x2 + kv_store + copy instead of rms_norm_pair and
// mla_rope_store (A/B of the fused MLA ops).
// --no-side: the shared experts in line after the routed ones (A/B of the side line).
// --rope-inline: at decode, mla_rope_store in line before gemm_heads uk (the A/B of
// model/layers/mla.cpp's order, which puts it on the side line beside uk, joined before the paged
// attention; attnuv19 / session 16). --attn-chunk: the paged attention's chunk for every launch
// (CudaOptions::attn_chunk; default by shape: work items and the context bound, mla_attention.cu).
// --pipe-tokens N: MoE steps of up to N tokens on the pipeline kernel (CudaOptions::
// pipe_max_tokens, default 64; A/B).
// --dense-pipe-rows F,B: dense GEMMs of at most F (FP8) / B (BF16) rows on the pipeline kernel
// (CudaOptions::pipe_dense_fp8_rows / pipe_dense_bf16_rows, default 32 / 8; 0: FP8 on the stream
// kernel, BF16 on cuBLASLt); --no-pdl: every kernel as a plain launch (CudaOptions::pdl false: those
// GEMMs (dec18) and, since pdl17, the step's other own kernels, launched as programmatic dependents).
// --decode-batches: the decode batches timed (default 1,8,32,64); --decode-ctx N: their context
// (default 576; the ablation and --ncu-steps keep 576).
// --ablate: per decode batch, the graph step with each op site (and groups of them) left out
// against the whole step, 2 interleaved rounds (where the batch-1 step's time goes, PDL and
// overlap included; the outputs are garbage), then exits.
// --prefill-context: also a 4096-token chunk after 4096 cached positions, in the direct form
// over the gathered context (kv_gather, kv_b, mla_attention_prefill_context) and in the
// absorbed one (mla_attention_paged): model/layers/mla.cpp picks the first by FLOPs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <map>
#include <set>

#include "backend/backend.h"
#include "core/settings.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "core/error.h"

using namespace deepinfer;

namespace {

// Bench model shape (bench-v3-7b/config.json).
constexpr int64_t kLayers = 12, kHidden = 2048, kHeads = 16, kQLora = 1536, kKvLora = 512,
                  kRope = 64, kNope = 128, kV = 128, kQk = kNope + kRope, kRow = kKvLora + kRope,
                  kExperts = 64, kTopK = 6, kMoeI = 1408, kSharedI = 2 * 1408, kDenseI = 11264,
                  kVocab = 129280, kBlock = 64;

// CUDA events around each op of an eager step (--profile): pairs recorded on the backend's
// stream, read after the step and summed per op site.
struct OpProfiler {
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> events;  // 2 per op
  std::vector<const char*> names;
  size_t used = 0;
  std::map<std::string, std::pair<double, int>> total_us;  // site -> (us, calls)
  double step_us = 0;
  OpProfiler() = default;
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;
  void reset() {
    total_us.clear();
    step_us = 0;
  }
  ~OpProfiler() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
  void begin(const char* name) {
    if (used + 2 > events.size()) {
      for (int i = 0; i < 64; ++i) {
        cudaEvent_t e;
        DI_CHECK(cudaEventCreate(&e) == cudaSuccess, "layer_bench: cudaEventCreate failed");
        events.push_back(e);
      }
    }
    names.push_back(name);
    cudaEventRecord(events[used++], stream);
  }
  void end() { cudaEventRecord(events[used++], stream); }
  // Adds the recorded step to the totals (synchronizes).
  void collect() {
    DI_CHECK(cudaEventSynchronize(events[used - 1]) == cudaSuccess, "layer_bench: event sync failed");
    for (size_t i = 0; i < names.size(); ++i) {
      float ms = 0;
      cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]);
      auto& t = total_us[names[i]];
      t.first += ms * 1e3;
      t.second += 1;
    }
    float all = 0;
    cudaEventElapsedTime(&all, events[0], events[used - 1]);
    step_us += all * 1e3;
    names.clear();
    used = 0;
  }
};

struct Bench {
  Bench(Backend& backend, bool use_fp8) : b(backend), fp8(use_fp8) {}
  Backend& b;
  bool fp8;
  bool fused_mla = true;
  bool side = true;            // shared experts on the backend's side line (--no-side: in line)
  bool rope_side = true;       // decode's rope + store on the side line beside uk (--rope-inline: off)
  OpProfiler* prof = nullptr;  // set: time every op (eager only)
  std::set<std::string> skip;  // op sites left out of forward (--ablate); "side": the side line
  uint64_t seed = 1;
  std::vector<DeviceBuffer> keep;
  int64_t weight_bytes = 0;

  Tensor buf(DType dt, std::vector<int64_t> dims) {
    keep.push_back(b.alloc(dt, dims));
    return keep.back().tensor();
  }
  Tensor rnd(DType dt, std::vector<int64_t> dims, float scale) {
    Tensor t = buf(dt, dims);
    b.fill_random(t, seed++, scale);
    return t;
  }
  Weight linear(int64_t n, int64_t k, bool quantizable = true) {
    Weight w;
    const float bound = std::sqrt(3.0f / float(k));
    if (fp8 && quantizable) {
      w.w = rnd(DType::F8_E4M3, {n, k}, 448.0f);
      w.scale_inv = rnd(DType::F32, {(n + 127) / 128, (k + 127) / 128}, bound / 448.0f);
      weight_bytes += n * k + w.scale_inv.num_bytes();
    } else {
      w.w = rnd(DType::BF16, {n, k}, bound);
      weight_bytes += n * k * 2;
    }
    return w;
  }
  Tensor norm(int64_t n) {
    weight_bytes += n * 2;
    return rnd(DType::BF16, {n}, 1.0f);
  }

  struct Layer {
    Tensor in_norm, post_norm, q_a_norm, kv_a_norm;
    Weight q_a, q_b, kv_a, o;
    Tensor uk_all, uv_all;  // W_UK^T [heads, kv_lora, nope], W_UV [heads, v, kv_lora]
    Weight kv_b;                 // [heads * (nope + v), kv_lora] (prefill form)
    Weight dense_gate, dense_up, dense_down;
    Weight gate;  // router [E, H]
    Tensor bias;
    std::vector<ExpertWeights> experts;
    Weight sh_gate, sh_up, sh_down;
    bool moe = false;
  };
  std::vector<Layer> layers;
  Tensor embed, final_norm, cos_sin;
  Weight lm_head;

  void build() {
    embed = rnd(DType::BF16, {kVocab, kHidden}, 1.0f);
    weight_bytes += kVocab * kHidden * 2;
    for (int64_t l = 0; l < kLayers; ++l) {
      Layer L;
      L.in_norm = norm(kHidden);
      L.post_norm = norm(kHidden);
      L.q_a_norm = norm(kQLora);
      L.kv_a_norm = norm(kKvLora);
      L.q_a = linear(kQLora, kHidden);
      L.q_b = linear(kHeads * kQk, kQLora);
      L.kv_a = linear(kRow, kHidden);
      L.o = linear(kHidden, kHeads * kV);
      L.kv_b = linear(kHeads * (kNope + kV), kKvLora);
      // Absorbed copies (bf16, made at load), all heads stacked as the model keeps them.
      L.uk_all = rnd(DType::BF16, {kHeads, kKvLora, kNope}, 1.0f / std::sqrt(float(kNope)));
      L.uv_all = rnd(DType::BF16, {kHeads, kV, kKvLora}, 1.0f / std::sqrt(float(kKvLora)));
      weight_bytes += 2 * kHeads * kKvLora * (kNope + kV);
      L.moe = l >= 1;
      if (!L.moe) {
        L.dense_gate = linear(kDenseI, kHidden);
        L.dense_up = linear(kDenseI, kHidden);
        L.dense_down = linear(kHidden, kDenseI);
      } else {
        L.gate = linear(kExperts, kHidden, false);
        L.bias = rnd(DType::F32, {kExperts}, 0.01f);
        for (int64_t e = 0; e < kExperts; ++e)
          L.experts.push_back({linear(kMoeI, kHidden), linear(kMoeI, kHidden), linear(kHidden, kMoeI)});
        L.sh_gate = linear(kSharedI, kHidden);
        L.sh_up = linear(kSharedI, kHidden);
        L.sh_down = linear(kHidden, kSharedI);
      }
      layers.push_back(std::move(L));
    }
    final_norm = norm(kHidden);
    lm_head = linear(kVocab, kHidden, false);
    cos_sin = rnd(DType::F32, {8192, kRope}, 1.0f);
    b.synchronize();
  }
};

Tensor cols(const Tensor& t, int64_t rows, int64_t ncols, int64_t offset = 0) {
  Tensor v = t;  // [rows, ncols] view of a wider row-major buffer
  v.ndim = 2;
  v.shape[0] = rows;
  v.shape[1] = ncols;
  v.stride[0] = t.stride[0];
  v.stride[1] = 1;
  v.data = static_cast<char*>(t.data) + offset * static_cast<int64_t>(dtype_size(t.dtype));
  return v;
}
Tensor heads3(const Tensor& t, int64_t rows, int64_t heads, int64_t head_stride, int64_t dim,
              int64_t offset = 0) {
  Tensor v = cols(t, rows, dim, offset);
  v.ndim = 3;
  v.shape[1] = heads;
  v.shape[2] = dim;
  v.stride[1] = head_stride;
  v.stride[2] = 1;
  return v;
}

struct Step {
  int64_t T = 0;
  bool direct = false;  // prefill (direct MLA) vs decode (absorbed over the cache)
  bool context = false;  // not direct: the direct form over the gathered context (ctx_* buffers)
  Tensor ctx_rows, ctx_kv_b, ctx_k;
  Tensor ids, positions, x, residual, h1, q_a, q, kv_a, kv_b, k, q_abs, latent, attn, o, gate_up,
      act, logits_router, topk_ids, topk_w, moe_out, shared_out, logits, next_ids, final_h;
  std::vector<Tensor> caches;
  PagedKV kv;
};

// The side placement applies to the absorbed decode form (not direct prefill, not the gathered
// context) of at most 16 tokens, as model/layers/mla.cpp places it (kMlaRopeSideMaxTokens).
bool rope_side(const Bench& B, const Step& s) { return B.rope_side && !s.direct && !s.context && s.T <= 16; }

// OP(site, call): the call, between two events when profiling.
// Sites in B.skip are left out (--ablate: the step's time without them).
#define OP(site, ...)                      \
  do {                                     \
    if (!B.skip.count(site)) {             \
      if (B.prof) B.prof->begin(site);     \
      __VA_ARGS__;                         \
      if (B.prof) B.prof->end();           \
    }                                      \
  } while (0)

void forward(Bench& B, Step& s) {
  Backend& b = B.b;
  const int64_t T = s.T;
  OP("embedding", b.embedding(s.ids, B.embed, s.residual));
  const float scale = 1.0f / std::sqrt(float(kQk));
  for (int64_t l = 0; l < kLayers; ++l) {
    Bench::Layer& L = B.layers[l];
    if (l == 0)
      OP("norm in", b.rms_norm(s.residual, L.in_norm, 1e-6f, s.x));
    else
      OP("norm in", b.add_rms_norm(s.residual, s.o, L.in_norm, 1e-6f, s.x));
    OP("gemm q_a|kv_a", b.gemm_pair(s.x, L.q_a, L.kv_a, s.q_a, s.kv_a));
    Tensor c_kv = cols(s.kv_a, T, kKvLora);
    Tensor q3 = heads3(s.q, T, kHeads, kQk, kQk);
    Tensor qr = heads3(s.q_abs, T, kHeads, kRow, kRope, kKvLora);
    s.kv.cache = s.caches[l];
    if (B.fused_mla) {
      OP("norm q_a+c_kv", b.rms_norm_pair(s.q_a, L.q_a_norm, s.q_a, c_kv, L.kv_a_norm, c_kv, 1e-6f));
      OP("gemm q_b", b.gemm(s.q_a, L.q_b, s.q));
      Tensor none;
      // rope + store on the side line beside gemm_heads uk (model/layers/mla.cpp's order) (both read only q_b's
      // output and write disjoint columns), joined before the attention.
      const bool side = rope_side(B, s);
      if (side) b.side_begin();
      OP("rope+kv_store", b.mla_rope_store(q3, s.kv_a, s.positions, B.cos_sin, kNope, kKvLora, kRope, true,
                                           s.kv, s.direct ? none : qr));
      if (side) b.side_end();
    } else {
      OP("norm q_a+c_kv", b.rms_norm(s.q_a, L.q_a_norm, 1e-6f, s.q_a));
      OP("gemm q_b", b.gemm(s.q_a, L.q_b, s.q));
      OP("norm q_a+c_kv", b.rms_norm(c_kv, L.kv_a_norm, 1e-6f, c_kv));
      OP("rope+kv_store", b.rope(q3, s.positions, B.cos_sin, kNope, kRope, true));
      OP("rope+kv_store", b.rope(s.kv_a, s.positions, B.cos_sin, kKvLora, kRope, true));
      OP("rope+kv_store", b.kv_store(s.kv_a, s.kv));
      if (!s.direct) OP("rope+kv_store", b.copy(heads3(s.q, T, kHeads, kQk, kRope, kNope), qr));
    }
    Tensor attn3 = heads3(s.attn, T, kHeads, kV, kV);
    if (s.direct) {
      OP("gemm kv_b", b.gemm(c_kv, L.kv_b, s.kv_b));
      Tensor k3 = heads3(s.k, T, kHeads, kQk, kNope);
      OP("copy k_nope", b.copy(heads3(s.kv_b, T, kHeads, kNope + kV, kNope), k3));
      OP("attention prefill", b.mla_attention_prefill(q3, heads3(s.k, T, kHeads, kQk, kQk),
                                                      heads3(s.kv_b, T, kHeads, kNope + kV, kV, kNope),
                                                      s.kv.query_start, 1, scale, attn3));
    } else if (s.context) {
      const int64_t N = s.ctx_rows.size(0);
      OP("kv_gather", b.kv_gather(s.kv, s.ctx_rows));
      OP("gemm kv_b", b.gemm(cols(s.ctx_rows, N, kKvLora), L.kv_b, s.ctx_kv_b));
      Tensor k3 = heads3(s.ctx_k, N, kHeads, kQk, kNope);
      OP("copy k_nope", b.copy(heads3(s.ctx_kv_b, N, kHeads, kNope + kV, kNope), k3));
      OP("attention prefill ctx", b.mla_attention_prefill_context(q3, heads3(s.ctx_k, N, kHeads, kQk, kQk),
                                                                  heads3(s.ctx_kv_b, N, kHeads, kNope + kV, kV, kNope),
                                                                  s.kv, scale, attn3));
    } else {
      Tensor qn = heads3(s.q_abs, T, kHeads, kRow, kKvLora);
      OP("gemm_heads uk", b.gemm_heads(heads3(s.q, T, kHeads, kQk, kNope), L.uk_all, qn));
      if (B.fused_mla && rope_side(B, s)) b.side_join();
      Tensor lat3 = heads3(s.latent, T, kHeads, kKvLora, kKvLora);
      OP("attention paged", b.mla_attention_paged(heads3(s.q_abs, T, kHeads, kRow, kRow), s.kv, scale, kKvLora, lat3));
      OP("gemm_heads uv", b.gemm_heads(lat3, L.uv_all, attn3));
    }
    OP("gemm o", b.gemm(s.attn, L.o, s.o));
    OP("norm post", b.add_rms_norm(s.residual, s.o, L.post_norm, 1e-6f, s.x));
    if (!L.moe) {
      Tensor g = cols(s.gate_up, T, kDenseI), u = cols(s.gate_up, T, kDenseI, kDenseI);
      OP("dense gate|up", b.gemm_pair(s.x, L.dense_gate, L.dense_up, g, u));
      OP("dense down (swiglu)", b.gemm_swiglu(cols(s.gate_up, T, 2 * kDenseI), L.dense_down, s.o, false));
    } else {
      // The shared experts on the side line (model/layers/moe.cpp), unless --no-side.
      Tensor g = cols(s.gate_up, T, kSharedI), u = cols(s.gate_up, T, kSharedI, kSharedI);
      if (B.side && !B.skip.count("side")) {
        b.side_begin();
        b.gemm_pair(s.x, L.sh_gate, L.sh_up, g, u);
        b.gemm_swiglu(cols(s.gate_up, T, 2 * kSharedI), L.sh_down, s.shared_out, false);
        b.side_end();
      }
      OP("router gemm", b.gemm(s.x, L.gate, s.logits_router));
      MoeRouting r;
      r.num_experts = kExperts;
      r.top_k = kTopK;
      r.use_bias = true;
      r.scaling = 2.446f;
      OP("moe_routing", b.moe_routing(s.logits_router, L.bias, r, s.topk_ids, s.topk_w));
      OP("moe_experts", b.moe_experts(s.x, s.topk_ids, s.topk_w, L.experts, s.o));
      if (B.side) {
        if (!B.skip.count("side")) b.side_join();
        OP("shared add", b.add(s.o, s.shared_out));
      } else {
        OP("shared gate|up", b.gemm_pair(s.x, L.sh_gate, L.sh_up, g, u));
        OP("shared down (swiglu+add)",
           b.gemm_swiglu(cols(s.gate_up, T, 2 * kSharedI), L.sh_down, s.o, true));
      }
    }
  }
  // Last position only (prefill) or every row (decode) goes through the head.
  const int64_t R = s.direct || s.kv.max_query_len > 1 ? 1 : T;  // prefill chunks: the last row
  OP("norm final", b.add_rms_norm(s.residual, s.o, B.final_norm, 1e-6f, s.x));
  Tensor last = s.x.slice_rows(T - R, T);
  OP("lm_head", b.gemm(last, B.lm_head, s.logits));
  OP("argmax", b.argmax(s.logits, s.next_ids));
}

std::unique_ptr<Step> make_step(Bench& B, int64_t num_seqs, int64_t q_len, int64_t ctx, bool direct) {
  Backend& b = B.b;
  auto s = std::make_unique<Step>();
  const int64_t T = num_seqs * q_len;
  s->T = T;
  s->direct = direct;
  const DType A = DType::BF16;
  s->ids = B.buf(DType::I32, {T});
  s->positions = B.buf(DType::I32, {T});
  s->x = B.buf(A, {T, kHidden});
  s->residual = B.buf(A, {T, kHidden});
  s->q_a = B.buf(A, {T, kQLora});
  s->q = B.buf(A, {T, kHeads * kQk});
  s->kv_a = B.buf(A, {T, kRow});
  s->kv_b = B.buf(A, {T, kHeads * (kNope + kV)});
  s->k = B.buf(A, {T, kHeads * kQk});
  s->q_abs = B.buf(A, {T, kHeads * kRow});
  s->latent = B.buf(A, {T, kHeads * kKvLora});
  s->attn = B.buf(A, {T, kHeads * kV});
  s->o = B.buf(A, {T, kHidden});
  s->gate_up = B.buf(A, {T, 2 * kDenseI});
  s->act = B.buf(A, {T, kDenseI});
  s->logits_router = B.buf(DType::F32, {T, kExperts});
  s->topk_ids = B.buf(DType::I32, {T, kTopK});
  s->topk_w = B.buf(DType::F32, {T, kTopK});
  s->shared_out = B.buf(A, {T, kHidden});
  const int64_t R = direct || q_len > 1 ? 1 : T;  // as forward's
  s->logits = B.buf(DType::F32, {R, kVocab});
  s->next_ids = B.buf(DType::I32, {R});
  // Host-side addressing: sequence i holds ctx positions; this step's tokens are the last q_len.
  const int64_t blocks_per_seq = (ctx + kBlock - 1) / kBlock;
  std::vector<int32_t> ids(T), pos(T), qs(num_seqs + 1), lens(num_seqs), tables(num_seqs * blocks_per_seq),
      slots(T);
  for (int64_t i = 0; i < num_seqs; ++i) {
    qs[i] = static_cast<int32_t>(i * q_len);
    lens[i] = static_cast<int32_t>(ctx);
    for (int64_t j = 0; j < blocks_per_seq; ++j) tables[i * blocks_per_seq + j] = static_cast<int32_t>(i * blocks_per_seq + j);
    for (int64_t j = 0; j < q_len; ++j) {
      const int64_t t = i * q_len + j, p = ctx - q_len + j;
      ids[t] = static_cast<int32_t>((t * 7919) % kVocab);
      pos[t] = static_cast<int32_t>(p);
      slots[t] = tables[i * blocks_per_seq + p / kBlock] * static_cast<int32_t>(kBlock) + static_cast<int32_t>(p % kBlock);
    }
  }
  qs[num_seqs] = static_cast<int32_t>(T);
  auto upload = [&](const std::vector<int32_t>& v, std::vector<int64_t> dims) {
    HostBuffer h(DType::I32, dims);
    std::memcpy(h.tensor().data, v.data(), v.size() * 4);
    Tensor t = B.buf(DType::I32, dims);
    b.copy(h.tensor(), t);
    return t;
  };
  s->ids = upload(ids, {T});
  s->positions = upload(pos, {T});
  s->kv.query_start = upload(qs, {num_seqs + 1});
  s->kv.seq_lens = upload(lens, {num_seqs});
  s->kv.block_tables = upload(tables, {num_seqs, blocks_per_seq});
  s->kv.slot_mapping = upload(slots, {T});
  s->kv.num_seqs = static_cast<int>(num_seqs);
  s->kv.max_query_len = static_cast<int>(q_len);
  s->kv.max_seq_len = static_cast<int>(ctx);
  for (int64_t l = 0; l < kLayers; ++l)
    s->caches.push_back(B.rnd(A, {num_seqs * blocks_per_seq, kBlock, kRow}, 1.0f));
  return s;
}

double time_steps(Bench& B, Step& s, int reps, int graph_id) {
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    B.b.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    if (graph_id >= 0)
      B.b.graph_replay(graph_id);
    else
      forward(B, s);
    B.b.synchronize();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Eager decode steps with every op between events; prints us per step by op site.
void profile(Bench& B, cudaStream_t stream, const char* weights, bool prefill, const std::vector<int64_t>& prefill_lens) {
  for (int64_t n : prefill ? prefill_lens : std::vector<int64_t>{1, 8}) {
    // prefill: one sequence of n tokens (direct MLA); decode: n sequences at context 576.
    const int64_t batch = prefill ? 1 : n;
    auto s = prefill ? make_step(B, 1, n, n, true) : make_step(B, batch, 1, 576, false);
    OpProfiler prof;
    prof.stream = stream;
    forward(B, *s);  // warm-up, unprofiled
    B.b.synchronize();
    constexpr int kSteps = 5;
    for (int i = 0; i < kSteps + 1; ++i) {
      B.prof = &prof;
      forward(B, *s);
      B.prof = nullptr;
      prof.collect();
      if (i == 0) prof.reset();  // drop the first step
    }
    std::vector<std::pair<double, std::string>> rows;
    double sum = 0;
    for (const auto& [name, t] : prof.total_us) {
      rows.push_back({t.first / kSteps, name});
      sum += t.first / kSteps;
    }
    std::sort(rows.rbegin(), rows.rend());
    std::printf("profile %s %s %lld (eager, events around each op, mean of %d steps): ops sum %.1f us, "
                "first-to-last event %.1f us\n",
                weights, prefill ? "prefill" : "batch", (long long)n, kSteps, sum, prof.step_us / kSteps);
    for (const auto& [us, name] : rows)
      std::printf("  %-26s %4d calls  %8.1f us  %5.1f%%\n", name.c_str(), prof.total_us[name].second / kSteps,
                  us, 100.0 * us / sum);
  }
}

// --ablate: the graph decode step (context 576) with op sites left out, against the whole step,
// both timed in the same process in interleaved rounds. The outputs are garbage (a skipped op
// leaves its buffer as the last whole step wrote it, so every index stays in range); the times
// say what each site adds to the critical path of the real step, overlap and PDL included.
void ablation(Bench& B, Backend& backend, bool fp8, const std::vector<int64_t>& batches, std::ofstream& jsonl) {
  const std::vector<std::string> norms{"norm in", "norm q_a+c_kv", "norm post", "norm final"};
  const std::vector<std::string> gemms{"gemm q_a|kv_a", "gemm q_b", "gemm_heads uk", "gemm_heads uv", "gemm o",
                                       "dense gate|up", "dense down (swiglu)", "router gemm", "lm_head"};
  const std::vector<std::string> small{"norm in", "norm q_a+c_kv", "norm post", "norm final", "rope+kv_store",
                                       "attention paged", "moe_routing", "shared add", "argmax", "embedding"};
  const std::vector<std::string> attn{"gemm q_a|kv_a", "norm q_a+c_kv", "gemm q_b", "rope+kv_store",
                                      "gemm_heads uk", "attention paged", "gemm_heads uv", "gemm o"};
  std::vector<std::pair<std::string, std::vector<std::string>>> arms{{"none", {}}};
  for (const char* site : {"embedding", "norm in", "gemm q_a|kv_a", "norm q_a+c_kv", "gemm q_b", "rope+kv_store",
                           "gemm_heads uk", "attention paged", "gemm_heads uv", "gemm o", "norm post", "dense gate|up",
                           "dense down (swiglu)", "router gemm", "moe_routing", "moe_experts", "side", "shared add",
                           "norm final", "lm_head", "argmax"})
    arms.push_back({site, {site}});
  arms.push_back({"all norms", norms});
  arms.push_back({"all small ops (norms, rope, attention, routing, add, argmax, embedding)", small});
  {
    std::vector<std::string> g = gemms;
    g.push_back("moe_experts");
    g.push_back("side");
    arms.push_back({"all weight ops (gemms, experts, side line)", g});
  }
  arms.push_back({"attention block (q_a .. o)", attn});
  arms.push_back({"moe block (router, routing, experts, side, add)",
                  {"router gemm", "moe_routing", "moe_experts", "side", "shared add"}});
  for (int64_t batch : batches) {
    auto s = make_step(B, batch, 1, 576, false);
    std::map<std::string, std::vector<double>> ms;
    for (int round = 0; round < 2; ++round) {
      for (size_t k = 0; k < arms.size(); ++k) {
        const auto& arm = arms[round == 0 ? k : arms.size() - 1 - k];
        B.skip.clear();
        forward(B, *s);  // a whole step first: every buffer holds a whole step's values
        B.skip.insert(arm.second.begin(), arm.second.end());
        backend.graph_capture_begin();
        forward(B, *s);
        const int g = backend.graph_capture_end();
        B.skip.clear();
        backend.graph_replay(g);
        ms[arm.first].push_back(time_steps(B, *s, 30, g) * 1e3);
        backend.graph_release(g);
      }
    }
    const double base = (ms["none"][0] + ms["none"][1]) / 2;
    for (const auto& arm : arms) {
      const auto& v = ms[arm.first];
      const double m = (v[0] + v[1]) / 2;
      std::printf("ablate %-4s batch %3lld  %-70s step %7.3f / %7.3f ms  saves %7.1f us (%5.1f%%)\n",
                  fp8 ? "fp8" : "bf16", (long long)batch, arm.first.c_str(), v[0], v[1], (base - m) * 1e3,
                  100.0 * (base - m) / base);
      if (jsonl)
        jsonl << "{\"bench\":\"cuda_layer_bench_ablate\",\"weights\":\"" << (fp8 ? "fp8" : "bf16")
              << "\",\"batch\":" << batch << ",\"context\":576,\"skipped\":\"" << arm.first
              << "\",\"step_ms\":[" << v[0] << "," << v[1] << "],\"base_ms\":" << base << "}\n";
    }
  }
}

// A comma-separated list of positive counts into out; false (after a message) when malformed.
bool parse_counts(const char* text, const char* flag, const char* what, std::vector<int64_t>& out) {
  for (const char* c = text; *c;) {
    char* end = nullptr;
    const long v = std::strtol(c, &end, 10);
    if (end == c || v < 1 || (*end != ',' && *end != 0)) {
      std::fprintf(stderr, "%s: expected a comma-separated list of %s\n", flag, what);
      return false;
    }
    out.push_back(v);
    c = *end == ',' ? end + 1 : end;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  bool fp8 = false, graphs = false, decode_only = false, prefill_only = false, do_profile = false,
       profile_prefill = false, unfused_mla = false, prefill_context = false, no_qgemm = false,
       no_side = false, no_fp8_cutlass = false, rope_on_side = true;
  int attn_chunk = 0;
  std::string out_path;
  int moe_tile = 0;
  std::vector<int64_t> ncu_batches, prefill_lens{512, 4096};
  int pipe_tokens = 0, dense_rows_fp8 = -1, dense_rows_bf16 = -1;
  int64_t decode_ctx = 576;
  bool no_pdl = false, ablate = false;
  std::vector<int64_t> decode_batches{1, 8, 32, 64};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--fp8")) fp8 = true;
    else if (!std::strcmp(argv[i], "--graphs")) graphs = true;
    else if (!std::strcmp(argv[i], "--decode-only")) decode_only = true;
    else if (!std::strcmp(argv[i], "--prefill-only")) prefill_only = true;
    else if (!std::strcmp(argv[i], "--profile")) do_profile = true;
    else if (!std::strcmp(argv[i], "--profile-prefill")) do_profile = profile_prefill = true;
    else if (!std::strcmp(argv[i], "--unfused-mla")) unfused_mla = true;
    else if (!std::strcmp(argv[i], "--no-side")) no_side = true;
    else if (!std::strcmp(argv[i], "--rope-inline")) rope_on_side = false;
    else if (!std::strcmp(argv[i], "--attn-chunk") && i + 1 < argc) attn_chunk = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--ablate")) ablate = true;
    else if (!std::strcmp(argv[i], "--prefill-context")) prefill_context = true;
    else if (!std::strcmp(argv[i], "--no-qgemm")) no_qgemm = true;  // FP8 prefill experts: the own tiles, not moe_qgemm.cu
    else if (!std::strcmp(argv[i], "--no-fp8-cutlass")) no_fp8_cutlass = true;  // FP8 prefill experts: not cutlass_fp8.cu
    else if (!std::strcmp(argv[i], "--moe-tile") && i + 1 < argc) moe_tile = std::atoi(argv[++i]);  // CudaOptions::moe_cutlass_tile
    else if (!std::strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
    else if (!std::strcmp(argv[i], "--pipe-tokens") && i + 1 < argc) pipe_tokens = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--dense-pipe-rows") && i + 1 < argc) {
      if (std::sscanf(argv[++i], "%d,%d", &dense_rows_fp8, &dense_rows_bf16) != 2 || dense_rows_fp8 < 0 ||
          dense_rows_bf16 < 0) {
        std::fprintf(stderr, "--dense-pipe-rows: expected FP8,BF16 row counts (e.g. 32,8)\n");
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--no-pdl")) no_pdl = true;
    else if (!std::strcmp(argv[i], "--decode-ctx") && i + 1 < argc) {
      decode_ctx = std::atoll(argv[++i]);
      if (decode_ctx < 1 || decode_ctx > 8192) {  // the bench's RoPE table (the model's 8,192 positions)
        std::fprintf(stderr, "--decode-ctx: expected a context of 1..8192 positions\n");
        return 2;
      }
    }
    else if (!std::strcmp(argv[i], "--decode-batches") && i + 1 < argc) {
      decode_batches.clear();
      if (!parse_counts(argv[++i], "--decode-batches", "batch sizes", decode_batches)) return 2;
    } else if (!std::strcmp(argv[i], "--ncu-steps") && i + 1 < argc) {
      if (!parse_counts(argv[++i], "--ncu-steps", "batch sizes", ncu_batches)) return 2;
    } else if (!std::strcmp(argv[i], "--prefill-lens") && i + 1 < argc) {
      prefill_lens.clear();
      if (!parse_counts(argv[++i], "--prefill-lens", "prompt lengths", prefill_lens)) return 2;
    }
  }
  try {
    BackendOptions opts;  // the DEEPINFER_* settings table, read once (core/settings.h)
    opts.batch_invariant = env_settings().get_bool("DEEPINFER_BATCH_INVARIANT");
    opts.cuda = cuda_options(env_settings());
    if (no_qgemm) opts.cuda.moe_qgemm_fp8 = false;
    if (no_fp8_cutlass) opts.cuda.moe_cutlass_fp8 = false;
    if (moe_tile > 0) opts.cuda.moe_cutlass_tile = moe_tile;
    if (pipe_tokens > 0) opts.cuda.pipe_max_tokens = pipe_tokens;
    if (dense_rows_fp8 >= 0) opts.cuda.pipe_dense_fp8_rows = dense_rows_fp8;
    if (dense_rows_bf16 >= 0) opts.cuda.pipe_dense_bf16_rows = dense_rows_bf16;
    if (no_pdl) opts.cuda.pdl = false;
    if (attn_chunk != 0) opts.cuda.attn_chunk = attn_chunk;  // the backend rejects other than 32 / 64
    std::unique_ptr<Backend> backend = make_cuda_backend(opts);
    if (!backend) {
      std::fprintf(stderr, "built without CUDA\n");
      return 2;
    }
    Bench B(*backend, fp8);
    B.fused_mla = !unfused_mla;
    B.side = !no_side && !do_profile;  // --profile times ops on the main stream only
    B.rope_side = rope_on_side && B.side;
    const auto t0 = std::chrono::steady_clock::now();
    B.build();
    std::printf("weights %.2f GB (%s) made on the device in %.1f s\n", B.weight_bytes / 1e9, fp8 ? "fp8" : "bf16",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (do_profile) {
      auto* cuda_backend = dynamic_cast<cuda::CudaBackend*>(backend.get());
      DI_CHECK(cuda_backend != nullptr, "layer_bench --profile: not the CUDA backend");
      profile(B, cuda_backend->stream(), fp8 ? "fp8" : "bf16", profile_prefill, prefill_lens);
      return 0;
    }
    if (!ncu_batches.empty()) {
      for (int64_t batch : ncu_batches) {
        auto s = make_step(B, batch, 1, 576, false);
        forward(B, *s);  // warm-up, outside the profiled range
        B.b.synchronize();
        cudaProfilerStart();
        forward(B, *s);
        B.b.synchronize();
        cudaProfilerStop();
        std::printf("ncu step: %s batch %lld done\n", fp8 ? "fp8" : "bf16", (long long)batch);
      }
      return 0;
    }
    std::ofstream jsonl;
    if (!out_path.empty()) jsonl.open(out_path, std::ios::app);
    if (ablate) {
      ablation(B, *backend, fp8, decode_batches, jsonl);
      return 0;
    }
    // Bytes of weights one decode step must read: everything but the experts, plus the
    // experts that B tokens x 6 choices touch (expected distinct of 64 under uniform routing).
    const double expert_bytes = double(3 * kMoeI * kHidden) * (fp8 ? 1.0 : 2.0);
    const double all_expert_bytes = expert_bytes * kExperts * (kLayers - 1);
    const double base_bytes = B.weight_bytes - all_expert_bytes - double(kVocab) * kHidden * 2;  // no embedding read
    const double bw = 4.16e12, peak = fp8 ? 1419e12 : 777e12;
    auto report = [&](const char* kind, int64_t batch, int64_t ctx, double sec, double tokens, double bytes,
                      double flops, const char* mode) {
      const double tok_s = tokens / sec;
      const double floor_s = std::max(bytes / bw, flops / peak);
      std::printf("%-8s %-5s %-6s batch %3lld ctx %5lld  %9.1f tok/s  step %8.3f ms  floor %7.3f ms  (%.0f%% of roofline)\n",
                  kind, fp8 ? "fp8" : "bf16", mode, (long long)batch, (long long)ctx, tok_s, sec * 1e3, floor_s * 1e3,
                  100.0 * floor_s / sec);
      if (jsonl)
        jsonl << "{\"bench\":\"cuda_layer_bench\",\"kind\":\"" << kind << "\",\"weights\":\"" << (fp8 ? "fp8" : "bf16")
              << "\",\"mode\":\"" << mode << "\",\"batch\":" << batch << ",\"context\":" << ctx << ",\"seconds\":" << sec
              << ",\"tokens\":" << tokens << ",\"tok_per_s\":" << tok_s << ",\"bytes\":" << bytes << ",\"flops\":" << flops
              << ",\"floor_s\":" << floor_s << ",\"batch_invariant\":" << (opts.batch_invariant ? "true" : "false") << "}\n";
    };
    const double active_params = 1.28e9;
    for (int64_t T : prefill_lens) {
      if (decode_only) break;
      auto s = make_step(B, 1, T, T, true);
      forward(B, *s);  // warm-up
      const double sec = time_steps(B, *s, 5, -1);
      report("prefill", 1, T, sec, double(T), B.weight_bytes, 2.0 * active_params * T, "eager");
    }
    if (prefill_context && !decode_only) {
      // One sequence: 4096 new tokens after 4096 cached (the cache holds random rows).
      constexpr int64_t kNew = 4096, kCtx = 8192;
      for (bool context : {true, false}) {
        auto s = make_step(B, 1, kNew, kCtx, false);
        s->context = context;
        if (context) {
          s->ctx_rows = B.buf(DType::BF16, {kCtx, kRow});
          s->ctx_kv_b = B.buf(DType::BF16, {kCtx, kHeads * (kNope + kV)});
          s->ctx_k = B.buf(DType::BF16, {kCtx, kHeads * kQk});
        }
        forward(B, *s);  // warm-up
        const double sec = time_steps(B, *s, 3, -1);
        report("prefill", 1, kCtx, sec, double(kNew), B.weight_bytes, 2.0 * active_params * kNew,
               context ? "ctx-direct" : "ctx-absorbed");
      }
    }
    for (int64_t batch : decode_batches) {
      if (prefill_only) break;
      const int64_t ctx = decode_ctx;  // default 576: middle of 512 prompt + 128 generated
      auto s = make_step(B, batch, 1, ctx, false);
      forward(B, *s);
      const double distinct = kExperts * (1.0 - std::pow(1.0 - double(kTopK) / kExperts, double(batch)));
      const double bytes = base_bytes + distinct * expert_bytes * (kLayers - 1) +
                           double(batch) * ctx * kRow * 2 * kLayers;
      const double sec = time_steps(B, *s, 20, -1);
      report("decode", batch, ctx, sec, double(batch), bytes, 2.0 * active_params * batch, "eager");
      if (graphs) {
        try {
          backend->graph_capture_begin();
          forward(B, *s);
          const int g = backend->graph_capture_end();
          backend->graph_replay(g);
          const double gsec = time_steps(B, *s, 20, g);
          report("decode", batch, ctx, gsec, double(batch), bytes, 2.0 * active_params * batch, "graph");
          backend->graph_release(g);
        } catch (const Error& e) {
          std::printf("graph capture failed at batch %lld: %s\n", (long long)batch, e.what());
          try {
            backend->graph_capture_end();  // leave capture mode if it is still on
          } catch (const Error&) {
          }
        }
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "deepinfer_cuda_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
