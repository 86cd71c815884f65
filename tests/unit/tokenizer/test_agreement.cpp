// Exact agreement with HF `tokenizers` on the seeded corpora (tools/tokenizer/make_fixture.py):
// every string's ids, BOS handling per tokenizer_config, and decode(encode(s)) == s.
#include <gtest/gtest.h>

#include "tests/unit/tokenizer/fixture.h"
#include "tests/unit/tokenizer/check_fixture.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

TEST(TokenizerAgreement, TinyTrainedTokenizerMatchesHfTokenizers) {
  const Tokenizer tok = Tokenizer::from_dir(test::tiny_dir());
  EXPECT_EQ(tok.vocab_size(), 8004);
  test::check_fixture(tok, test::tokenizer_data_dir() + "/tiny_fixture.jsonl.gz", 3000);
}

TEST(TokenizerAgreement, TokenTables) {
  const Tokenizer tok = Tokenizer::from_dir(test::tiny_dir());
  // Special tokens: their text; byte-level tokens: raw bytes ("Ġ" is the space byte).
  const int32_t bos = tok.bos_id();
  EXPECT_TRUE(tok.is_special(bos));
  EXPECT_EQ(tok.token_bytes(bos), "<｜begin▁of▁sentence｜>");
  const auto space = tok.token_to_id("Ġ");
  ASSERT_TRUE(space.has_value());
  EXPECT_EQ(tok.token_bytes(*space), " ");
  EXPECT_FALSE(tok.is_special(*space));
  const auto user = tok.token_to_id("<｜User｜>");
  ASSERT_TRUE(user.has_value());
  EXPECT_FALSE(tok.is_special(*user));  // added but not special: kept by skip_special_tokens
  EXPECT_FALSE(tok.token_to_id("no such token").has_value());
  EXPECT_THROW(tok.token_bytes(tok.vocab_size()), Error);
  EXPECT_THROW(tok.token_bytes(-1), Error);
  EXPECT_THROW(tok.encode(std::string("ab\xff", 3)), Error);  // not UTF-8
}

}  // namespace
}  // namespace deepinfer
