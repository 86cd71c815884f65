#include <gtest/gtest.h>

#include "core/error.h"
#include "core/tensor.h"

namespace deepinfer {
namespace {

TEST(Tensor, ContiguousStridesAndRows) {
  HostBuffer buf(DType::F32, {3, 4});
  for (int i = 0; i < 12; ++i) buf.ptr<float>()[i] = static_cast<float>(i);
  const Tensor& t = buf.tensor();
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.stride[0], 4);
  EXPECT_TRUE(t.is_contiguous());
  Tensor r = t.row(2);
  EXPECT_EQ(r.ndim, 1);
  EXPECT_EQ(r.ptr<float>()[1], 9.0f);
  Tensor s = t.slice_rows(1, 3);
  EXPECT_EQ(s.size(0), 2);
  EXPECT_EQ(s.ptr<float>()[0], 4.0f);
  EXPECT_EQ(t.view({2, 6}).size(1), 6);
  EXPECT_THROW(t.view({5, 5}), Error);
  EXPECT_THROW(t.row(3), Error);
  EXPECT_EQ(t.describe(), "F32[3, 4] cpu");
}

}  // namespace
}  // namespace deepinfer
