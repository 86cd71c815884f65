// Random checkpoints: the canonical tensor list of a config and its
// counter-based fill (weights.h), on the host.
#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <sys/stat.h>

#include "core/error.h"
#include "io/safetensors_writer.h"
#include "model/weights.h"

namespace deepinfer {

RandomLayout::RandomLayout(const ModelConfig& c, DType weight_dtype)
    : fp8_(weight_dtype == DType::F8_E4M3) {
  DI_CHECK(weight_dtype == DType::BF16 || weight_dtype == DType::F8_E4M3 ||
               weight_dtype == DType::F32,
           "random weights: dtype ", dtype_name(weight_dtype), " is not supported (BF16, F32 or F8_E4M3)");
  dense_dtype_ = fp8_ ? DType::BF16 : weight_dtype;
  if (c.quantization.is_fp8()) {
    block_n_ = c.quantization.block_n;
    block_k_ = c.quantization.block_k;
  }
}

void RandomLayout::add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                       RandomFill fill, bool host) {
  specs_.push_back({name, dtype, std::move(shape), fill, host});
}

void RandomLayout::norm(const std::string& name, int64_t dim, RandomFill fill) {
  add(name, dense_dtype_, {dim}, fill, small_on_host_);
}

void RandomLayout::linear(const std::string& prefix, int64_t n, int64_t k, bool quantizable, bool host) {
  const float bound = static_cast<float>(std::sqrt(3.0 / static_cast<double>(k)));
  if (fp8_ && quantizable) {
    add(prefix + ".weight", DType::F8_E4M3, {n, k}, {448.0f, 0.0f}, host);
    const float base = bound / 448.0f;
    add(prefix + ".weight_scale_inv", e8m0_scales_ ? DType::F8_E8M0 : DType::F32,
        {(n + block_n_ - 1) / block_n_, (k + block_k_ - 1) / block_k_}, {base * 0.5f, base * 1.5f},
        small_on_host_ || host);
  } else {
    add(prefix + ".weight", dense_dtype_, {n, k}, {bound, 0.0f}, host);
  }
}

void RandomLayout::fp4_linear(const std::string& prefix, int64_t n, int64_t k) {
  DI_CHECK(k % 32 == 0, "random weights: FP4 tensor '", prefix, ".weight' needs K % 32 == 0 (E8M0 scales per 32), K = ", k);
  const int e = static_cast<int>(std::floor(std::log2(std::sqrt(3.0 / static_cast<double>(k)) / 6.0)));
  add(prefix + ".weight", DType::I8, {n, k / 2}, {448.0f, 0.0f});
  add(prefix + ".scale", DType::F8_E8M0, {n, k / 32}, {0.0f, std::ldexp(1.0f, e)});
}

namespace {

class LayoutBuilder {
 public:
  LayoutBuilder(const ModelConfig& c, DType weight_dtype) : c_(c), layout_(c, weight_dtype) {}

  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, RandomFill fill) {
    layout_.add(name, dtype, std::move(shape), fill);
  }
  void norm(const std::string& name, int64_t dim) { layout_.norm(name, dim); }
  void linear(const std::string& prefix, int64_t n, int64_t k, bool quantizable = true) {
    layout_.linear(prefix, n, k, quantizable);
  }
  void mlp(const std::string& p, int64_t intermediate) {
    linear(p + "gate_proj", intermediate, c_.hidden_size);
    linear(p + "up_proj", intermediate, c_.hidden_size);
    linear(p + "down_proj", c_.hidden_size, intermediate);
  }
  void layer(int id) {
    const std::string p = "model.layers." + std::to_string(id) + ".";
    const int64_t H = c_.hidden_size, heads = c_.num_attention_heads;
    norm(p + "input_layernorm.weight", H);
    const std::string s = p + "self_attn.";
    if (c_.has_q_lora()) {
      linear(s + "q_a_proj", c_.q_lora_rank, H);
      norm(s + "q_a_layernorm.weight", c_.q_lora_rank);
      linear(s + "q_b_proj", heads * c_.qk_head_dim(), c_.q_lora_rank);
    } else {
      linear(s + "q_proj", heads * c_.qk_head_dim(), H);
    }
    linear(s + "kv_a_proj_with_mqa", c_.kv_row_dim(), H);
    norm(s + "kv_a_layernorm.weight", c_.kv_lora_rank);
    linear(s + "kv_b_proj", heads * (c_.qk_nope_head_dim + c_.v_head_dim), c_.kv_lora_rank);
    linear(s + "o_proj", H, heads * c_.v_head_dim);
    norm(p + "post_attention_layernorm.weight", H);
    if (!c_.is_moe_layer(id)) {
      mlp(p + "mlp.", c_.intermediate_size);
      return;
    }
    linear(p + "mlp.gate", c_.n_routed_experts, H, /*quantizable=*/false);
    if (c_.scoring_func == "sigmoid") {
      add(p + "mlp.gate.e_score_correction_bias", DType::F32, {c_.n_routed_experts},
          {0.01f, 0.0f});
    }
    for (int e = 0; e < c_.n_routed_experts; ++e) {
      mlp(p + "mlp.experts." + std::to_string(e) + ".", c_.moe_intermediate_size);
    }
    if (c_.n_shared_experts > 0) mlp(p + "mlp.shared_experts.", c_.shared_intermediate_size());
  }

  std::vector<TensorSpec> build(bool include_mtp) {
    const int64_t H = c_.hidden_size;
    add("model.embed_tokens.weight", layout_.dense_dtype(), {c_.vocab_size, H},
        {std::sqrt(3.0f), 0.0f});
    for (int l = 0; l < c_.num_hidden_layers; ++l) layer(l);
    norm("model.norm.weight", H);
    if (!c_.tie_word_embeddings) linear("lm_head", c_.vocab_size, H, /*quantizable=*/false);
    for (int k = 0; include_mtp && k < c_.num_nextn_predict_layers; ++k) {
      const int id = c_.num_hidden_layers + k;
      const std::string p = "model.layers." + std::to_string(id) + ".";
      norm(p + "enorm.weight", H);
      norm(p + "hnorm.weight", H);
      linear(p + "eh_proj", H, 2 * H);
      layer(id);
      norm(p + "shared_head.norm.weight", H);
    }
    return layout_.take();
  }

 private:
  const ModelConfig& c_;
  RandomLayout layout_;
};

// Fills `out` (numel elements of spec.dtype) with tensor `index` of the layout.
void fill(const TensorSpec& spec, uint64_t seed, uint64_t index, void* out, int64_t numel) {
  for (int64_t i = 0; i < numel; ++i) {
    const float v = random_weight_value(seed, index, static_cast<uint64_t>(i), spec.fill);
    switch (spec.dtype) {
      case DType::F32:
        static_cast<float*>(out)[i] = v;
        break;
      case DType::BF16:
        static_cast<uint16_t*>(out)[i] = float_to_bf16(v);
        break;
      case DType::F8_E4M3:
      case DType::I8:
      case DType::U8:
        static_cast<uint8_t*>(out)[i] = float_to_fp8_e4m3(v);
        break;
      case DType::F8_E8M0: {
        int e = 0;
        std::frexp(v, &e);  // |v| = m 2^e, m in [0.5, 1): floor(log2 |v|) = e - 1
        static_cast<uint8_t*>(out)[i] =
            v == 0.0f ? uint8_t{0} : static_cast<uint8_t>(std::clamp(126 + e, 0, 254));
        break;
      }
      default:
        fail("random weights: tensor '", spec.name, "' has unsupported dtype ", dtype_name(spec.dtype));
    }
  }
}

}  // namespace

std::vector<TensorSpec> checkpoint_layout(const ModelConfig& config, DType weight_dtype,
                                          bool include_mtp) {
  return LayoutBuilder(config, weight_dtype).build(include_mtp);
}

RandomTensors make_random_tensors(const std::vector<TensorSpec>& specs, uint64_t seed,
                                  uint64_t first_index, Backend* backend) {
  RandomTensors out;
  auto tensors = std::make_shared<std::map<std::string, Tensor>>();
  // Constant tensors (mul 0: every FP4 tensor's E8M0 scales) filled once per dtype, shape and
  // value on the host; kept until the copies have run.
  std::map<std::tuple<DType, std::vector<int64_t>, float>, std::shared_ptr<HostBuffer>> constants;
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& spec = specs[i];
    const uint64_t k = first_index + i;
    Tensor t;
    if (backend == nullptr || spec.host) {
      auto buffer = std::make_shared<HostBuffer>(spec.dtype, spec.shape);
      t = buffer->tensor();
      fill(spec, seed, k, t.data, t.numel());
      out.owners.push_back(std::move(buffer));
    } else {
      auto buffer = std::make_shared<DeviceBuffer>(backend->alloc(spec.dtype, spec.shape));
      t = buffer->tensor();
      if (spec.fill.add == 0.0f && spec.dtype != DType::F8_E8M0) {
        // fmaf(u, mul, 0) == mul * u: the backend's own fill_random gives the same bits (I8 / U8:
        // the e4m3 bytes, fill() above).
        Tensor view = t;
        if (view.dtype == DType::I8 || view.dtype == DType::U8) view.dtype = DType::F8_E4M3;
        backend->fill_random(view, random_hash(seed, k), spec.fill.mul);
      } else if (spec.fill.mul == 0.0f) {
        std::shared_ptr<HostBuffer>& host = constants[{spec.dtype, spec.shape, spec.fill.add}];
        if (!host) {
          host = std::make_shared<HostBuffer>(spec.dtype, spec.shape);
          fill(spec, seed, k, host->tensor().data, host->tensor().numel());  // no draw: any index
        }
        backend->copy(host->tensor(), t);
      } else {
        HostBuffer host(spec.dtype, spec.shape);
        fill(spec, seed, k, host.tensor().data, host.tensor().numel());
        backend->copy(host.tensor(), t);
        backend->synchronize();  // `host` dies at the end of this scope
      }
      out.owners.push_back(std::move(buffer));
    }
    tensors->emplace(spec.name, t);
  }
  if (backend != nullptr) backend->synchronize();
  const std::string where = backend == nullptr ? "random weights" : "random weights on " + backend->name();
  out.source.find = [tensors](const std::string& name) -> std::optional<Tensor> {
    auto it = tensors->find(name);
    if (it == tensors->end()) return std::nullopt;
    return it->second;
  };
  out.source.describe = [where](const std::string&) { return where; };
  return out;
}

namespace {

ModelWeights random_weights(const ModelConfig& config, uint64_t seed, DType weight_dtype,
                            bool include_mtp, Backend* backend) {
  RandomTensors t = make_random_tensors(checkpoint_layout(config, weight_dtype, include_mtp), seed, 0, backend);
  ModelWeights w = assemble_weights(config, t.source, include_mtp);
  w.owners = std::move(t.owners);
  return w;
}

}  // namespace

ModelWeights make_random_weights(const ModelConfig& config, uint64_t seed, DType weight_dtype,
                                 bool include_mtp) {
  return random_weights(config, seed, weight_dtype, include_mtp, nullptr);
}

ModelWeights make_random_weights(const ModelConfig& config, uint64_t seed, DType weight_dtype,
                                 bool include_mtp, Backend& backend) {
  return random_weights(config, seed, weight_dtype, include_mtp, &backend);
}

void write_random_checkpoint(const ModelConfig& config, uint64_t seed, DType weight_dtype,
                             bool include_mtp, const std::string& dir) {
  const std::vector<TensorSpec> specs = checkpoint_layout(config, weight_dtype, include_mtp);
  SafetensorsWriter writer;
  for (size_t k = 0; k < specs.size(); ++k) {
    HostBuffer buffer(specs[k].dtype, specs[k].shape);
    fill(specs[k], seed, k, buffer.tensor().data, buffer.tensor().numel());
    writer.add(specs[k].name, buffer.tensor());
  }
  writer.set_metadata("format", "pt");
  ::mkdir(dir.c_str(), 0755);
  writer.write(dir + "/model.safetensors");
}

}  // namespace deepinfer
