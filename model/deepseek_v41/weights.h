// DeepSeek-V4.1 weights, read under the released checkpoint's names (`layers.N.attn.wq_a.weight`,
// `embed.weight`, `head.weight`, ...) or the PR's transformers names (the same under `model.`,
// `lm_head.weight`), each checked against the config (model/deepseek_v4/tensor_loader.h says how
// each dtype is read). Per layer as V4 (window attention, grouped output, sinks, hyper-connections,
// MoE) without V4's per-head query norm, compressor position bias, hash routing and hc_head; only a
// KV source has a compressor (`attn.compressor.{wkv, wgate (ratio > 1), norm}`), only an index
// source an indexer (`attn.indexer.{wq_b, weights_proj}`, a KV source's also `wk`, `k_norm`); the
// router has `bias` and `bias_vl` (image tokens).
#pragma once
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/deepseek_v4/weights.h"
#include "model/deepseek_v41/config.h"
#include "model/weights.h"

namespace deepinfer {

class CheckpointReader;

struct V41Layer {
  Tensor attn_norm, ffn_norm;  // F32 [H]
  V4HyperConnection hc_attn, hc_ffn;
  Weight wq_a;     // [q_lora, H]
  Tensor q_norm;   // F32 [q_lora]
  Weight wq_b;     // [heads * D, q_lora]
  Weight wkv;      // [D, H]
  Tensor kv_norm;  // F32 [D]
  Weight wo_a;     // [o_groups * o_lora, heads * D / o_groups] (F32/BF16)
  Weight wo_b;     // [H, o_groups * o_lora]
  Tensor sinks;    // F32 [heads]
  // KV source: the compressor (wgate only at ratio > 1).
  Weight comp_wkv, comp_wgate;  // [D, H]
  Tensor comp_norm;             // F32 [D]
  // Index source: the indexer's query and head weights; a KV source's also its key projection.
  Weight index_wq_b;               // [index_heads * index_dim, q_lora]
  Weight index_weights_proj;       // [index_heads, H]
  Weight index_wk;                 // [index_dim, D]
  Tensor index_k_norm;             // F32 [index_dim]
  Weight gate;                     // router [E, H], divided by gate_temp (F32)
  Tensor gate_bias, gate_bias_vl;  // F32 [E]
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;  // undefined when n_shared_experts == 0
  // Engram layer: `engram.embed.weight` [rows, engram_head_dim] F32/BF16/F8_E4M3 as mapped from the
  // checkpoint (rows = the layer's bucket primes summed, engram_hash.h), `engram.wkv`
  // [(hc + 1) * H, cols * engram_head_dim], q_weight * k_weight (F32 [hc, H], used only as that
  // product).
  Tensor engram_table;
  Tensor engram_scale;  // F8_E4M3 tables: `engram.embed.scale` [rows, head_dim / 32] (E8M0/F32)
  Weight engram_wkv;
  Tensor engram_weight;
};

// The DSpark drafter (dspark.h; names as DeepSeek's V4 DSpark checkpoints ship them, `mtp.S.*`).
struct DsparkWeights {
  std::vector<V41Layer> stages;  // window-only blocks (no compressor, indexer or Engram)
  Weight main_proj;              // [H, taps * H]: fuses the target layers' outputs
  Tensor main_norm;              // F32 [H]
  V4HyperConnection hc_head;     // [hc, hc * H], [hc], [1]
  Tensor norm;                   // F32 [H]
  Tensor markov_w1;              // [V, rank] F32/BF16 (undefined: no Markov head)
  Weight markov_w2;              // [V, rank]
  Weight confidence;             // [1, H (+ rank)] (undefined: no confidence head)
  bool loaded() const { return !stages.empty(); }
};

struct V41Weights {
  Tensor embed;  // [V, H]
  std::vector<V41Layer> layers;
  Tensor norm;                                // F32 [H]
  Weight head;                                // [V, H]
  // Engram: token id -> compressed id (vocab_size entries), from engram_token_map.safetensors
  // (tensor `token_map`, I32/I64 [vocab_size]) beside the checkpoint or a checkpoint tensor
  // `engram.token_map`; the PR derives it from the tokenizer (engram_hash.h). Random weights:
  // id % engram_compressed_vocab_size.
  std::vector<int32_t> engram_token_map;
  DsparkWeights dspark;  // loaded when the config declares drafter layers and `mtp.0.main_proj` exists
  std::vector<std::shared_ptr<void>> owners;  // checkpoint mapping and converted copies
};

// Reads every main-layer tensor, the Engram tables and token map, and the DSpark drafter where the
// config declares drafter layers (num_nextn_predict_layers) and the checkpoint has
// `mtp.0.main_proj.weight` (a checkpoint without the drafter loads as the text model). Throws Error naming the tensor: missing, wrong shape or dtype, FP4 scales of the
// wrong shape, an Engram table whose rows do not match its bucket primes, a token map of the wrong
// size or whose distinct ids are not engram_compressed_vocab_size. packed_fp4 (the CUDA formats):
// routed experts shipped as FP4 e2m1 with E8M0 scale bytes stay packed (as load_v4_weights's: the
// CUDA expert kernels read them so), and an FP8 wo_a stays FP8 where o_lora_rank is a multiple of
// the scale block (its groups' row slices carry whole blocks); otherwise both are dequantized to F32.
V41Weights load_v41_weights(const DeepseekV41Config& config,
                            std::shared_ptr<const CheckpointReader> reader, bool packed_fp4 = false);

// The drafter alone (`mtp.S.*`, as load_v41_weights reads it) from `reader` into w.dspark: a drafter
// shipped beside its target, and the drafter's golden test.
void load_dspark_weights(const DeepseekV41Config& config, std::shared_ptr<const CheckpointReader> reader,
                         V41Weights& w);

// Random weights (bench, tests): every tensor load_v41_weights reads (the drafter's after all others,
// when the config declares drafter layers), under the released names, in
// weight_dtype (BF16, F32, or F8_E4M3: block-scaled linears as model/weights.h's RandomLayout makes
// them, E8M0 block scales; routers, compressors, indexers and the head stay in the dense dtype), F32
// hc / sinks / biases. fp4_experts (with F8_E4M3): the main layers' routed experts FP4 e2m1 (I8
// nibble-packed) with an E8M0 scale per 32, the checkpoint's format, the drafter's stages' too (as
// the main layers'; loaded packed on a device). wo_a is FP8 only where o_lora_rank is a multiple of the scale block (the loader keeps it
// FP8 then; otherwise it would dequantize it on the host), else in the dense dtype. Norms, hc,
// sinks, biases, block scales and the router are marked host (TensorSpec::host: the loader reads
// them there).
std::vector<TensorSpec> v41_random_specs(const DeepseekV41Config& config, DType weight_dtype,
                                         bool fp4_experts = false);
// Those tensors filled from `seed` (model/weights.h's make_random_tensors) and read as a
// checkpoint: on the host when `backend` is nullptr or the CPU backend, else made on the backend's
// device (Backend::fill_random; the host-marked ones on the host, uploaded by the model), FP4
// experts and FP8 wo_a kept packed as load_v41_weights(..., packed_fp4 = true) keeps them. The same
// seed gives the same bits on every backend.
V41Weights random_v41_weights(const DeepseekV41Config& config, uint64_t seed, DType weight_dtype,
                              bool fp4_experts = false, Backend* backend = nullptr);

}  // namespace deepinfer
