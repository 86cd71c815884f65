#include "model/layers/moe.h"

#include <algorithm>

#include "model/layers/common.h"

namespace deepinfer {

FfnWorkspace make_ffn_workspace(const FfnDims& d, Backend& backend, int64_t capacity) {
  FfnWorkspace ws;
  ws.capacity = capacity;
  const DType dt = backend.activation_dtype();
  const int64_t inter = std::max<int64_t>(d.max_intermediate, 1);
  const int64_t experts = std::max<int64_t>(d.n_routed_experts, 1);
  const int64_t top_k = std::max<int64_t>(d.top_k, 1);
  auto make = [&](DType dtype, int64_t cols) {
    ws.buffers.push_back(backend.alloc(dtype, {capacity, cols}));
    return ws.buffers.back().tensor();
  };
  ws.gate_up = make(dt, 2 * inter);
  ws.act = make(dt, inter);
  ws.router = make(DType::F32, experts);
  ws.topk_ids = make(DType::I32, top_k);
  ws.topk_weights = make(DType::F32, top_k);
  ws.shared = make(dt, d.hidden);
  return ws;
}

namespace {

// SwiGLU MLP: out = down(silu(gate(x)) * up(x)), or out += that when accumulate (the shared
// experts add onto the routed output). gate | up in one op, the gate fused into down.
void swiglu_mlp(Backend& backend, const ExpertWeights& w, const Tensor& x, FfnWorkspace& ws,
                Tensor& out, bool accumulate) {
  const int64_t T = x.size(0), I = w.gate.out_features();
  DI_CHECK(T <= ws.capacity && 2 * I <= ws.gate_up.size(1), "mlp_forward: ", T, " tokens x ", I,
           " intermediate exceed the workspace");
  Tensor gate = cols_view(ws.gate_up, T, I, 0);  // [T, I] (row stride 2 * max_I)
  Tensor up = cols_view(ws.gate_up, T, I, I);    // [T, I]
  backend.gemm_pair(x, w.gate, w.up, gate, up);
  Tensor gate_up = cols_view(ws.gate_up, T, 2 * I);  // [T, gate | up]
  backend.gemm_swiglu(gate_up, w.down, out, accumulate);
}

}  // namespace

void mlp_forward(Backend& backend, const ExpertWeights& w, const Tensor& x, FfnWorkspace& ws,
                 Tensor& out) {
  swiglu_mlp(backend, w, x, ws, out, false);
}

void moe_forward(Backend& backend, const MoeRouting& routing, const MoeWeights& w, const Tensor& x,
                 FfnWorkspace& ws, Tensor& out) {
  const int64_t T = x.size(0);
  DI_CHECK(T <= ws.capacity, "moe_forward: ", T, " tokens exceed the workspace");
  // The shared experts on the backend's side line (CUDA: a second stream), overlapping the
  // routing and the routed experts; out += shared(x) after both, with the same ops and
  // roundings as the in-line `accumulate` form (gemm into a buffer of out's dtype, then add).
  const bool side = w.has_shared() && ws.shared.dtype == out.dtype;
  Tensor shared;
  if (side) {
    shared = cols_view(ws.shared, T, out.size(1));
    backend.side_begin();
    swiglu_mlp(backend, w.shared, x, ws, shared, false);
    backend.side_end();
  }
  Tensor ids, weights;
  moe_route(backend, routing, w, x, ws, ids, weights);
  DI_CHECK(static_cast<int64_t>(w.experts.size()) == routing.num_experts, "moe_forward: ", w.experts.size(),
           " experts for a routing over ", routing.num_experts, " (expert parallelism dispatches: expert_parallel.h)");
  backend.moe_experts(x, ids, weights, w.experts, out);
  if (side) {
    backend.side_join();
    backend.add(out, shared);
  } else if (w.has_shared()) {
    swiglu_mlp(backend, w.shared, x, ws, out, true);  // out += shared(x)
  }
}

void moe_route(Backend& backend, const MoeRouting& routing, const MoeWeights& w, const Tensor& x,
               FfnWorkspace& ws, Tensor& ids, Tensor& weights) {
  const int64_t T = x.size(0);
  DI_CHECK(T <= ws.capacity, "moe_route: ", T, " tokens exceed the workspace");
  Tensor logits = cols_view(ws.router, T, routing.num_experts);  // [T, E] fp32
  backend.gemm(x, w.gate, logits);
  ids = cols_view(ws.topk_ids, T, routing.top_k);        // [T, k]
  weights = cols_view(ws.topk_weights, T, routing.top_k);  // [T, k]
  backend.moe_routing(logits, w.e_score_correction_bias, routing, ids, weights);
}

// The side-line form's ops (a buffer of out's dtype, then add) where moe_forward takes it, else
// the in-line accumulate: the same bits as moe_forward's shared part either way.
void moe_add_shared(Backend& backend, const MoeWeights& w, const Tensor& x, FfnWorkspace& ws, Tensor& out) {
  if (!w.has_shared()) return;
  if (ws.shared.dtype != out.dtype) {
    swiglu_mlp(backend, w.shared, x, ws, out, true);
    return;
  }
  Tensor shared = cols_view(ws.shared, x.size(0), out.size(1));
  swiglu_mlp(backend, w.shared, x, ws, shared, false);
  backend.add(out, shared);
}

}  // namespace deepinfer
