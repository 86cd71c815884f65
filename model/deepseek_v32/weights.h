// V3.2's tensors beyond V3's: model.layers.{i}.self_attn.indexer.{wq_b, wk, k_norm,
// weights_proj} (MODELS.md), each checked against the config when assembled.
#pragma once
#include <memory>
#include <vector>

#include "model/config.h"
#include "model/layers/indexer.h"
#include "model/weights.h"

namespace deepinfer {

class CheckpointReader;

// The indexer weights of every main layer, then of `num_mtp` MTP blocks (layer ids
// num_hidden_layers ..), from `source`; throws Error naming the tensor, its source, its
// shape and the expected one. Linears are F32/BF16 or F8_E4M3 with
// `.weight_scale_inv` F32 [ceil(out/block_n), ceil(in/block_k)]; k_norm weight and bias
// F32/BF16.
std::vector<IndexerWeights> assemble_indexer_weights(const ModelConfig& config,
                                                     const TensorSource& source, int num_mtp = 0);
// The same over a checkpoint (zero copy): the registry's check_extra_weights.
std::vector<IndexerWeights> load_indexer_weights(const ModelConfig& config,
                                                 const CheckpointReader& reader, int num_mtp = 0);
// Copies every indexer tensor to `backend` once (a device forward); the device buffers are
// appended to `owners` (ModelWeights::owners of the uploaded model).
std::vector<IndexerWeights> upload_indexer_weights(const std::vector<IndexerWeights>& host,
                                                   Backend& backend,
                                                   std::vector<std::shared_ptr<const void>>& owners);

// Random indexer weights (bench, tests): every main layer's (then `num_mtp` MTP blocks')
// indexer tensors as a checkpoint
// of `weight_dtype` lays them out (model/weights.h RandomLayout: wq_b and wk block-scaled FP8
// in an FP8 layout, weights_proj and the LayerNorm dense, as in the official checkpoint),
// numbered after checkpoint_layout(config, weight_dtype, true)'s tensors (the same values
// whatever num_mtp). Host buffers when
// `backend` is nullptr, else made on it; the buffers are appended to `owners`.
std::vector<IndexerWeights> make_random_indexer_weights(const ModelConfig& config, uint64_t seed,
                                                        DType weight_dtype, Backend* backend,
                                                        std::vector<std::shared_ptr<const void>>& owners,
                                                        int num_mtp = 0);

}  // namespace deepinfer
