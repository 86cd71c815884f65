#include <gtest/gtest.h>

#include "sample/philox.h"

namespace deepinfer {
namespace {

// Known-answer vectors published with Random123 (kat_vectors, philox4x32 10 rounds).
TEST(Philox, KnownAnswers) {
  using A4 = std::array<uint32_t, 4>;
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (A4{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                          {0xffffffffu, 0xffffffffu}),
            (A4{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                          {0xa4093822u, 0x299f31d0u}),
            (A4{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, UniformIsInRangeAndRoughlyUniform) {
  int buckets[10] = {};
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    double u = philox_uniform(42, 0, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    buckets[static_cast<int>(u * 10)]++;
  }
  for (int b : buckets) EXPECT_NEAR(b, n / 10, n / 100);  // 10 sigma is ~950
  EXPECT_NE(philox_uniform(1, 0, 5), philox_uniform(2, 0, 5));
  EXPECT_NE(philox_uniform(1, 0, 5), philox_uniform(1, 1, 5));
  EXPECT_EQ(philox_uniform(1, 3, 5), philox_uniform(1, 3, 5));
}

}  // namespace
}  // namespace deepinfer
