// Random DeepSeek-V4 weights (bench, --random-weights) in V4-Flash's formats, made on the
// backend: large tensors with Backend::fill_random on its device, small F32 tensors (norms,
// hyper-connections, ape, sinks, bias, block scales) on the host (the model's constructor
// uploads them). Values are scaled like a trained model's (norm weights near 1, linears of
// bound sqrt(3 / in_features)) so activations stay finite through many layers.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "backend/random.h"
#include "core/error.h"
#include "model/deepseek_v4/weights.h"

namespace deepinfer {

namespace {

class RandomBuilder {
 public:
  RandomBuilder(const DeepseekV4Config& c, uint64_t seed, DType dense, bool fp4_experts, Backend& be, V4Weights& w)
      : c_(c), seed_(seed), dense_(dense), fp4_(fp4_experts), be_(be), w_(w) {}

  // F32 [dims] on the host: center + spread * u, u uniform in [-1, 1).
  Tensor host_f32(std::vector<int64_t> dims, float center, float spread) {
    auto b = std::make_shared<HostBuffer>(DType::F32, dims);
    const uint64_t s = next_seed();
    for (int64_t i = 0; i < b->tensor().numel(); ++i)
      b->ptr<float>()[i] = center + spread * random_uniform(s, static_cast<uint64_t>(i));
    w_.owners.push_back(b);
    return b->tensor();
  }
  // dtype [dims] on the backend's device: scale * u.
  Tensor device(DType dtype, std::vector<int64_t> dims, float scale) {
    auto b = std::make_shared<DeviceBuffer>(be_.alloc(dtype, dims));
    Tensor t = b->tensor();
    be_.fill_random(t, next_seed(), scale);
    w_.owners.push_back(b);
    return t;
  }
  // A linear [n, k] of bound sqrt(3 / k): BF16, or FP8 e4m3 with power-of-two (ue8m0) F32
  // scales per 128 x 128 block (fp8 false: BF16 whatever the dense dtype).
  Weight linear(int64_t n, int64_t k, bool fp8) {
    const float bound = std::sqrt(3.0f / static_cast<float>(k));
    Weight w;
    if (!fp8 || dense_ != DType::F8_E4M3) {
      w.w = device(dense_ == DType::F32 ? DType::F32 : DType::BF16, {n, k}, bound);
      return w;
    }
    const int b = 128;
    w.w = device(DType::F8_E4M3, {n, k}, 448.0f);
    w.scale_inv = host_f32({(n + b - 1) / b, (k + b - 1) / b}, std::exp2(std::round(std::log2(bound / 448.0f))), 0.0f);
    w.block_n = w.block_k = b;
    return w;
  }
  // A routed expert's linear [n, k]: FP4 e2m1 packed two per byte ([n, k/2] bytes, any byte is
  // two valid values) with one E8M0 scale byte per 32 along K (block 1 x 32), the power of two
  // that puts the largest value (6) near sqrt(3 / k); or a dense linear.
  Weight expert_linear(int64_t n, int64_t k) {
    if (!fp4_) return linear(n, k, true);
    DI_CHECK(k % 32 == 0, c_.base.source, ": FP4 routed experts need moe_intermediate_size and hidden_size % 32 == 0");
    Weight w;
    auto b = std::make_shared<DeviceBuffer>(be_.alloc(DType::U8, {n, k / 2}));
    Tensor bytes(b->tensor().data, DType::F8_E4M3, {n, k / 2}, b->tensor().device);  // random bytes
    be_.fill_random(bytes, next_seed(), 448.0f);
    w_.owners.push_back(b);
    w.w = b->tensor();
    const int e = static_cast<int>(std::floor(std::log2(std::sqrt(3.0 / static_cast<double>(k)) / 6.0)));
    const std::vector<int64_t> sdims = {n, k / 32};
    auto& host = scale_bytes_[sdims];
    if (!host) {
      host = std::make_shared<HostBuffer>(DType::U8, sdims);
      std::fill_n(host->ptr<uint8_t>(), host->tensor().numel(), static_cast<uint8_t>(127 + e));
    }
    auto s = std::make_shared<DeviceBuffer>(be_.alloc(DType::U8, sdims));
    be_.copy(host->tensor(), s->tensor());
    w_.owners.push_back(s);
    w.scale_inv = s->tensor();
    w.block_n = 1;
    w.block_k = 32;
    return w;
  }
  // fn [rows, hc * H], base [rows], scale [scales].
  V4HyperConnection hc(int64_t rows, int64_t scales) {
    const int64_t hc = c_.hc_mult, H = c_.base.hidden_size;
    return {host_f32({rows, hc * H}, 0.0f, std::sqrt(3.0f / static_cast<float>(hc * H))),
            host_f32({rows}, 0.0f, 0.1f), host_f32({scales}, 0.5f, 0.1f)};
  }
  V4Compressor compressor(int64_t width, int64_t d, int ratio) {
    V4Compressor out;
    out.wkv = linear(width, c_.base.hidden_size, false);
    out.wgate = linear(width, c_.base.hidden_size, false);
    out.ape = host_f32({ratio, width}, 0.0f, 0.1f);
    out.norm = host_f32({d}, 1.0f, 0.1f);
    return out;
  }
  V4Layer layer(V4AttentionKind kind, bool hash) {
    const int64_t H = c_.base.hidden_size, heads = c_.base.num_attention_heads, D = c_.head_dim;
    const int64_t E = c_.base.n_routed_experts, K = c_.base.num_experts_per_tok, I = c_.base.moe_intermediate_size;
    const int64_t ql = c_.base.q_lora_rank, mixes = (2 + c_.hc_mult) * c_.hc_mult;
    V4Layer L;
    L.kind = kind;
    L.attn_norm = host_f32({H}, 1.0f, 0.1f);
    L.ffn_norm = host_f32({H}, 1.0f, 0.1f);
    L.hc_attn = hc(mixes, 3);
    L.hc_ffn = hc(mixes, 3);
    L.wq_a = linear(ql, H, true);
    L.q_norm = host_f32({ql}, 1.0f, 0.1f);
    L.wq_b = linear(heads * D, ql, true);
    L.wkv = linear(D, H, true);
    L.kv_norm = host_f32({D}, 1.0f, 0.1f);
    L.wo_a = linear(c_.o_groups * c_.o_lora_rank, heads * D / c_.o_groups, false);  // sliced per group: not FP8
    L.wo_b = linear(H, c_.o_groups * c_.o_lora_rank, true);
    L.sinks = host_f32({heads}, 0.0f, 1.0f);
    if (kind == V4AttentionKind::Csa) {
      L.compressor = compressor(2 * D, D, c_.csa_rate);
      L.index_compressor = compressor(2 * c_.index_head_dim, c_.index_head_dim, c_.csa_rate);
      L.index_wq_b = linear(c_.index_n_heads * c_.index_head_dim, ql, false);
      L.index_weights_proj = linear(c_.index_n_heads, H, false);
    } else if (kind == V4AttentionKind::Hca) {
      L.compressor = compressor(D, D, c_.hca_rate);
    }
    L.hash = hash;
    L.gate = linear(E, H, false);
    if (hash) {
      L.tid2eid.resize(static_cast<size_t>(c_.base.vocab_size * K));
      const uint64_t s = next_seed();
      // Token t's K distinct experts: a random start and stride 1 (mod E).
      for (int64_t t = 0; t < c_.base.vocab_size; ++t) {
        const int64_t start = static_cast<int64_t>(random_hash(s, static_cast<uint64_t>(t)) % static_cast<uint64_t>(E));
        for (int64_t k = 0; k < K; ++k) L.tid2eid[static_cast<size_t>(t * K + k)] = static_cast<int32_t>((start + k) % E);
      }
    } else {
      L.gate_bias = host_f32({E}, 0.0f, 0.01f);
    }
    L.experts.resize(static_cast<size_t>(E));
    for (ExpertWeights& e : L.experts) {
      e.gate = expert_linear(I, H);
      e.up = expert_linear(I, H);
      e.down = expert_linear(H, I);
    }
    if (c_.base.n_shared_experts > 0) {
      L.shared.gate = linear(I, H, true);
      L.shared.up = linear(I, H, true);
      L.shared.down = linear(H, I, true);
    }
    return L;
  }

 private:
  uint64_t next_seed() { return random_hash(seed_, index_++); }

  const DeepseekV4Config& c_;
  uint64_t seed_, index_ = 0;
  DType dense_;
  bool fp4_;
  Backend& be_;
  V4Weights& w_;
  std::map<std::vector<int64_t>, std::shared_ptr<HostBuffer>> scale_bytes_;  // one constant host copy per shape
};

}  // namespace

V4Weights make_random_v4_weights(const DeepseekV4Config& c, uint64_t seed, DType dense_dtype, bool fp4_experts,
                                 Backend& backend) {
  DI_CHECK(dense_dtype == DType::BF16 || dense_dtype == DType::F8_E4M3 || dense_dtype == DType::F32,
           c.base.source, ": random V4 weights are BF16, F32 or F8_E4M3, not ", dtype_name(dense_dtype));
  V4Weights w;
  RandomBuilder b(c, seed, dense_dtype, fp4_experts, backend, w);
  const int64_t H = c.base.hidden_size, V = c.base.vocab_size, hc = c.hc_mult;
  w.embed = b.device(dense_dtype == DType::F32 ? DType::F32 : DType::BF16, {V, H}, 1.0f);
  w.norm = b.host_f32({H}, 1.0f, 0.1f);
  w.head = b.linear(V, H, false);
  w.hc_head = b.hc(hc, 1);
  for (int l = 0; l < c.num_layers(); ++l)
    w.layers.push_back(b.layer(c.attention[static_cast<size_t>(l)], c.hash_moe[static_cast<size_t>(l)]));
  backend.synchronize();
  return w;
}

}  // namespace deepinfer
