// Speculative decoding with drafts in flight: the reference of the device fix-ups
// (Backend::spec_accept, spec_select_rows, spec_shift; the rules in backend/spec_rule.h).
#include <cstddef>

#include "backend/cpu/cpu_backend.h"
#include "backend/spec_checks.h"
#include "backend/spec_rule.h"

namespace deepinfer::cpu {

static_assert(offsetof(SampleRowParams, position) == 4 * spec_rule::kPositionWord,
              "spec_rule::shift_position reads SampleRowParams::position at word kPositionWord");

void CpuBackend::spec_accept(const Tensor& ids, const Tensor& tokens, int q, Tensor& accepted, Tensor& last) {
  check_spec_accept(ids, tokens, q, accepted, last);
  const int32_t* y = ids.ptr<int32_t>();
  const int32_t* x = tokens.ptr<int32_t>();
  for (int64_t s = 0; s < accepted.numel(); ++s) {
    const int32_t a = spec_rule::accepted_count(y + s * q, x + s * q, q);
    accepted.ptr<int32_t>()[s] = a;
    last.ptr<int32_t>()[s] = y[s * q + a];
  }
}

void CpuBackend::spec_select_rows(const Tensor& ids, const Tensor& accepted, int q, Tensor& out_ids,
                                  Tensor& out_rows) {
  check_spec_select_rows(ids, accepted, q, out_ids, out_rows);
  for (int64_t s = 0; s < accepted.numel(); ++s) {
    const int32_t row = static_cast<int32_t>(s * q + accepted.ptr<int32_t>()[s]);
    out_ids.ptr<int32_t>()[s] = ids.ptr<int32_t>()[row];
    out_rows.ptr<int32_t>()[s] = row;
  }
}

void CpuBackend::spec_shift(const SpecShift& f) {
  check_spec_shift(f);
  const int64_t S = f.accepted.numel(), width = f.block_tables.size(1);
  const int32_t* qs = f.query_start.ptr<int32_t>();
  for (int64_t s = 0; s < S; ++s) {
    const int32_t delta = f.accepted.ptr<int32_t>()[s] - f.assumed;
    const int32_t* table = f.block_tables.ptr<int32_t>() + s * width;
    for (int32_t t = qs[s]; t < qs[s + 1]; ++t) {
      int32_t& pos = f.positions.ptr<int32_t>()[t];
      pos += delta;
      int32_t& slot = f.slots.ptr<int32_t>()[t];
      if (slot >= 0) slot = spec_rule::slot_at(table, width, f.block_size, pos);
    }
    f.seq_lens.ptr<int32_t>()[s] += delta;
    if (f.first_tokens.defined()) f.tokens.ptr<int32_t>()[qs[s]] = f.first_tokens.ptr<int32_t>()[s];
    for (int j = 0; j < f.num_drafts; ++j)
      f.tokens.ptr<int32_t>()[qs[s] + 1 + j] = f.drafts.ptr<int32_t>()[j * f.drafts_stride + s];
    for (int r = 0; r < f.rows_per_seq && f.sample_params.defined(); ++r)
      spec_rule::shift_position(f.sample_params.ptr<int32_t>() + (s * f.rows_per_seq + r) * kSampleRowWords, delta);
  }
}

}  // namespace deepinfer::cpu
