// The CPU reference of speculative decoding's device fix-ups against hand-worked values.
#include <gtest/gtest.h>

#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "op_test_util.h"

namespace deepinfer {
namespace {

std::vector<int32_t> values(const HostBuffer& b) {
  return std::vector<int32_t>(b.ptr<int32_t>(), b.ptr<int32_t>() + b.tensor().numel());
}

TEST(CpuSpecFixup, AcceptCountsAndLastTokens) {
  auto backend = make_cpu_backend();
  // Three sequences of q = 3: chosen ids and input tokens (last verified token, draft 1, draft 2).
  HostBuffer ids = test::i32_buffer({5, 6, 7, /**/ 5, 6, 7, /**/ 4, -1, 9});
  HostBuffer tokens = test::i32_buffer({1, 5, 6, /**/ 1, 5, 9, /**/ 1, 4, -1});
  HostBuffer accepted = test::i32_buffer({-9, -9, -9}), last = test::i32_buffer({-9, -9, -9});
  backend->spec_accept(ids.tensor(), tokens.tensor(), 3, accepted.tensor(), last.tensor());
  // All accepted: bonus 7; draft 2 (9) != 6: correction 6; a row without a token never
  // matches (even a -1 draft): the step's last token is -1.
  EXPECT_EQ(values(accepted), (std::vector<int32_t>{2, 1, 1}));
  EXPECT_EQ(values(last), (std::vector<int32_t>{7, 6, -1}));
  HostBuffer out_ids = test::i32_buffer({0, 0, 0}), out_rows = test::i32_buffer({0, 0, 0});
  backend->spec_select_rows(ids.tensor(), accepted.tensor(), 3, out_ids.tensor(), out_rows.tensor());
  EXPECT_EQ(values(out_rows), (std::vector<int32_t>{2, 4, 7}));
  EXPECT_EQ(values(out_ids), (std::vector<int32_t>{7, 6, -1}));
  HostBuffer short_last = test::i32_buffer({0, 0});
  EXPECT_THROW(backend->spec_accept(ids.tensor(), tokens.tensor(), 3, accepted.tensor(), short_last.tensor()), Error);
}

TEST(CpuSpecFixup, ShiftMovesPositionsSlotsLengthsTokensAndSamplePositions) {
  auto backend = make_cpu_backend();
  // Two real sequences of q = 2 laid out assuming 3 drafts accepted, plus one padding sequence.
  // Block size 4; sequence 0's blocks 7, 2, 9; sequence 1's 3, 8, 1.
  HostBuffer accepted = test::i32_buffer({1, 3});
  HostBuffer query_start = test::i32_buffer({0, 2, 4, 6});
  HostBuffer positions = test::i32_buffer({8, 9, 5, 6, 0, 1});
  HostBuffer slots = test::i32_buffer({36, 37, 33, -1, -1, -1});
  HostBuffer seq_lens = test::i32_buffer({10, 7, 2});
  HostBuffer tables = test::i32_buffer({7, 2, 9, 3, 8, 1, 0, 0, 0});
  HostBuffer tokens = test::i32_buffer({-1, -1, -1, -1, 0, 0});
  HostBuffer first = test::i32_buffer({11, 12});
  HostBuffer drafts = test::i32_buffer({21, 22, 99});  // [1 draft, stride 3]
  std::vector<int32_t> words(4 * kSampleRowWords, 0);
  for (int r = 0; r < 4; ++r) words[r * kSampleRowWords + 8] = 100 + r;
  words[0 * kSampleRowWords + 8] = 1;  // position 1 - 2 wraps below 0 into the high word
  HostBuffer params = test::i32_buffer(words);
  SpecShift f;
  f.accepted = accepted.tensor();
  f.assumed = 3;
  f.query_start = query_start.tensor();
  f.positions = positions.tensor();
  f.slots = slots.tensor();
  f.seq_lens = seq_lens.tensor();
  f.block_tables = Tensor(tables.tensor().data, DType::I32, {3, 3});
  f.block_size = 4;
  f.tokens = tokens.tensor();
  f.first_tokens = first.tensor();
  f.drafts = drafts.tensor();
  f.num_drafts = 1;
  f.drafts_stride = 3;
  f.sample_params = Tensor(params.tensor().data, DType::I32, {4, kSampleRowWords});
  f.rows_per_seq = 2;
  backend->spec_shift(f);
  // Sequence 0 moves back 2: positions 6, 7 in its block 2 (table entry 1): slots 2*4+2, 2*4+3.
  // Sequence 1 accepted all 3: nothing moves, but its -1 slot stays -1. Padding untouched.
  EXPECT_EQ(values(positions), (std::vector<int32_t>{6, 7, 5, 6, 0, 1}));
  EXPECT_EQ(values(slots), (std::vector<int32_t>{10, 11, 33, -1, -1, -1}));
  EXPECT_EQ(values(seq_lens), (std::vector<int32_t>{8, 7, 2}));
  EXPECT_EQ(values(tokens), (std::vector<int32_t>{11, 21, 12, 22, 0, 0}));
  const int32_t* w = params.ptr<int32_t>();
  EXPECT_EQ(w[0 * kSampleRowWords + 8], -1);  // 1 - 2 = 2^64 - 1
  EXPECT_EQ(w[0 * kSampleRowWords + 9], -1);
  EXPECT_EQ(w[1 * kSampleRowWords + 8], 99);
  EXPECT_EQ(w[2 * kSampleRowWords + 8], 102);
  EXPECT_EQ(w[3 * kSampleRowWords + 8], 103);
  f.block_size = 0;
  EXPECT_THROW(backend->spec_shift(f), Error);
}

}  // namespace
}  // namespace deepinfer
