// The DSpark drafter's heads (DeepSeek-V4.1, model/deepseek_v41/dspark.h), host references;
// backend.h spells out the math:
//  - markov_argmax: one step of the Markov head's sequential drafts, the argmax of the backbone's
//    logits plus the previous token's transition bias (float adds, as the CUDA kernel makes them:
//    the same sums, so the same ids);
//  - dspark_confidence: sigmoid of one dot product per row (summed in double here).
#include <cmath>

#include "backend/backend.h"
#include "backend/cpu/v4_common.h"
#include "core/dtype.h"
#include "core/error.h"

namespace deepinfer {
namespace {

using v4_ops::check_host;


float at(const Tensor& t, int64_t i) {
  return t.dtype == DType::BF16 ? bf16_to_float(t.ptr<const uint16_t>()[i]) : t.ptr<const float>()[i];
}

}  // namespace

void Backend::markov_argmax(const Tensor& logits, int64_t step, const Tensor& bias, int64_t vocab, Tensor& drafts,
                            Tensor& next) {
  DI_CHECK(logits.ndim == 3, "markov_argmax: logits must be F32 [N, B, V], got ", logits.describe());
  const int64_t N = logits.size(0), B = logits.size(1), V = logits.size(2);
  check_host(logits, DType::F32, {N, B, V}, "markov_argmax", "logits");
  if (bias.defined()) check_host(bias, DType::F32, {N, V}, "markov_argmax", "bias");
  check_host(drafts, DType::I32, {N, B}, "markov_argmax", "drafts");
  check_host(next, DType::I32, {N}, "markov_argmax", "next");
  DI_CHECK(step >= 0 && step < B, "markov_argmax: step ", step, " outside the block of ", B);
  DI_CHECK(vocab >= 1 && vocab <= V, "markov_argmax: vocab ", vocab, " outside [1, ", V, "]");
  for (int64_t n = 0; n < N; ++n) {
    const float* row = logits.ptr<const float>() + (n * B + step) * V;
    const float* add = bias.defined() ? bias.ptr<const float>() + n * V : nullptr;
    int32_t best = -1;
    float best_v = 0.0f;
    for (int64_t v = 0; v < vocab; ++v) {
      const float s = add != nullptr ? row[v] + add[v] : row[v];
      if (!std::isnan(s) && (best < 0 || s > best_v)) {
        best = static_cast<int32_t>(v);
        best_v = s;
      }
    }
    drafts.ptr<int32_t>()[n * B + step] = best;
    next.ptr<int32_t>()[n] = best < 0 ? 0 : best;
  }
}

void Backend::dspark_confidence(const Tensor& h, const Tensor& e, const Tensor& w, Tensor& out) {
  DI_CHECK(h.ndim == 2 && (h.dtype == DType::F32 || h.dtype == DType::BF16),
           "dspark_confidence: h must be F32 or BF16 [T, H], got ", h.describe());
  const int64_t T = h.size(0), H = h.size(1), R = e.defined() ? (e.ndim == 2 ? e.size(1) : -1) : 0;
  check_host(h, h.dtype, {T, H}, "dspark_confidence", "h");
  if (e.defined()) {
    DI_CHECK(e.dtype == DType::F32 || e.dtype == DType::BF16, "dspark_confidence: e must be F32 or BF16 [", T,
             ", R], got ", e.describe());
    check_host(e, e.dtype, {T, R}, "dspark_confidence", "e");
  }
  check_host(w, DType::F32, {H + R}, "dspark_confidence", "w");
  check_host(out, DType::F32, {T}, "dspark_confidence", "out");
  const float* wv = w.ptr<const float>();
  for (int64_t t = 0; t < T; ++t) {
    double acc = 0.0;
    for (int64_t j = 0; j < H; ++j) acc += static_cast<double>(wv[j]) * at(h, t * H + j);
    for (int64_t k = 0; k < R; ++k) acc += static_cast<double>(wv[H + k]) * at(e, t * R + k);
    out.ptr<float>()[t] = 1.0f / (1.0f + std::exp(-static_cast<float>(acc)));
  }
}

}  // namespace deepinfer
