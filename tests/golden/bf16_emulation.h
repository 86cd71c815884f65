// Bf16EmulationBackend: the CPU reference computing with the CUDA backend's storage precision.
// It reports BF16 activations, so a model allocates its activation buffers (act_) as BF16 and its
// F32 buffers (hyper-connection streams, router logits, indexer weights and scores, candidate
// biases, Engram keys / values, logits) as F32, exactly where the CUDA backend keeps them; every
// op converts its BF16 arguments to F32, runs the inner (CPU, F32) op and rounds its BF16 outputs
// to nearest even. F32 linear weights are rounded to BF16 as DeviceUploader does on CUDA, and the
// routed experts keep BF16 gate | up outputs and SwiGLU activations (the CUDA expert GEMMs'). What
// it leaves out: the CUDA kernels' own summation orders and any F32 -> BF16 rounding inside a
// kernel other than those (its results are the rounding points alone).
//
// Why: to tell a CUDA numerics bug from the sensitivity of a checkpoint to BF16 storage. A test
// runs this backend through the same replay harness as CUDA (cuda_golden.h) and compares its
// distance from the oracle with CUDA's (tests/golden/test_golden_v41.cpp, GoldenV41Bf16Emulation).
// Used for DeepSeek-V4.1 only: the ops it converts are those V4.1's forward calls (others run on
// the inner backend unchanged, and fail there on BF16 arguments).
#pragma once
#include <map>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "forwarding_backend.h"

namespace deepinfer::test {

class Bf16EmulationBackend final : public ForwardingBackend {
 public:
  explicit Bf16EmulationBackend(Backend& cpu) : ForwardingBackend(cpu) {}
  std::string name() const override { return "cpu (bf16 emulation)"; }
  DType activation_dtype() const override { return DType::BF16; }

  void embedding(const Tensor& ids, const Tensor& table, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void gemm(const Tensor& x, const Weight& w, Tensor& out) override;
  void rope(Tensor& x, const Tensor& positions, const Tensor& cos_sin, int rope_offset, int rope_dim,
            bool interleave) override;
  void add(Tensor& x, const Tensor& y) override;
  void kv_store(const Tensor& rows, PagedKV& kv) override;
  void silu_mul_clamped(const Tensor& gate_up, float limit, Tensor& out) override;
  void moe_experts_clamped(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                           const std::vector<ExpertWeights>& experts, float limit, Tensor& out) override;
  void sink_attention(const Tensor& q, const Tensor& kv, const Tensor& indices, const Tensor& sinks, float scale,
                      Tensor& out) override;
  void compressor_pool(const Tensor& kv, const Tensor& gate, const Tensor& ape, int ratio, bool overlap,
                       const Tensor& prior_kv, const Tensor& prior_gate, Tensor& out) override;
  void fake_quant(Tensor& x, FakeQuant kind) override;
  void store_packed_rows(const Tensor& x, FakeQuant kind, const PagedKV& kv) override;
  void gather_packed_rows(const Tensor& ids, const Tensor& cache, FakeQuant kind, Tensor& out) override;
  void hc_post(const Tensor& streams, const Tensor& f, const Tensor& post, const Tensor& comb, Tensor& out) override;
  void hc_collapse(const Tensor& streams, const Tensor& pre, Tensor& out) override;
  void embedding_fp8_rows(const Tensor& ids, const Tensor& table, const Tensor& scales, Tensor& out) override;
  void indexer_scores_visible(const Tensor& q, const Tensor& keys, const Tensor& weights, const Tensor& positions,
                              int ratio, float softmax_scale, float weights_scale, Tensor& scores) override;

 private:
  // w with an F32 matrix replaced by its BF16 rounding (cached per weight), else w.
  const Weight& device_weight(const Weight& w);
  std::map<const void*, std::pair<std::shared_ptr<HostBuffer>, Weight>> rounded_;
};

}  // namespace deepinfer::test
