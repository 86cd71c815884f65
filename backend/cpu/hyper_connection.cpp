// hc_pre / hc_post / hc_head: DeepSeek-V4's manifold-constrained hyper-connections (host
// reference; backend.h spells out the math). fp32 throughout, as transformers runs them.
#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/v4_common.h"

namespace deepinfer {

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// mix[m] = fn[m] · (flat * rsqrt(mean(flat^2) + eps)) for one token's flattened streams.
void mix_logits(const float* flat, int64_t n, const float* fn, int64_t rows, float eps, float* mix) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(flat[i]) * flat[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
  for (int64_t m = 0; m < rows; ++m) {
    double acc = 0.0;
    const float* w = fn + m * n;
    for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(w[i]) * (flat[i] * inv);
    mix[m] = static_cast<float>(acc);
  }
}

// One token's pre [hc], post [hc] and comb [hc, hc] (row j, column k) from its flattened streams.
void token_mixes(const float* x, int64_t hc, int64_t H, const float* fn, const float* b, const float* sc,
                 const Backend::HyperConnectionParams& p, float* mix, float* pre, float* post, float* c) {
  mix_logits(x, hc * H, fn, (2 + hc) * hc, p.norm_eps, mix);
  for (int64_t k = 0; k < hc; ++k) {
    pre[k] = sigmoid(mix[k] * sc[0] + b[k]) + p.hc_eps;
    post[k] = 2.0f * sigmoid(mix[hc + k] * sc[1] + b[hc + k]);
  }
  for (int64_t j = 0; j < hc; ++j) {
    float mx = -INFINITY;
    for (int64_t k = 0; k < hc; ++k) {
      c[j * hc + k] = mix[2 * hc + j * hc + k] * sc[2] + b[2 * hc + j * hc + k];
      mx = std::fmax(mx, c[j * hc + k]);
    }
    float sum = 0.0f;
    for (int64_t k = 0; k < hc; ++k) sum += (c[j * hc + k] = std::exp(c[j * hc + k] - mx));
    for (int64_t k = 0; k < hc; ++k) c[j * hc + k] = c[j * hc + k] / sum + p.hc_eps;
  }
  auto normalize_columns = [&] {
    for (int64_t k = 0; k < hc; ++k) {
      float s = 0.0f;
      for (int64_t j = 0; j < hc; ++j) s += c[j * hc + k];
      for (int64_t j = 0; j < hc; ++j) c[j * hc + k] /= (s + p.hc_eps);
    }
  };
  normalize_columns();
  for (int it = 1; it < p.sinkhorn_iters; ++it) {
    for (int64_t j = 0; j < hc; ++j) {
      float s = 0.0f;
      for (int64_t k = 0; k < hc; ++k) s += c[j * hc + k];
      for (int64_t k = 0; k < hc; ++k) c[j * hc + k] /= (s + p.hc_eps);
    }
    normalize_columns();
  }
}

void check_mix_args(const Tensor& streams, const Tensor& fn, const Tensor& base, const Tensor& scale,
                    const Backend::HyperConnectionParams& p, const Tensor& post, const Tensor& comb, const char* op) {
  using v4_ops::check_host;
  DI_CHECK(streams.ndim == 3, op, ": streams must be [T, hc, H], got ", streams.describe());
  const int64_t T = streams.size(0), hc = p.hc_mult, H = streams.size(2), mixes = (2 + hc) * hc;
  check_host(streams, DType::F32, {T, hc, H}, op, "streams");
  check_host(fn, DType::F32, {mixes, hc * H}, op, "fn");
  check_host(base, DType::F32, {mixes}, op, "base");
  check_host(scale, DType::F32, {3}, op, "scale");
  check_host(post, DType::F32, {T, hc}, op, "post");
  check_host(comb, DType::F32, {T, hc, hc}, op, "comb");
  DI_CHECK(p.sinkhorn_iters >= 1, op, ": sinkhorn_iters must be >= 1, got ", p.sinkhorn_iters);
}

}  // namespace

void Backend::hc_pre(const Tensor& streams, const Tensor& fn, const Tensor& base, const Tensor& scale,
                     const HyperConnectionParams& p, Tensor& collapsed, Tensor& post, Tensor& comb) {
  check_mix_args(streams, fn, base, scale, p, post, comb, "hc_pre");
  const int64_t T = streams.size(0), hc = p.hc_mult, H = streams.size(2), mixes = (2 + hc) * hc;
  v4_ops::check_host(collapsed, DType::F32, {T, H}, "hc_pre", "collapsed");
  std::vector<float> mix(static_cast<size_t>(mixes)), pre(static_cast<size_t>(hc));
  for (int64_t t = 0; t < T; ++t) {
    const float* x = streams.ptr<const float>() + t * hc * H;
    token_mixes(x, hc, H, fn.ptr<const float>(), base.ptr<const float>(), scale.ptr<const float>(), p, mix.data(),
                pre.data(), post.ptr<float>() + t * hc, comb.ptr<float>() + t * hc * hc);
    float* out = collapsed.ptr<float>() + t * H;
    for (int64_t d = 0; d < H; ++d) {
      float acc = 0.0f;
      for (int64_t k = 0; k < hc; ++k) acc += pre[k] * x[k * H + d];
      out[d] = acc;
    }
  }
}

void Backend::hc_mix(const Tensor& streams, const Tensor& fn, const Tensor& base, const Tensor& scale,
                     const HyperConnectionParams& p, Tensor& pre, Tensor& post, Tensor& comb) {
  check_mix_args(streams, fn, base, scale, p, post, comb, "hc_mix");
  const int64_t T = streams.size(0), hc = p.hc_mult, H = streams.size(2), mixes = (2 + hc) * hc;
  v4_ops::check_host(pre, DType::F32, {T, hc}, "hc_mix", "pre");
  std::vector<float> mix(static_cast<size_t>(mixes));
  for (int64_t t = 0; t < T; ++t)
    token_mixes(streams.ptr<const float>() + t * hc * H, hc, H, fn.ptr<const float>(), base.ptr<const float>(),
                scale.ptr<const float>(), p, mix.data(), pre.ptr<float>() + t * hc, post.ptr<float>() + t * hc,
                comb.ptr<float>() + t * hc * hc);
}

void Backend::hc_collapse(const Tensor& streams, const Tensor& pre, Tensor& out) {
  using v4_ops::check_host;
  DI_CHECK(streams.ndim == 3, "hc_collapse: streams must be [T, hc, H], got ", streams.describe());
  const int64_t T = streams.size(0), hc = streams.size(1), H = streams.size(2);
  check_host(streams, DType::F32, {T, hc, H}, "hc_collapse", "streams");
  check_host(pre, DType::F32, {T, hc}, "hc_collapse", "pre");
  check_host(out, DType::F32, {T, H}, "hc_collapse", "out");
  for (int64_t t = 0; t < T; ++t) {
    const float* x = streams.ptr<const float>() + t * hc * H;
    const float* w = pre.ptr<const float>() + t * hc;
    float* o = out.ptr<float>() + t * H;
    for (int64_t d = 0; d < H; ++d) {
      float acc = 0.0f;
      for (int64_t k = 0; k < hc; ++k) acc += w[k] * x[k * H + d];
      o[d] = acc;
    }
  }
}

void Backend::hc_post(const Tensor& streams, const Tensor& f, const Tensor& post, const Tensor& comb,
                      Tensor& out) {
  using v4_ops::check_host;
  DI_CHECK(streams.ndim == 3, "hc_post: streams must be [T, hc, H], got ", streams.describe());
  const int64_t T = streams.size(0), hc = streams.size(1), H = streams.size(2);
  check_host(streams, DType::F32, {T, hc, H}, "hc_post", "streams");
  check_host(f, DType::F32, {T, H}, "hc_post", "f");
  check_host(post, DType::F32, {T, hc}, "hc_post", "post");
  check_host(comb, DType::F32, {T, hc, hc}, "hc_post", "comb");
  check_host(out, DType::F32, {T, hc, H}, "hc_post", "out");
  DI_CHECK(out.data != streams.data, "hc_post: out must not alias streams");
  for (int64_t t = 0; t < T; ++t) {
    const float* x = streams.ptr<const float>() + t * hc * H;
    const float* c = comb.ptr<const float>() + t * hc * hc;
    const float* fo = f.ptr<const float>() + t * H;
    for (int64_t k = 0; k < hc; ++k) {
      const float pk = post.ptr<const float>()[t * hc + k];
      float* o = out.ptr<float>() + (t * hc + k) * H;
      for (int64_t d = 0; d < H; ++d) {
        float acc = pk * fo[d];
        for (int64_t j = 0; j < hc; ++j) acc += c[j * hc + k] * x[j * H + d];
        o[d] = acc;
      }
    }
  }
}

void Backend::hc_head(const Tensor& streams, const Tensor& fn, const Tensor& base, const Tensor& scale,
                      const HyperConnectionParams& p, Tensor& out) {
  using v4_ops::check_host;
  DI_CHECK(streams.ndim == 3, "hc_head: streams must be [T, hc, H], got ", streams.describe());
  const int64_t T = streams.size(0), hc = p.hc_mult, H = streams.size(2);
  check_host(streams, DType::F32, {T, hc, H}, "hc_head", "streams");
  check_host(fn, DType::F32, {hc, hc * H}, "hc_head", "fn");
  check_host(base, DType::F32, {hc}, "hc_head", "base");
  check_host(scale, DType::F32, {1}, "hc_head", "scale");
  check_host(out, DType::F32, {T, H}, "hc_head", "out");
  std::vector<float> mix(static_cast<size_t>(hc));
  for (int64_t t = 0; t < T; ++t) {
    const float* x = streams.ptr<const float>() + t * hc * H;
    mix_logits(x, hc * H, fn.ptr<const float>(), hc, p.norm_eps, mix.data());
    for (int64_t k = 0; k < hc; ++k)
      mix[k] = sigmoid(mix[k] * scale.ptr<const float>()[0] + base.ptr<const float>()[k]) + p.hc_eps;
    float* o = out.ptr<float>() + t * H;
    for (int64_t d = 0; d < H; ++d) {
      float acc = 0.0f;
      for (int64_t k = 0; k < hc; ++k) acc += mix[k] * x[k * H + d];
      o[d] = acc;
    }
  }
}

}  // namespace deepinfer
