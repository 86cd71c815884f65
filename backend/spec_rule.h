// Speculative decoding with drafts in flight (issue 13 item 2): the per-sequence rules of
// the device fix-ups (Backend::spec_accept, spec_select_rows, spec_shift), shared by the
// CPU reference (backend/cpu/spec_fixup.cpp) and the CUDA kernels (backend/cuda/
// spec_fixup.cu) so both give the same integers.
//
// A verify step of a sequence computes q = 1 + k tokens: its last verified token and k
// drafts, at positions P .. P + k; logits row j chooses token y_j (the token after position
// P + j). Draft j + 1 (input token j + 1) is accepted while it equals y_j; y_{accepted} is the
// step's last token (the correction, or the bonus when every draft is accepted). A row
// without a token (NaN logits: a negative id) accepts nothing after it.
//
// The next step is built on the host before that count is known, as if every draft were
// accepted ("assumed" = k): its positions are delta = accepted - assumed too far. spec_shift
// moves each token of the sequence by delta, recomputes its KV slot from the block table at
// the new position, shortens the context (seq_lens) by the same, moves the (seed, position)
// key of its sampled rows, and writes its input tokens that only the device knows.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define DI_SPEC_HD __host__ __device__ __forceinline__
#else
#define DI_SPEC_HD inline
#endif

namespace deepinfer::spec_rule {

// ids: the sequence's q chosen tokens; tokens: its q input tokens. Returns the accepted count.
DI_SPEC_HD int32_t accepted_count(const int32_t* ids, const int32_t* tokens, int q) {
  int32_t a = 0;
  while (a < q - 1 && ids[a] >= 0 && ids[a] == tokens[a + 1]) ++a;
  return a;
}

// The KV slot of `position` through a block-table row of `width` blocks; -1 (not stored)
// past the row.
DI_SPEC_HD int32_t slot_at(const int32_t* table_row, int64_t width, int block_size, int32_t position) {
  if (position < 0) return -1;
  const int32_t b = position / block_size;
  return b < width ? table_row[b] * block_size + position % block_size : -1;
}

// SampleRowParams::position (a uint64 at words 8, 9 of a row) moved by delta.
inline constexpr int kPositionWord = 8;
DI_SPEC_HD void shift_position(int32_t* row_words, int32_t delta) {
  uint64_t p = static_cast<uint32_t>(row_words[kPositionWord]) |
               (static_cast<uint64_t>(static_cast<uint32_t>(row_words[kPositionWord + 1])) << 32);
  p = static_cast<uint64_t>(static_cast<int64_t>(p) + delta);
  row_words[kPositionWord] = static_cast<int32_t>(static_cast<uint32_t>(p));
  row_words[kPositionWord + 1] = static_cast<int32_t>(static_cast<uint32_t>(p >> 32));
}

}  // namespace deepinfer::spec_rule
