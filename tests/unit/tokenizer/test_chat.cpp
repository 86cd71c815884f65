// Chat encoding errors (the DeepSeek-V3 format itself is checked in test_deepseek_v3.cpp).
#include <gtest/gtest.h>

#include "tests/unit/tokenizer/fixture.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

TEST(TokenizerChat, UnknownRoleIsAnError) {
  const Tokenizer tok = Tokenizer::from_dir(test::tiny_dir());
  EXPECT_THROW(apply_chat_template(tok, {{"narrator", "x"}}, true), Error);
}

}  // namespace
}  // namespace deepinfer
