#include "backend/backend.h"

#include "core/error.h"

namespace deepinfer {

DeviceBuffer Backend::alloc_host(DType dtype, const std::vector<int64_t>& dims) {
  auto buffer = std::make_shared<HostBuffer>(dtype, dims);
  return DeviceBuffer(buffer->tensor(), buffer);
}

// Speculative decoding's device fix-ups: the CPU backend (the reference) and CUDA implement them.
void Backend::spec_accept(const Tensor&, const Tensor&, int, Tensor&, Tensor&) {
  fail(name(), " backend: spec_accept (drafts in flight) is not implemented");
}
void Backend::spec_select_rows(const Tensor&, const Tensor&, int, Tensor&, Tensor&) {
  fail(name(), " backend: spec_select_rows (drafts in flight) is not implemented");
}
void Backend::spec_shift(const SpecShift&) {
  fail(name(), " backend: spec_shift (drafts in flight) is not implemented");
}

// Expert parallelism's combine: the CPU backend (the reference) and CUDA implement it.
void Backend::moe_combine(const Tensor&, const Tensor&, const Tensor&, Tensor&) {
  fail(name(), " backend: moe_combine (expert-parallel dispatch) is not implemented");
}

// DeepSeek sparse attention: the CPU backend implements these (the reference); other
// backends say so until they do (issue 14 item 6).
void Backend::layer_norm(const Tensor&, const Tensor&, const Tensor&, float, Tensor&) {
  fail(name(), " backend: layer_norm (V3.2 indexer keys) is not implemented");
}
void Backend::indexer_scores(const Tensor&, const Tensor&, const PagedKV&, float, Tensor&) {
  fail(name(), " backend: indexer_scores (DeepSeek sparse attention) is not implemented");
}
void Backend::indexer_topk(const Tensor&, const PagedKV&, Tensor&) {
  fail(name(), " backend: indexer_topk (DeepSeek sparse attention) is not implemented");
}
void Backend::mla_attention_paged_sparse(const Tensor&, const PagedKV&, const Tensor&, float, int,
                                         Tensor&) {
  fail(name(), " backend: mla_attention_paged_sparse (DeepSeek sparse attention) is not implemented");
}
void Backend::mla_attention_prefill_context(const Tensor&, const Tensor&, const Tensor&, const PagedKV&,
                                            float, Tensor&) {
  fail(name(), " backend: mla_attention_prefill_context is not implemented");
}
void Backend::kv_gather(const PagedKV&, Tensor&) { fail(name(), " backend: kv_gather is not implemented"); }
void Backend::mla_attention_prefill_sparse(const Tensor&, const Tensor&, const Tensor&,
                                           const Tensor&, int, const Tensor&, float, Tensor&) {
  fail(name(), " backend: mla_attention_prefill_sparse (DeepSeek sparse attention) is not implemented");
}

#ifndef DEEPINFER_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions&) { return nullptr; }
#endif

}  // namespace deepinfer
