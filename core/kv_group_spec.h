// KvGroupSpec: one layer group of a model's KV state, as the model declares it
// (Model::kv_groups) and as kv/ (block accounting, sizing) and runner/ (memory) read it.
// It lives in core/ because model/ may not use kv/ and kv/ may not use model/; it is plain
// data. kv/kv_groups.h says how the pieces use it.
//
// Every layer of a group has the same row layout and the group has one block table per
// sequence: a block holds `block_size` rows, row r of a sequence covers its tokens
// [r * tokens_per_row, (r + 1) * tokens_per_row).
//   full attention      tokens_per_row 1, window 0   (V3 latent 576, V3.2 indexer keys 128)
//   compressed rows     tokens_per_row N, window 0   (V4 CSA / HCA: 1 row per 4 / 128 tokens;
//                                                     a row exists once its N tokens are computed)
//   sliding window      tokens_per_row 1, window W   (V4's 128-token rings: blocks whose tokens
//                                                     all lie W or more before the next query are freed)
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace deepinfer {

struct KvGroupSpec {
  std::string name;        // for messages and `deepinfer info` ("latent", "indexer_keys", ...)
  int num_layers = 0;      // layers with a cache in this group (MTP layers come on top: Model::mtp_kv_group)
  int64_t row_dim = 0;     // elements per row (a packed FP8 row with scales: bytes, dtype U8)
  // Element type of a row. activation_dtype (the default): the backend's activation dtype
  // (F32 on the CPU, BF16 on CUDA), what V3's latent cache uses; `dtype` is then ignored.
  DType dtype = DType::F32;
  bool activation_dtype = true;
  int tokens_per_row = 1;  // 1: one row per token; N > 1: one row per N tokens (compressed)
  int window = 0;          // 0: every row is kept; W > 0: only the last W tokens are read

  DType row_dtype(DType activation) const { return activation_dtype ? activation : dtype; }
  int64_t row_bytes(DType activation) const {
    return row_dim * static_cast<int64_t>(dtype_size(row_dtype(activation)));
  }
  // Rows a sequence of `num_tokens` computed tokens holds (completed rows only).
  int64_t rows_for(int64_t num_tokens) const { return num_tokens / tokens_per_row; }
  void validate() const {
    DI_CHECK(num_layers >= 0 && row_dim > 0 && tokens_per_row >= 1 && window >= 0 &&
                 (window == 0 || tokens_per_row == 1),
             "KV group '", name, "': needs num_layers >= 0, row_dim > 0, tokens_per_row >= 1 and window >= 0 "
             "(a window only on one row per token), got ", num_layers, " layers, row_dim ", row_dim,
             ", tokens_per_row ", tokens_per_row, ", window ", window);
  }
};

}  // namespace deepinfer
