// Speculative decoding with drafts in flight: the device fix-ups (Backend::spec_accept,
// spec_select_rows, spec_shift), one thread per sequence (a step holds at most a few
// hundred; each walks its q <= 17 tokens). The rules are backend/spec_rule.h's, as on the CPU.
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/spec_checks.h"
#include "backend/spec_rule.h"

namespace deepinfer::cuda {
namespace {

constexpr int kThreads = 128;
unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__global__ void spec_accept_kernel(const int32_t* ids, const int32_t* tokens, int q, int64_t S, int32_t* accepted,
                                   int32_t* last) {
  const int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (s >= S) return;
  const int32_t a = spec_rule::accepted_count(ids + s * q, tokens + s * q, q);
  accepted[s] = a;
  last[s] = ids[s * q + a];
}

__global__ void spec_select_kernel(const int32_t* ids, const int32_t* accepted, int q, int64_t S, int32_t* out_ids,
                                   int32_t* out_rows) {
  const int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (s >= S) return;
  const int32_t row = static_cast<int32_t>(s * q + accepted[s]);
  out_ids[s] = ids[row];
  out_rows[s] = row;
}

struct ShiftArgs {
  const int32_t* accepted;
  int assumed;
  const int32_t* query_start;
  int32_t* positions;
  int32_t* slots;
  int32_t* seq_lens;
  const int32_t* tables;
  int64_t width;
  int block_size;
  int32_t* tokens;
  const int32_t* first_tokens;  // null: not written
  const int32_t* drafts;
  int num_drafts;
  int64_t drafts_stride;
  int32_t* sample_params;  // null: none
  int rows_per_seq;
};

__global__ void spec_shift_kernel(ShiftArgs a, int64_t S) {
  const int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (s >= S) return;
  const int32_t delta = a.accepted[s] - a.assumed;
  const int32_t* table = a.tables + s * a.width;
  const int32_t t0 = a.query_start[s], t1 = a.query_start[s + 1];
  for (int32_t t = t0; t < t1; ++t) {
    const int32_t pos = a.positions[t] + delta;
    a.positions[t] = pos;
    if (a.slots[t] >= 0) a.slots[t] = spec_rule::slot_at(table, a.width, a.block_size, pos);
  }
  a.seq_lens[s] += delta;
  if (a.first_tokens != nullptr) a.tokens[t0] = a.first_tokens[s];
  for (int j = 0; j < a.num_drafts; ++j) a.tokens[t0 + 1 + j] = a.drafts[j * a.drafts_stride + s];
  if (a.sample_params != nullptr)
    for (int r = 0; r < a.rows_per_seq; ++r)
      spec_rule::shift_position(a.sample_params + (s * a.rows_per_seq + r) * kSampleRowWords, delta);
}

}  // namespace

void CudaBackend::spec_accept(const Tensor& ids, const Tensor& tokens, int q, Tensor& accepted, Tensor& last) {
  check_spec_accept(ids, tokens, q, accepted, last);
  for (const Tensor* t : {&ids, &tokens, &static_cast<const Tensor&>(accepted), &static_cast<const Tensor&>(last)})
    check_device(*t, "spec_accept");
  const int64_t S = accepted.numel();
  if (S == 0) return;
  spec_accept_kernel<<<blocks_for(S), kThreads, 0, stream_>>>(ids.ptr<int32_t>(), tokens.ptr<int32_t>(), q, S,
                                                             accepted.ptr<int32_t>(), last.ptr<int32_t>());
  check_launch("spec_accept", accepted.describe());
}

void CudaBackend::spec_select_rows(const Tensor& ids, const Tensor& accepted, int q, Tensor& out_ids,
                                   Tensor& out_rows) {
  check_spec_select_rows(ids, accepted, q, out_ids, out_rows);
  for (const Tensor* t : {&ids, &accepted, &static_cast<const Tensor&>(out_ids), &static_cast<const Tensor&>(out_rows)})
    check_device(*t, "spec_select_rows");
  const int64_t S = accepted.numel();
  if (S == 0) return;
  spec_select_kernel<<<blocks_for(S), kThreads, 0, stream_>>>(ids.ptr<int32_t>(), accepted.ptr<int32_t>(), q, S,
                                                             out_ids.ptr<int32_t>(), out_rows.ptr<int32_t>());
  check_launch("spec_select_rows", accepted.describe());
}

void CudaBackend::spec_shift(const SpecShift& f) {
  check_spec_shift(f);
  for (const Tensor* t : {&f.accepted, &f.query_start, &f.positions, &f.slots, &f.seq_lens, &f.block_tables})
    check_device(*t, "spec_shift");
  for (const Tensor* t : {&f.tokens, &f.first_tokens, &f.drafts, &f.sample_params})
    if (t->defined()) check_device(*t, "spec_shift");
  const int64_t S = f.accepted.numel();
  if (S == 0) return;
  ShiftArgs a;
  a.accepted = f.accepted.ptr<int32_t>();
  a.assumed = f.assumed;
  a.query_start = f.query_start.ptr<int32_t>();
  a.positions = f.positions.ptr<int32_t>();
  a.slots = f.slots.ptr<int32_t>();
  a.seq_lens = f.seq_lens.ptr<int32_t>();
  a.tables = f.block_tables.ptr<int32_t>();
  a.width = f.block_tables.size(1);
  a.block_size = f.block_size;
  a.tokens = f.tokens.defined() ? f.tokens.ptr<int32_t>() : nullptr;
  a.first_tokens = f.first_tokens.defined() ? f.first_tokens.ptr<int32_t>() : nullptr;
  a.drafts = f.num_drafts > 0 ? f.drafts.ptr<int32_t>() : nullptr;
  a.num_drafts = f.num_drafts;
  a.drafts_stride = f.drafts_stride;
  a.sample_params = f.sample_params.defined() ? f.sample_params.ptr<int32_t>() : nullptr;
  a.rows_per_seq = f.rows_per_seq;
  spec_shift_kernel<<<blocks_for(S), kThreads, 0, stream_>>>(a, S);
  check_launch("spec_shift", f.accepted.describe() + " " + f.positions.describe());
}

}  // namespace deepinfer::cuda
