#include "model/deepseek_v4/tensor_loader.h"

#include <utility>

#include "core/error.h"
#include "core/quant.h"
#include "io/safetensors.h"

namespace deepinfer {

namespace {

TensorSource reader_source(std::shared_ptr<const CheckpointReader> r) {
  TensorSource s;
  s.find = [r](const std::string& name) -> std::optional<Tensor> {
    if (!r->has(name)) return std::nullopt;
    return r->tensor(name);
  };
  s.describe = [r](const std::string&) { return r->path(); };
  return s;
}

}  // namespace

V4TensorLoader::V4TensorLoader(const V4FamilyConfig& c, std::shared_ptr<const CheckpointReader> r,
                               std::vector<std::shared_ptr<void>>& owners,
                               std::string (*alternate)(const std::string&))
    : V4TensorLoader(c, reader_source(r), r->path(), owners, alternate) {}

V4TensorLoader::V4TensorLoader(const V4FamilyConfig& c, TensorSource source, std::string origin,
                               std::vector<std::shared_ptr<void>>& owners,
                               std::string (*alternate)(const std::string&))
    : c_(c),
      source_(std::move(source)),
      origin_(std::move(origin)),
      owners_(owners),
      alternate_(alternate) {}

std::string V4TensorLoader::resolve(const std::string& official) const {
  if (has(official)) return official;
  const std::string alt = alternate_(official);
  return has(alt) ? alt : std::string();
}

Tensor V4TensorLoader::raw(const std::string& official, const char* what) const {
  const std::string name = resolve(official);
  DI_CHECK(!name.empty(), "tensor '", official, "' (or '", alternate_(official), "'; ", what,
           ") is missing from ", origin_);
  return *source_.find(name);
}

void V4TensorLoader::check_dims(const Tensor& t, const std::string& name,
                                const std::vector<int64_t>& dims, const char* what) const {
  DI_CHECK(t.dims() == dims, "tensor '", name, "' in ", origin_, " has shape ",
           shape_string(t.dims()), " but config ", c_.base.source, " expects ", shape_string(dims),
           " (", what, ")");
}

Tensor V4TensorLoader::f32(const std::string& official, const std::vector<int64_t>& dims,
                           const char* what) {
  Tensor t = raw(official, what);
  check_dims(t, official, dims, what);
  DI_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, "tensor '", official, "' in ", origin_,
           " has dtype ", dtype_name(t.dtype), " but ", what, " must be F32 or BF16");
  auto b = std::make_shared<HostBuffer>(DType::F32, dims);
  for (int64_t i = 0; i < t.numel(); ++i)
    b->ptr<float>()[i] =
        t.dtype == DType::F32 ? t.ptr<const float>()[i] : bf16_to_float(t.ptr<const uint16_t>()[i]);
  owners_.push_back(b);
  return b->tensor();
}

Tensor V4TensorLoader::scale_of(const std::string& prefix, const std::vector<int64_t>& dims,
                                const char* what) const {
  for (const char* suffix : {".scale", ".weight_scale_inv"}) {
    const std::string name = resolve(prefix + suffix);
    if (name.empty()) continue;
    Tensor s = *source_.find(name);
    DI_CHECK(s.dims() == dims, "tensor '", name, "' in ", origin_, " has shape ",
             shape_string(s.dims()), " but ", what, " needs scales of shape ", shape_string(dims));
    return s;
  }
  fail("tensor '", prefix, ".scale' (or '.weight_scale_inv'; scales of ", what,
       ") is missing from ", origin_);
}

Weight V4TensorLoader::linear_from(const Tensor& t, const std::string& prefix, int64_t n, int64_t k,
                                   const char* what, bool dequantize, bool packed) {
  Weight w;
  if (t.dtype == DType::I8 || t.dtype == DType::U8) {
    check_dims(t, prefix + ".weight", {n, k / 2}, what);
    DI_CHECK(k % 32 == 0, "tensor '", prefix, ".weight' (", what,
             "): FP4 needs K % 32 == 0, K = ", k);
    Tensor s = scale_of(prefix, {n, k / 32}, what);
    if (packed && (s.dtype == DType::F8_E8M0 || s.dtype == DType::U8)) {
      w.w = t;
      w.scale_inv = s;
      w.block_n = 1;
      w.block_k = 32;
      return w;
    }
    auto b = std::make_shared<HostBuffer>(DType::F32, std::vector<int64_t>{n, k});
    dequantize_fp4_e2m1(t, s, b->ptr<float>(), (prefix + ".weight").c_str());
    owners_.push_back(b);
    w.w = b->tensor();
    return w;
  }
  check_dims(t, prefix + ".weight", {n, k}, what);
  if (t.dtype == DType::F8_E4M3) {
    const int64_t bn = c_.base.quantization.block_n, bk = c_.base.quantization.block_k;
    DI_CHECK(bn == bk, c_.base.source,
             ": quantization_config.weight_block_size must be square for ", c_.base.model_type);
    Tensor s = scale_of(prefix, {(n + bn - 1) / bn, (k + bk - 1) / bk}, what);
    if (dequantize) {
      auto b = std::make_shared<HostBuffer>(DType::F32, std::vector<int64_t>{n, k});
      dequantize_fp8_blocks(t, s, static_cast<int>(bn), b->ptr<float>(),
                            (prefix + ".weight").c_str());
      owners_.push_back(b);
      w.w = b->tensor();
      return w;
    }
    auto sb = std::make_shared<HostBuffer>(DType::F32, s.dims());
    for (int64_t i = 0; i < s.numel(); ++i) sb->ptr<float>()[i] = scale_value(s, i);
    owners_.push_back(sb);
    w.w = t;
    w.scale_inv = sb->tensor();
    w.block_n = static_cast<int>(bn);
    w.block_k = static_cast<int>(bk);
    return w;
  }
  DI_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, "tensor '", prefix, ".weight' in ",
           origin_, " has dtype ", dtype_name(t.dtype), " which ", what,
           " cannot be (F32, BF16, F8_E4M3 or FP4 I8)");
  w.w = t;
  return w;
}

Weight V4TensorLoader::linear(const std::string& prefix, int64_t n, int64_t k, const char* what,
                              bool dequantize, bool packed) {
  return linear_from(raw(prefix + ".weight", what), prefix, n, k, what, dequantize, packed);
}

std::vector<ExpertWeights> V4TensorLoader::expert_list(const std::string& ffn, bool packed) {
  const int64_t E = c_.base.n_routed_experts, I = c_.base.moe_intermediate_size,
                H = c_.base.hidden_size;
  std::vector<ExpertWeights> out(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = ffn + "experts." + std::to_string(e) + ".";
    out[e].gate = linear(p + "w1", I, H, w("routed expert w1 (gate)"), false, packed);
    out[e].up = linear(p + "w3", I, H, w("routed expert w3 (up)"), false, packed);
    out[e].down = linear(p + "w2", H, I, w("routed expert w2 (down)"), false, packed);
  }
  return out;
}

Tensor V4TensorLoader::embedding() {
  Tensor e = raw("embed.weight", "token embedding");
  check_dims(e, "embed.weight", {c_.base.vocab_size, c_.base.hidden_size},
             "token embedding [vocab, hidden]");
  DI_CHECK(e.dtype == DType::F32 || e.dtype == DType::BF16,
           "tensor 'embed.weight' must be F32 or BF16");
  return e;
}

V4HyperConnection V4TensorLoader::hc_site(const std::string& block, const std::string& site) {
  const int64_t H = c_.base.hidden_size, hc = c_.hc_mult, mixes = (2 + hc) * hc;
  const std::string p = block + "hc_" + site + "_";
  return {f32(p + "fn", {mixes, hc * H}, w("hyper-connection fn [(2+hc)*hc, hc*hidden]")),
          f32(p + "base", {mixes}, w("hyper-connection base")),
          f32(p + "scale", {3}, w("hyper-connection scale"))};
}

ExpertWeights V4TensorLoader::shared_expert(const std::string& ffn) {
  const int64_t I = c_.base.moe_intermediate_size, H = c_.base.hidden_size;
  ExpertWeights s;
  s.gate = linear(ffn + "shared_experts.w1", I, H, w("shared expert w1 (gate)"));
  s.up = linear(ffn + "shared_experts.w3", I, H, w("shared expert w3 (up)"));
  s.down = linear(ffn + "shared_experts.w2", H, I, w("shared expert w2 (down)"));
  return s;
}

const char* V4TensorLoader::w(const char* base) {
  if (why_.empty()) return base;
  notes_.push_back(std::string(base) + why_);
  return notes_.back().c_str();
}

}  // namespace deepinfer
