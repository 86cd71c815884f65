#include "backend/spec_checks.h"

#include "core/error.h"

namespace deepinfer {
namespace {

void check_i32(const Tensor& t, int64_t min_numel, const char* op, const char* field) {
  DI_CHECK(t.defined() && t.dtype == DType::I32 && t.numel() >= min_numel, op, ": ", field, " must be I32 with >= ",
           min_numel, " entries, got ", t.defined() ? t.describe() : std::string("none"));
}

}  // namespace

void check_spec_accept(const Tensor& ids, const Tensor& tokens, int q, const Tensor& accepted, const Tensor& last) {
  DI_CHECK(q >= 1, "spec_accept: q (tokens per sequence) must be >= 1, got ", q);
  check_i32(accepted, 0, "spec_accept", "accepted");
  const int64_t S = accepted.numel();
  check_i32(ids, S * q, "spec_accept", "ids");
  check_i32(tokens, S * q, "spec_accept", "tokens");
  check_i32(last, S, "spec_accept", "last");
}

void check_spec_select_rows(const Tensor& ids, const Tensor& accepted, int q, const Tensor& out_ids,
                            const Tensor& out_rows) {
  DI_CHECK(q >= 1, "spec_select_rows: q (rows per sequence) must be >= 1, got ", q);
  check_i32(accepted, 0, "spec_select_rows", "accepted");
  const int64_t S = accepted.numel();
  check_i32(ids, S * q, "spec_select_rows", "ids");
  check_i32(out_ids, S, "spec_select_rows", "out_ids");
  check_i32(out_rows, S, "spec_select_rows", "out_rows");
}

void check_spec_shift(const SpecShift& f) {
  check_i32(f.accepted, 0, "spec_shift", "accepted");
  const int64_t S = f.accepted.numel();
  DI_CHECK(f.assumed >= 0 && f.block_size > 0, "spec_shift: assumed (", f.assumed, ") must be >= 0 and block_size (",
           f.block_size, ") > 0");
  check_i32(f.query_start, S + 1, "spec_shift", "query_start");
  check_i32(f.positions, 0, "spec_shift", "positions");
  check_i32(f.slots, f.positions.numel(), "spec_shift", "slots");
  check_i32(f.seq_lens, S, "spec_shift", "seq_lens");
  DI_CHECK(f.block_tables.defined() && f.block_tables.ndim == 2 && f.block_tables.size(0) >= S &&
               f.block_tables.dtype == DType::I32,
           "spec_shift: block_tables must be I32 [>= ", S, ", width], got ",
           f.block_tables.defined() ? f.block_tables.describe() : std::string("none"));
  if (f.first_tokens.defined() || f.num_drafts > 0) check_i32(f.tokens, 0, "spec_shift", "tokens");
  if (f.first_tokens.defined()) check_i32(f.first_tokens, S, "spec_shift", "first_tokens");
  DI_CHECK(f.num_drafts >= 0, "spec_shift: num_drafts must be >= 0, got ", f.num_drafts);
  if (f.num_drafts > 0) {
    DI_CHECK(f.drafts_stride >= S, "spec_shift: drafts_stride (", f.drafts_stride, ") must be >= ", S, " sequences");
    check_i32(f.drafts, (f.num_drafts - 1) * f.drafts_stride + S, "spec_shift", "drafts");
  }
  if (f.sample_params.defined())
    DI_CHECK(f.sample_params.dtype == DType::I32 && f.sample_params.ndim == 2 &&
                 f.sample_params.size(1) == kSampleRowWords && f.rows_per_seq >= 1 &&
                 f.sample_params.size(0) >= S * f.rows_per_seq,
             "spec_shift: sample_params must be I32 [>= ", S, " x rows_per_seq (", f.rows_per_seq, "), ",
             kSampleRowWords, "], got ", f.sample_params.describe());
}

}  // namespace deepinfer
