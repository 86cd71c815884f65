// DeepSeek-V4 weights, read under DeepSeek's names (`layers.N.attn.wq_a.weight`, ...) or
// transformers' (`model.layers.N.self_attn.q_a_proj.weight`, fused experts; its
// conversion_mapping.py), each checked against the config. On the CPU reference path the
// small F32 tensors (hc, ape, sinks, norms) are F32 copies, FP8 e4m3 linears keep their
// bytes with F32 block scales (E8M0 scales converted), and FP4 e2m1 routed experts
// (I8 [out, in/2] + E8M0 [out, in/32]) are dequantized to F32 (core/quant.h).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/deepseek_v4/config.h"

namespace deepinfer {

class CheckpointReader;

struct V4HyperConnection {
  Tensor fn, base, scale;  // F32 [(2+hc)*hc, hc*H], [(2+hc)*hc], [3]  (hc_head: [hc, hc*H], [hc], [1])
};

struct V4Compressor {  // CSA (overlap: width 2D) or HCA (width D); the indexer's at its head dim
  Weight wkv, wgate;  // [width, H]
  Tensor ape;         // F32 [ratio, width]
  Tensor norm;        // F32 [D]
};

struct V4Layer {
  V4AttentionKind kind = V4AttentionKind::Window;
  Tensor attn_norm, ffn_norm;  // F32 [H]
  V4HyperConnection hc_attn, hc_ffn;
  Weight wq_a;        // [q_lora, H]
  Tensor q_norm;      // F32 [q_lora]
  Weight wq_b;        // [heads * D, q_lora]
  Weight wkv;         // [D, H]
  Tensor kv_norm;     // F32 [D]
  Weight wo_a;        // [o_groups * o_lora, heads * D / o_groups] (F32/BF16 on this path)
  Weight wo_b;        // [H, o_groups * o_lora]
  Tensor sinks;       // F32 [heads]
  V4Compressor compressor;          // CSA / HCA
  V4Compressor index_compressor;    // CSA only (index_head_dim)
  Weight index_wq_b;                // [index_heads * index_dim, q_lora]
  Weight index_weights_proj;        // [index_heads, H]
  bool hash = false;
  Weight gate;                      // router [E, H]
  Tensor gate_bias;                 // F32 [E] (non-hash layers)
  std::vector<int32_t> tid2eid;     // [vocab * top_k] (hash layers)
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;             // undefined when n_shared_experts == 0
};

// The MTP block (DeepSeek's MTPBlock; weights `mtp.N.*`, transformers' spelling
// `model.mtp.N.*` too): a window-only V4 block with a non-hash MoE between
// e_proj(enorm(embed(t))) + h_proj(hnorm(h)) and its own hc_head and norm (the embedding and
// head are the main model's).
struct V4MtpBlock {
  V4Layer block;
  Weight e_proj, h_proj;          // [H, H]
  Tensor enorm, hnorm, norm;      // F32 [H]
  V4HyperConnection hc_head;      // [hc, hc*H], [hc], [1]
};

struct V4Weights {
  Tensor embed;  // [V, H]
  std::vector<V4Layer> layers;
  std::vector<V4MtpBlock> mtp;  // num_nextn_predict_layers blocks when loaded
  V4HyperConnection hc_head;
  Tensor norm;   // F32 [H]
  Weight head;   // [V, H]
  std::vector<std::shared_ptr<void>> owners;  // checkpoint mapping and converted copies
};

// Reads every main-layer tensor and, with load_mtp, the num_nextn_predict_layers MTP blocks
// the config declares. Throws Error naming the tensor: missing (an MTP tensor of a config
// that declares MTP layers included), wrong shape or dtype, FP4 scales of the wrong shape,
// tid2eid ids outside [0, n_routed_experts).
// packed_fp4: routed experts shipped as FP4 e2m1 with E8M0 scale bytes stay packed (Weight w
// U8/I8 [N, K/2], scale_inv the scale bytes [N, K/32], block 1 x 32) for a backend that reads
// them so (CUDA's moe_fp4.cu); otherwise, and for F32 scales, they are dequantized to F32.
// mtp_optional: MTP blocks from the first one the checkpoint has no e_proj for are skipped
// (LoadOptions::mtp_optional).
V4Weights load_v4_weights(const DeepseekV4Config& config, std::shared_ptr<const CheckpointReader> reader,
                          bool load_mtp = true, bool packed_fp4 = false, bool mtp_optional = false);

// Random weights (bench, --random-weights; weights_random.cpp) from `seed`, made on `backend`:
// dense linears in dense_dtype (F8_E4M3: 128 x 128 blocks with power-of-two F32 scales; BF16;
// F32), the grouped wo_a, router, compressor and indexer projections BF16 (F32 when dense_dtype
// is), F32 small tensors; routed experts FP4 e2m1 packed with E8M0 scales per 32 (fp4_experts:
// V4-Flash's format; CUDA reads them packed, the CPU reference dequantizes them per step) or
// like the dense linears. No MTP block.
V4Weights make_random_v4_weights(const DeepseekV4Config& config, uint64_t seed, DType dense_dtype, bool fp4_experts,
                                 Backend& backend);

}  // namespace deepinfer
