// DeepSeek-V4.1 Engram hashing against values the PR oracle printed (numpy 2.x in the oracle's venv):
// numpy's PCG64 raw outputs, the per-layer hash multipliers (compute_hash_multipliers), the
// bucket primes of the released layout (EngramLayout.from_config), the gate op's host reference and
// the FP8 table row gather.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/engram_hash.h"

namespace deepinfer {
namespace {

TEST(V41Engram, Pcg64MatchesNumpy) {
  // numpy.random.PCG64(10007).random_raw(3)
  const std::vector<uint64_t> want = {15187255322829266483ull, 959186003677246517ull,
                                      7126631698937927467ull};
  EXPECT_EQ(numpy_pcg64_raw(10007, 3), want);
}

TEST(V41Engram, MultipliersMatchThePr) {
  DeepseekV41Config c;
  c.engram_layers = {0, 1, 14};
  c.engram_max_ngram_size = 4;
  c.engram_compressed_vocab_size = 99092;
  c.engram_vocab_size = 16000000;
  c.engram_n_heads = 8;
  const EngramHashing h = make_engram_hashing(c, 0);
  // compute_hash_multipliers((0, 1, 14), 4, 99092)
  const std::vector<std::vector<int64_t>> want = {
      {59287678272599, 25111444230055, 3813769577005, 1538373747317},
      {76632096046245, 4839876093313, 35959672319349, 73987337458391},
      {67716810739261, 51510806800915, 30921347202721, 82619226485591}};
  EXPECT_EQ(h.multipliers, want);
  c.engram_layers = {1, 5};
  c.engram_compressed_vocab_size = 200;  // compute_hash_multipliers((1, 5), 4, 200)
  const std::vector<std::vector<int64_t>> small = {
      {37968138307073165, 2397965009193117, 17816579247344819, 36657766217135125},
      {18035563129654053, 15334932864188503, 10090823841207497, 32654048200820185}};
  EXPECT_EQ(make_engram_hashing(c, 0).multipliers, small);
}

TEST(V41Engram, PrimesOfTheReleasedLayout) {
  DeepseekV41Config c;
  c.engram_layers = {1, 14};
  const EngramHashing h = make_engram_hashing(c, 0);
  ASSERT_EQ(h.primes.size(), 2u);
  ASSERT_EQ(h.primes[0].size(), 24u);
  const std::vector<int64_t> first = {16000057, 16000079, 16000081, 16000097,
                                      16000121, 16000129, 16000133, 16000183};
  EXPECT_EQ(std::vector<int64_t>(h.primes[0].begin(), h.primes[0].begin() + 8), first);
  EXPECT_EQ(h.primes[1].back(), 16000889);
  EXPECT_EQ(h.rows, std::vector<int64_t>({384006168, 384016682}));  // the tables' rows
  EXPECT_EQ(h.offsets[0][1], 16000057);
  EXPECT_TRUE(is_prime_u64(16000889));
  EXPECT_FALSE(is_prime_u64(16000887));
}

TEST(V41Engram, HashRollsXorOverTheLookBack) {
  DeepseekV41Config c;
  c.engram_layers = {1};
  c.engram_max_ngram_size = 3;
  c.engram_n_heads = 2;
  c.engram_vocab_size = 50;
  c.engram_compressed_vocab_size = 200;
  const EngramHashing h = make_engram_hashing(c, 7);
  ASSERT_EQ(h.cols(), 4);
  const int64_t ids[3] = {11, 12, 13};
  int32_t out[4], start[4];
  h.hash(0, ids, 3, out);
  h.hash(0, ids, 1, start);  // at the sequence start: the look-back is the pad id
  const std::vector<int64_t>& m = h.multipliers[0];
  const uint64_t r2 = 11ull * static_cast<uint64_t>(m[0]) ^ 12ull * static_cast<uint64_t>(m[1]);
  const uint64_t r3 = r2 ^ 13ull * static_cast<uint64_t>(m[2]);
  const uint64_t s2 = 11ull * static_cast<uint64_t>(m[0]) ^ 7ull * static_cast<uint64_t>(m[1]);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(out[k], static_cast<int64_t>(r2 % static_cast<uint64_t>(h.primes[0][k])) + h.offsets[0][k]);
    EXPECT_EQ(out[2 + k],
              static_cast<int64_t>(r3 % static_cast<uint64_t>(h.primes[0][2 + k])) + h.offsets[0][2 + k]);
    EXPECT_EQ(start[k], static_cast<int64_t>(s2 % static_cast<uint64_t>(h.primes[0][k])) + h.offsets[0][k]);
  }
}

TEST(V41Engram, GateMatchesTheOraclesMath) {
  // The PR's DeepseekV41Engram.forward on these values (torch, fp32): stream 0's dot is exactly 0
  // (gate sigmoid(+sqrt(1e-6))), stream 1's is -0.16439889.
  std::vector<float> h = {1.0f, 2.0f, 0.5f, -3.0f};
  std::vector<float> kv = {2.0f, -1.0f, 1.0f, 1.0f, 0.25f, -0.5f};  // keys [2, 2], value [2]
  std::vector<float> w = {1.0f, 1.0f, 2.0f, 0.5f};
  std::vector<float> out(4);
  auto be = make_cpu_backend();
  Tensor ht(h.data(), DType::F32, {1, 2, 2}), kvt(kv.data(), DType::F32, {1, 6}),
      wt(w.data(), DType::F32, {2, 2}), ot(out.data(), DType::F32, {1, 2, 2});
  be->engram_gate(ht, kvt, wt, 1e-6f, ot);
  const std::vector<float> want = {1.1250624656677246f, 1.7498750686645508f, 0.600000262260437f,
                                   -3.200000524520874f};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(out[i], want[i], 1e-6f) << i;
  be->engram_gate(ht, kvt, wt, 1e-6f, ht);  // in place
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(h[i], want[i], 1e-6f) << i;
}

TEST(V41Engram, Fp8RowsDequantizeWithTheirBlockScale) {
  // e4m3 0x38 = 1, 0x40 = 2, 0xB8 = -1, 0x39 = 1.125; E8M0 128 = 2, 126 = 0.5.
  std::vector<uint8_t> table(2 * 64, 0x38), scales = {128, 126, 127, 129};
  table[64] = 0x40;       // row 1, channel 0
  table[64 + 33] = 0xB8;  // row 1, channel 33 (block 1)
  table[5] = 0x39;        // row 0, channel 5
  std::vector<int32_t> ids = {1, 0, 1};
  std::vector<float> out(3 * 64), fscales = {2.0f, 0.5f, 1.0f, 4.0f};
  auto be = make_cpu_backend();
  Tensor tt(table.data(), DType::F8_E4M3, {2, 64}), st(scales.data(), DType::U8, {2, 2}),
      it(ids.data(), DType::I32, {3}), ot(out.data(), DType::F32, {3, 64});
  be->embedding_fp8_rows(it, tt, st, ot);
  EXPECT_EQ(out[0], 2.0f * 1.0f);    // row 1 block 0: 2 * 2^(127 - 127)
  EXPECT_EQ(out[1], 1.0f);
  EXPECT_EQ(out[33], -4.0f);         // row 1 block 1: -1 * 2^(129 - 127)
  EXPECT_EQ(out[40], 4.0f);
  EXPECT_EQ(out[64 + 5], 2.25f);     // row 0 block 0: 1.125 * 2
  EXPECT_EQ(out[64 + 40], 0.5f);     // row 0 block 1: 1 * 0.5
  EXPECT_EQ(out[128], out[0]);
  Tensor ft(fscales.data(), DType::F32, {2, 2});  // F32 scales read alike
  std::vector<float> out2(3 * 64);
  Tensor ot2(out2.data(), DType::F32, {3, 64});
  be->embedding_fp8_rows(it, tt, ft, ot2);
  EXPECT_EQ(out, out2);
}

}  // namespace
}  // namespace deepinfer
