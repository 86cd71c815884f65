// Feed-forward blocks of a DeepSeek layer, built from backend ops.
//  dense / shared expert: down(silu(gate(x)) * up(x))
//  MoE: router logits = x · W_gate^T (fp32) -> moe_routing -> moe_experts (routed, weighted)
//       + shared experts (transformers: experts(x) + shared_experts(x)).
#pragma once
#include <vector>

#include "backend/backend.h"
#include "model/layers/dims.h"
#include "model/weights.h"

namespace deepinfer {

// Scratch sized for `capacity` tokens, reused by every layer.
struct FfnWorkspace {
  std::vector<DeviceBuffer> buffers;
  Tensor gate_up;       // [cap, 2 * max_intermediate]
  Tensor act;           // [cap, max_intermediate]
  Tensor router;        // [cap, n_routed_experts] F32
  Tensor topk_ids;      // I32 [cap, top_k]
  Tensor topk_weights;  // F32 [cap, top_k]
  Tensor shared;        // [cap, hidden]
  int64_t capacity = 0;
};
FfnWorkspace make_ffn_workspace(const FfnDims& dims, Backend& backend, int64_t capacity);

// out [T, hidden] = SwiGLU MLP of x [T, hidden].
void mlp_forward(Backend& backend, const ExpertWeights& w, const Tensor& x, FfnWorkspace& ws,
                 Tensor& out);
// out [T, hidden] = routed experts + shared experts of x [T, hidden]; w holds every expert of the
// routing (expert parallelism dispatches rows to the experts' ranks instead: expert_parallel.h).
void moe_forward(Backend& backend, const MoeRouting& routing, const MoeWeights& w, const Tensor& x,
                 FfnWorkspace& ws, Tensor& out);

// The pieces of moe_forward that expert parallelism's dispatch (model/expert_parallel.h) runs
// around its own routed part, with moe_forward's ops and roundings:
// the router: ids I32 [T, k] and weights F32 [T, k] (views of ws) of x [T, hidden];
void moe_route(Backend& backend, const MoeRouting& routing, const MoeWeights& w, const Tensor& x,
               FfnWorkspace& ws, Tensor& ids, Tensor& weights);
// out += shared experts of x (nothing when the layer has none).
void moe_add_shared(Backend& backend, const MoeWeights& w, const Tensor& x, FfnWorkspace& ws, Tensor& out);

}  // namespace deepinfer
