#include "bf16_emulation.h"

#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace deepinfer::test {
namespace {

// Calls f(i, offset) for element i (row-major order) of t at element offset `offset` (strides).
template <typename F>
void each_element(const Tensor& t, F f) {
  const int64_t n = t.numel();
  std::vector<int64_t> idx(static_cast<size_t>(t.ndim), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (int d = 0; d < t.ndim; ++d) off += idx[static_cast<size_t>(d)] * t.stride[d];
    f(i, off);
    for (int d = t.ndim - 1; d >= 0; --d) {
      if (++idx[static_cast<size_t>(d)] < t.shape[d]) break;
      idx[static_cast<size_t>(d)] = 0;
    }
  }
}

// An F32 stand-in for a BF16 argument (any strides); other dtypes pass through as they are.
// store() writes the stand-in back, rounded to nearest even.
class F32Arg {
 public:
  explicit F32Arg(const Tensor& t, bool load = true) : orig_(t) {
    if (t.dtype != DType::BF16) {
      view_ = t;
      return;
    }
    buf_ = std::make_unique<HostBuffer>(DType::F32, t.dims());
    view_ = buf_->tensor();
    if (!load) return;
    float* dst = view_.ptr<float>();
    const uint16_t* src = t.ptr<const uint16_t>();
    each_element(t, [&](int64_t i, int64_t off) { dst[i] = bf16_to_float(src[off]); });
  }
  Tensor& t() { return view_; }
  void store() {
    if (!buf_) return;
    const float* src = view_.ptr<const float>();
    uint16_t* dst = orig_.ptr<uint16_t>();
    each_element(orig_, [&](int64_t i, int64_t off) { dst[off] = float_to_bf16(src[i]); });
  }

 private:
  Tensor orig_, view_;
  std::unique_ptr<HostBuffer> buf_;
};

void round_in_place(Tensor& t) {  // F32 contiguous
  float* p = t.ptr<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = bf16_to_float(float_to_bf16(p[i]));
}

}  // namespace

const Weight& Bf16EmulationBackend::device_weight(const Weight& w) {
  if (w.w.dtype != DType::F32) return w;
  auto it = rounded_.find(w.w.data);
  if (it == rounded_.end()) {
    DI_CHECK(w.w.is_contiguous(), "bf16 emulation: F32 weight ", w.w.describe(), " is not contiguous");
    auto b = std::make_shared<HostBuffer>(DType::BF16, w.w.dims());
    for (int64_t i = 0; i < w.w.numel(); ++i) b->ptr<uint16_t>()[i] = float_to_bf16(w.w.ptr<const float>()[i]);
    Weight r = w;
    r.w = b->tensor();
    it = rounded_.emplace(w.w.data, std::make_pair(b, r)).first;
  }
  return it->second.second;
}

void Bf16EmulationBackend::embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  F32Arg o(out, false);
  inner_.embedding(ids, table, o.t());
  o.store();
}

void Bf16EmulationBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  F32Arg a(x), o(out, false);
  inner_.rms_norm(a.t(), weight, eps, o.t());
  o.store();
}

void Bf16EmulationBackend::gemm(const Tensor& x, const Weight& w, Tensor& out) {
  F32Arg o(out, false);
  if (x.dtype == DType::F32) {  // CUDA's GEMMs read BF16 inputs: an F32 input is rounded first
    HostBuffer r(DType::F32, x.dims());
    each_element(x, [&](int64_t i, int64_t off) { r.ptr<float>()[i] = x.ptr<const float>()[off]; });
    round_in_place(r.tensor());
    inner_.gemm(r.tensor(), device_weight(w), o.t());
  } else {
    F32Arg a(x);
    inner_.gemm(a.t(), device_weight(w), o.t());
  }
  o.store();
}

void Bf16EmulationBackend::rope(Tensor& x, const Tensor& positions, const Tensor& cos_sin, int rope_offset,
                                int rope_dim, bool interleave) {
  F32Arg a(x);
  inner_.rope(a.t(), positions, cos_sin, rope_offset, rope_dim, interleave);
  a.store();
}

void Bf16EmulationBackend::add(Tensor& x, const Tensor& y) {
  F32Arg a(x), b(y);
  inner_.add(a.t(), b.t());
  a.store();
}

void Bf16EmulationBackend::kv_store(const Tensor& rows, PagedKV& kv) {
  F32Arg a(rows);
  inner_.kv_store(a.t(), kv);  // a BF16 cache rounds the F32 rows (exact here)
}

void Bf16EmulationBackend::silu_mul_clamped(const Tensor& gate_up, float limit, Tensor& out) {
  F32Arg a(gate_up), o(out, false);
  inner_.silu_mul_clamped(a.t(), limit, o.t());
  o.store();
}

// Per token and slot: gate | up (F32 sums) rounded to BF16, the clamped SwiGLU rounded to BF16,
// down in F32, the weighted sum over the slots in F32, then the output rounded (as moe_qgemm.cu's
// and the BF16 expert paths' intermediates).
void Bf16EmulationBackend::moe_experts_clamped(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                                               const std::vector<ExpertWeights>& experts, float limit, Tensor& out) {
  F32Arg a(x), o(out, false);
  const int64_t T = a.t().size(0), H = a.t().size(1), K = topk_ids.size(1);
  DI_CHECK(topk_ids.is_contiguous() && topk_weights.is_contiguous() && a.t().is_contiguous() &&
               o.t().is_contiguous(),
           "bf16 emulation: moe_experts_clamped needs contiguous rows");
  const int32_t* ids = topk_ids.ptr<const int32_t>();
  const float* wts = topk_weights.ptr<const float>();
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> acc(static_cast<size_t>(H), 0.0f);
    Tensor xt = a.t().slice_rows(t, t + 1);
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = ids[t * K + j];
      if (e < 0) continue;
      const ExpertWeights& ew = experts[static_cast<size_t>(e)];
      const int64_t I = ew.gate.out_features();
      HostBuffer gu(DType::F32, {1, 2 * I}), h(DType::F32, {1, I}), d(DType::F32, {1, H});
      Tensor g = gu.tensor(), u = gu.tensor();
      g.shape[1] = I;
      u.data = gu.ptr<float>() + I;
      u.shape[1] = I;
      inner_.gemm(xt, device_weight(ew.gate), g);
      inner_.gemm(xt, device_weight(ew.up), u);
      round_in_place(gu.tensor());
      inner_.silu_mul_clamped(gu.tensor(), limit, h.tensor());
      round_in_place(h.tensor());
      inner_.gemm(h.tensor(), device_weight(ew.down), d.tensor());
      for (int64_t c = 0; c < H; ++c) acc[static_cast<size_t>(c)] += wts[t * K + j] * d.ptr<float>()[c];
    }
    std::memcpy(o.t().ptr<float>() + t * H, acc.data(), static_cast<size_t>(H) * 4);
  }
  o.store();
}

void Bf16EmulationBackend::sink_attention(const Tensor& q, const Tensor& kv, const Tensor& indices,
                                          const Tensor& sinks, float scale, Tensor& out) {
  F32Arg a(q), b(kv), o(out, false);
  inner_.sink_attention(a.t(), b.t(), indices, sinks, scale, o.t());
  o.store();
}

void Bf16EmulationBackend::compressor_pool(const Tensor& kv, const Tensor& gate, const Tensor& ape, int ratio,
                                           bool overlap, const Tensor& prior_kv, const Tensor& prior_gate,
                                           Tensor& out) {
  F32Arg a(kv), b(gate), o(out, false);
  std::unique_ptr<F32Arg> pk, pg;
  if (prior_kv.defined()) pk = std::make_unique<F32Arg>(prior_kv);
  if (prior_gate.defined()) pg = std::make_unique<F32Arg>(prior_gate);
  inner_.compressor_pool(a.t(), b.t(), ape, ratio, overlap, pk ? pk->t() : prior_kv, pg ? pg->t() : prior_gate,
                         o.t());
  o.store();
}

void Bf16EmulationBackend::fake_quant(Tensor& x, FakeQuant kind) {
  F32Arg a(x);
  inner_.fake_quant(a.t(), kind);
  a.store();
}

void Bf16EmulationBackend::store_packed_rows(const Tensor& x, FakeQuant kind, const PagedKV& kv) {
  F32Arg a(x);
  inner_.store_packed_rows(a.t(), kind, kv);
}

void Bf16EmulationBackend::gather_packed_rows(const Tensor& ids, const Tensor& cache, FakeQuant kind, Tensor& out) {
  F32Arg o(out, false);
  inner_.gather_packed_rows(ids, cache, kind, o.t());
  o.store();
}

void Bf16EmulationBackend::hc_post(const Tensor& streams, const Tensor& f, const Tensor& post, const Tensor& comb,
                                   Tensor& out) {
  F32Arg a(f);
  inner_.hc_post(streams, a.t(), post, comb, out);
}

void Bf16EmulationBackend::hc_collapse(const Tensor& streams, const Tensor& pre, Tensor& out) {
  F32Arg o(out, false);
  inner_.hc_collapse(streams, pre, o.t());
  o.store();
}

void Bf16EmulationBackend::embedding_fp8_rows(const Tensor& ids, const Tensor& table, const Tensor& scales,
                                              Tensor& out) {
  F32Arg o(out, false);
  inner_.embedding_fp8_rows(ids, table, scales, o.t());
  o.store();
}

void Bf16EmulationBackend::indexer_scores_visible(const Tensor& q, const Tensor& keys, const Tensor& weights,
                                                  const Tensor& positions, int ratio, float softmax_scale,
                                                  float weights_scale, Tensor& scores) {
  F32Arg a(q), b(keys);
  inner_.indexer_scores_visible(a.t(), b.t(), weights, positions, ratio, softmax_scale, weights_scale, scores);
}

}  // namespace deepinfer::test
