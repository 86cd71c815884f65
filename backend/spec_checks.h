// Argument checks of the speculative-decoding fix-ups (Backend::spec_accept,
// spec_select_rows, spec_shift), shared by the CPU and CUDA backends: shapes and dtypes only
// (the values live on the device). Each throws Error naming the op and the field.
#pragma once
#include "backend/backend.h"

namespace deepinfer {

void check_spec_accept(const Tensor& ids, const Tensor& tokens, int q, const Tensor& accepted, const Tensor& last);
void check_spec_select_rows(const Tensor& ids, const Tensor& accepted, int q, const Tensor& out_ids,
                            const Tensor& out_rows);
void check_spec_shift(const SpecShift& shift);

}  // namespace deepinfer
