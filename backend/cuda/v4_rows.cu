// v4_decode_rows on CUDA (the reference: backend/cpu/v4_rows.cpp): one thread per (sequence,
// entry), the rule of backend/v4_rows_rule.h. Reads the step's context lengths and block
// tables on the device, so a decode step's row lists replay in CUDA graphs.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/v4_rows_rule.h"

namespace deepinfer::cuda {
namespace {

__global__ void v4_decode_rows_kernel(v4_rows_rule::Rule r, int64_t S, const int32_t* keys,
                                      const int32_t* rows_in, const int32_t* table, int32_t* slots,
                                      int32_t* index, int64_t ld_index) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= S * r.n) return;
  const int64_t s = i / r.n, j = i % r.n;
  const int64_t e = keys[s];
  const int32_t* row = table + (r.kind == v4_rows_rule::kTableRows ? 0 : s * r.width);
  const int32_t listed = r.kind == v4_rows_rule::kListed ? rows_in[i] : -1;
  int64_t ix = -1;
  slots[i] = v4_rows_rule::entry(r, s, j, e, row, listed, &ix);
  if (index != nullptr) index[s * ld_index + j] = static_cast<int32_t>(ix);
}

}  // namespace

void CudaBackend::v4_decode_rows(const Tensor& keys, const Tensor& rows_in, const Tensor& table,
                                 const V4RowRule& rule, Tensor& slots, Tensor& index) {
  const char* op = "v4_decode_rows";
  const v4_rows_rule::Rule r =
      v4_rows_rule::make_rule(rule, keys, rows_in, table, slots, index, op);
  check_device(keys, "v4_decode_rows keys");
  check_device(table, "v4_decode_rows table");
  check_device(slots, "v4_decode_rows slots");
  if (index.defined()) check_device(index, "v4_decode_rows index");
  if (rule.kind == V4RowRule::Kind::Listed) check_device(rows_in, "v4_decode_rows rows_in");
  const int64_t S = keys.size(0), total = S * r.n;
  if (total == 0) return;
  v4_decode_rows_kernel<<<ceil_div(total, 256), 256, 0, stream_>>>(
      r, S, keys.ptr<int32_t>(),
      rule.kind == V4RowRule::Kind::Listed ? rows_in.ptr<int32_t>() : nullptr, table.ptr<int32_t>(),
      slots.ptr<int32_t>(), index.defined() ? index.ptr<int32_t>() : nullptr,
      index.defined() ? index.stride[0] : 0);
  check_launch(op, keys.describe() + " -> " + slots.describe());
}

}  // namespace deepinfer::cuda
