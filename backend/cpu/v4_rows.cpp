// v4_decode_rows: DeepSeek-V4's decode addressing (host reference; backend.h). The rule of an
// entry is backend/v4_rows_rule.h, shared with the CUDA kernel.
#include "backend/backend.h"
#include "backend/v4_rows_rule.h"

namespace deepinfer {

namespace v4_rows_rule {

Rule make_rule(const Backend::V4RowRule& rule, const Tensor& keys, const Tensor& rows_in,
               const Tensor& table, const Tensor& slots, const Tensor& index, const char* op) {
  using Kind = Backend::V4RowRule::Kind;
  DI_CHECK(keys.ndim == 1 && slots.ndim == 2 && slots.size(0) == keys.size(0) &&
               keys.dtype == DType::I32 && slots.dtype == DType::I32 && slots.is_contiguous(),
           op, ": keys I32 [S] and contiguous slots I32 [S, n] expected, got ", keys.describe(),
           ", ", slots.describe());
  const int64_t S = keys.size(0), n = slots.size(1);
  DI_CHECK(table.defined() && table.dtype == DType::I32 && table.ndim == 2 && table.is_contiguous(),
           op, ": table must be contiguous I32 [rows, width], got ",
           table.defined() ? table.describe() : "undefined");
  const bool table_rows = rule.kind == Kind::TableRows, group_start = rule.kind == Kind::GroupStart;
  DI_CHECK(table_rows || group_start || table.size(0) >= S, op, ": table ", table.describe(),
           " has fewer rows than the ", S, " sequences");
  DI_CHECK(!table_rows || table.size(1) == n, op, ": TableRows needs table [V, ", n, "], got ",
           table.describe());
  DI_CHECK(rule.kind != Kind::Listed ||
               (rows_in.defined() && rows_in.dtype == DType::I32 && rows_in.ndim == 2 &&
                rows_in.size(0) == S && rows_in.size(1) == n && rows_in.is_contiguous()),
           op, ": Listed needs rows_in contiguous I32 [", S, ", ", n, "], got ",
           rows_in.defined() ? rows_in.describe() : "undefined");
  DI_CHECK(rule.kind != Kind::Completed || n == 1, op,
           ": Completed writes one slot per sequence, got ", slots.describe());
  DI_CHECK(rule.kind != Kind::GroupStart || n == 1, op,
           ": GroupStart writes one position per sequence, got ", slots.describe());
  DI_CHECK(rule.ratio > 0 && rule.window >= 0 && rule.block_size > 0 && rule.num_blocks >= 0, op,
           ": ratio > 0, window >= 0 and block_size > 0 expected, got ratio ", rule.ratio,
           ", window ", rule.window, ", block_size ", rule.block_size);
  DI_CHECK(rule.kind != Kind::Group || n == (rule.overlap ? 2 : 1) * rule.ratio, op,
           ": Group lists ", (rule.overlap ? 2 : 1) * rule.ratio, " rows per sequence (ratio ",
           rule.ratio, "), got ", slots.describe());
  DI_CHECK(!index.defined() || (index.dtype == DType::I32 && index.ndim == 2 &&
                                index.size(0) == S && index.size(1) == n && index.stride[1] == 1),
           op, ": index must be I32 [", S, ", ", n, "] with unit column stride, got ",
           index.defined() ? index.describe() : "");
  Rule r;
  r.kind = static_cast<int>(rule.kind);
  r.ratio = rule.ratio;
  r.window = rule.window;
  r.overlap = rule.overlap ? 1 : 0;
  r.fill = rule.fill;
  r.block_size = rule.block_size;
  r.num_blocks = rule.num_blocks;
  r.index_base = rule.index_base;
  r.n = n;
  r.width = table_rows ? table.size(0) : table.size(1);
  return r;
}

}  // namespace v4_rows_rule

void Backend::v4_decode_rows(const Tensor& keys, const Tensor& rows_in, const Tensor& table,
                             const V4RowRule& rule, Tensor& slots, Tensor& index) {
  const char* op = "v4_decode_rows";
  const v4_rows_rule::Rule r =
      v4_rows_rule::make_rule(rule, keys, rows_in, table, slots, index, op);
  for (const Tensor* t : {&keys, &table, static_cast<const Tensor*>(&slots)})
    DI_CHECK(t->device == Device::CPU, op, ": host tensors expected (CUDA overrides the op), got ",
             t->describe());
  DI_CHECK(!index.defined() || index.device == Device::CPU, op, ": host index expected, got ",
           index.describe());
  const int64_t S = keys.size(0), n = slots.size(1);
  const bool table_rows = rule.kind == V4RowRule::Kind::TableRows;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t e = keys.ptr<const int32_t>()[s];
    const int32_t* row = table.ptr<const int32_t>() + (table_rows ? 0 : s * table.size(1));
    for (int64_t j = 0; j < n; ++j) {
      const int32_t listed =
          rule.kind == V4RowRule::Kind::Listed ? rows_in.ptr<const int32_t>()[s * n + j] : -1;
      int64_t ix = -1;
      slots.ptr<int32_t>()[s * n + j] = v4_rows_rule::entry(r, s, j, e, row, listed, &ix);
      if (index.defined()) index.ptr<int32_t>()[s * index.stride[0] + j] = static_cast<int32_t>(ix);
    }
  }
}

}  // namespace deepinfer
