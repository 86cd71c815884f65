// ModelWeights: a DeepSeek-V2/V3 checkpoint arranged for the forward pass, as
// views (host mmapped, host random, or device after upload). Names follow the
// HF checkpoint (MODELS.md); every tensor's shape and dtype is checked against
// the config when weights are assembled.
//
// Layouts accepted for routed experts:
//  - per-expert (official): mlp.experts.{e}.{gate_proj,up_proj,down_proj}.weight
//    [I, H], [I, H], [H, I] (+ .weight_scale_inv for FP8);
//  - fused (transformers 5 saves): mlp.experts.gate_up_proj [E, 2I, H] whose
//    rows [0, I) are gate and [I, 2I) are up (DeepseekV3Experts: linear(x,
//    gate_up_proj[e]).chunk(2, dim=-1) -> gate, up), and mlp.experts.down_proj
//    [E, H, I]. Loaded as per-expert zero-copy views.
// FP8 (quantization_config.quant_method "fp8"): a linear weight is F8_E4M3
// [N, K] plus `<name>_scale_inv` (i.e. `...weight_scale_inv`) F32
// [ceil(N/block_n), ceil(K/block_k)]; BF16/F32 linears have no scale.
#pragma once
#include <cstdint>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/random.h"
#include "model/config.h"
#include "model/model.h"

namespace deepinfer {

class CheckpointReader;

struct AttentionWeights {
  Weight q_a_proj;         // [q_lora_rank, H]              (q_lora_rank > 0)
  Tensor q_a_layernorm;    // [q_lora_rank]
  Weight q_b_proj;         // [heads * qk_head_dim, q_lora_rank]
  Weight q_proj;           // [heads * qk_head_dim, H]      (q_lora_rank == 0)
  Weight kv_a_proj_with_mqa;  // [kv_lora_rank + qk_rope_head_dim, H]
  Tensor kv_a_layernorm;   // [kv_lora_rank]
  Weight kv_b_proj;        // [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
  Weight o_proj;           // [H, heads * v_head_dim]
};

struct MoeWeights {
  Weight gate;                          // router [E, H] (never FP8)
  Tensor e_score_correction_bias;       // F32 [E]; undefined for V2
  std::vector<ExpertWeights> experts;   // E routed experts, I = moe_intermediate_size
  ExpertWeights shared;                 // I = n_shared * moe_intermediate; undefined if none
  bool has_shared() const { return shared.gate.w.defined(); }
};

struct LayerWeights {
  Tensor input_layernorm;           // [H]
  Tensor post_attention_layernorm;  // [H]
  AttentionWeights attn;
  bool is_moe = false;
  ExpertWeights mlp;  // dense SwiGLU, I = intermediate_size (when !is_moe)
  MoeWeights moe;     // when is_moe
};

// One MTP module (layer id num_hidden_layers + k): h' = block(eh_proj([hnorm(h);
// enorm(embed(t))])), logits = head(shared_head_norm(h')).
struct MtpWeights {
  Tensor enorm;             // [H]
  Tensor hnorm;             // [H]
  Weight eh_proj;           // [H, 2H]
  LayerWeights block;       // always MoE in V3 (id >= first_k_dense_replace)
  Tensor shared_head_norm;  // [H]
  Tensor embed_tokens;      // [V, H] own copy when the checkpoint has one; else undefined
  Weight shared_head;       // [V, H] own copy when present; else undefined (use lm_head)
};

struct ModelWeights {
  Tensor embed_tokens;  // [V, H]
  std::vector<LayerWeights> layers;
  Tensor norm;          // [H]
  Weight lm_head;       // [V, H] (a view of embed_tokens when tie_word_embeddings)
  std::vector<MtpWeights> mtp;  // empty unless present in the checkpoint and requested
  // Keeps the memory behind every view alive (mmapped checkpoint, host or device buffers).
  std::vector<std::shared_ptr<const void>> owners;

  // Calls fn(name, tensor) for every distinct tensor slot (weights and scales),
  // in a fixed order; tied/shared views are visited at each slot.
  void for_each_tensor(const std::function<void(const std::string& name, Tensor& t)>& fn);
};

// Where assemble_weights gets tensors from: returns the tensor named `name`,
// or nullopt when absent; `describe(name)` names its source in errors
// (e.g. the shard path).
struct TensorSource {
  std::function<std::optional<Tensor>(const std::string& name)> find;
  std::function<std::string(const std::string& name)> describe;
};

// Builds ModelWeights from named tensors, checking every name, shape and dtype
// against `config` (Error names the tensor, its source, its shape and the
// expected shape). Does not touch tensor data, so the source may hold device
// tensors. Loads MTP layers when `load_mtp` and the source has them.
ModelWeights assemble_weights(const ModelConfig& config, const TensorSource& source,
                              bool load_mtp);

// Opens `dir` (CheckpointReader) and assembles its weights (zero copy). With
// options.progress set, first touches every page and reports bytes.
ModelWeights load_weights(const std::string& dir, const ModelConfig& config,
                          const LoadOptions& options = {});
ModelWeights load_weights(std::shared_ptr<const CheckpointReader> reader,
                          const ModelConfig& config, const LoadOptions& options = {});

// Copies every tensor to `backend` once (identical views, e.g. tied embeddings,
// share one allocation); the result's owners hold the device buffers.
ModelWeights upload_weights(const ModelWeights& host, Backend& backend);

// ---------------------------------------------------------------------------
// Random weights, deterministic from a seed and reproducible on any device.
//
// checkpoint_layout() lists every tensor of a checkpoint for `config`, in a
// canonical order (per-expert names, official layout), with how to fill it.
// Tensor number k (its index in that list) uses tensor_seed = random_hash(seed, k)
// (backend/random.h) and element i is
//   value = fmaf(random_uniform(tensor_seed, i), fill.mul, fill.add)
// rounded to the tensor's dtype (RNE; F8_E4M3 saturating). When fill.add == 0
// this is exactly Backend::fill_random(t, tensor_seed, fill.mul), so big tensors
// are generated on the device; the small ones with add != 0 (norms, FP8 scales)
// are made on the host and copied.
// Linear weights: mul = sqrt(3/fan_in) (uniform, std 1/sqrt(fan_in)); embedding: sqrt(3).
// FP8 linears: the F8 tensor has mul = 448 (uniform over the e4m3 range); its
// scale_inv (F32) has add = 1.5 base, mul = 0.5 base with base = sqrt(3/fan_in) / 448,
// so block scales vary in [base, 2 base). Norms: add 1, mul 0.1.
// e_score_correction_bias: mul 0.01.
// Rounding per dtype: F32 / BF16 / F8_E4M3 as said; I8 / U8 (FP4 e2m1 packed two per byte, V4's
// and V4.1's routed experts): the e4m3 byte of the value (mul 448: uniform over the e4m3 codes,
// none a NaN; every byte is two valid e2m1 codes); F8_E8M0 (scale bytes): 127 + floor(log2 |v|)
// clamped to [0, 254] (exact for a power of two, never 0xff, the NaN code).
struct RandomFill {
  float mul = 0.0f;
  float add = 0.0f;
};
struct TensorSpec {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  RandomFill fill;
  // Made and kept on the host even when make_random_tensors is given a backend: tensors the
  // loader reads on the host (the V4 family's norms, block scales, router; V4TensorLoader).
  bool host = false;
};
// weight_dtype: BF16, F32 (everything in that dtype, bias F32) or F8_E4M3
// (block-scaled linears, as in the official V3 checkpoint: embeddings, norms,
// router and lm_head stay BF16, bias F32).
std::vector<TensorSpec> checkpoint_layout(const ModelConfig& config, DType weight_dtype,
                                          bool include_mtp);

// The value of element `element_index` of layout tensor `tensor_index` before rounding.
inline float random_weight_value(uint64_t seed, uint64_t tensor_index, uint64_t element_index,
                                 RandomFill fill) {
  return std::fmaf(random_uniform(random_hash(seed, tensor_index), element_index), fill.mul,
                   fill.add);
}

// Builds a tensor list the way checkpoint_layout does, for an architecture whose checkpoint
// has tensors beyond V3's (model/deepseek_v32's indexer).
class RandomLayout {
 public:
  RandomLayout(const ModelConfig& config, DType weight_dtype);  // weight_dtype as above
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, RandomFill fill,
           bool host = false);
  // A norm weight [dim] (fill: add 1, mul 0.1 by default) in the dense dtype.
  void norm(const std::string& name, int64_t dim, RandomFill fill = {0.1f, 1.0f});
  // prefix.weight [n, k] (and its FP8 block scales when quantizable in an FP8 layout); host: the
  // weight stays on the host (TensorSpec::host).
  void linear(const std::string& prefix, int64_t n, int64_t k, bool quantizable = true, bool host = false);
  // prefix.weight [n, k / 2] FP4 e2m1 codes (I8, two per byte) and prefix.scale [n, k / 32] E8M0
  // bytes, one power of two for the whole tensor: the largest code (6) times it near sqrt(3 / k).
  // k % 32 == 0.
  void fp4_linear(const std::string& prefix, int64_t n, int64_t k);
  // The V4 family's loaders read norms and block scales on the host (TensorSpec::host), and V4.1's
  // checkpoint has E8M0 block scales (the F32 draws above rounded down to a power of two).
  void set_v4_family(bool e8m0_scales) {
    small_on_host_ = true;
    e8m0_scales_ = e8m0_scales;
  }
  std::vector<TensorSpec> take() { return std::move(specs_); }
  DType dense_dtype() const { return dense_dtype_; }  // norms, embeddings, unquantized linears
  int64_t block_n() const { return block_n_; }
  bool fp8() const { return fp8_; }

 private:
  bool fp8_;
  DType dense_dtype_ = DType::BF16;
  int64_t block_n_ = 128;
  int64_t block_k_ = 128;
  bool small_on_host_ = false, e8m0_scales_ = false;
  std::vector<TensorSpec> specs_;
};

// The tensors of `specs` filled as above, tensor i of the list being layout tensor
// first_index + i (an extension list continues after checkpoint_layout's); host buffers when
// `backend` is nullptr, else allocated and filled on it (Backend::fill_random where fill.add == 0,
// I8 / U8 through an F8_E4M3 view; other fills made on the host and copied, constant ones
// (mul == 0) once per dtype, shape and value), except the specs marked host. `source` finds them
// by name. The same seed gives the same bits on every backend.
struct RandomTensors {
  TensorSource source;
  std::vector<std::shared_ptr<const void>> owners;
};
RandomTensors make_random_tensors(const std::vector<TensorSpec>& specs, uint64_t seed,
                                  uint64_t first_index, Backend* backend);

// Host buffers for every tensor of checkpoint_layout(config, weight_dtype, include_mtp),
// filled as above, assembled into ModelWeights (owners hold the buffers).
ModelWeights make_random_weights(const ModelConfig& config, uint64_t seed, DType weight_dtype,
                                 bool include_mtp = false);
// The same weights allocated on `backend` and filled there (fill_random for the big
// tensors): bit-identical to make_random_weights + upload_weights, without the host copy.
ModelWeights make_random_weights(const ModelConfig& config, uint64_t seed, DType weight_dtype,
                                 bool include_mtp, Backend& backend);
// Writes the same tensors to `dir`/model.safetensors (tests, tools).
void write_random_checkpoint(const ModelConfig& config, uint64_t seed, DType weight_dtype,
                             bool include_mtp, const std::string& dir);

}  // namespace deepinfer
