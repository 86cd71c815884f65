// Decoding: the incremental decoder never emits broken UTF-8 and its pieces add up to
// decode(); lossy replacement of invalid bytes follows Rust's from_utf8_lossy (HF's decoder).
#include <gtest/gtest.h>

#include <random>

#include "tests/unit/tokenizer/fixture.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace deepinfer {
namespace {

bool valid_utf8(const std::string& s) {
  return tokenizer_detail::find_invalid_utf8(s) == std::string_view::npos;
}

void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  IncrementalDecoder decoder(tok, skip_special);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = decoder.push(id);
    ASSERT_TRUE(valid_utf8(piece)) << "broken UTF-8 emitted after id " << id;
    streamed += piece;
  }
  const std::string tail = decoder.flush();
  ASSERT_TRUE(valid_utf8(tail));
  streamed += tail;
  EXPECT_EQ(streamed, tok.decode(ids, skip_special));
}

TEST(TokenizerDecode, IncrementalMatchesDecodeOnCorpus) {
  const Tokenizer tok = Tokenizer::from_dir(test::tiny_dir());
  const auto rows = test::read_jsonl_gz(test::tokenizer_data_dir() + "/tiny_fixture.jsonl.gz");
  for (size_t i = 0; i < rows.size(); i += 3) {
    const auto ids = rows[i]["ids"].get<std::vector<int32_t>>();
    check_stream(tok, ids, false);
    check_stream(tok, ids, true);
  }
}

TEST(TokenizerDecode, IncrementalMatchesDecodeOnRandomIds) {
  // Random ids split characters anywhere and produce invalid sequences; lossy output must
  // still agree between streaming and whole decoding.
  const Tokenizer tok = Tokenizer::from_dir(test::tiny_dir());
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> id(-2, tok.vocab_size() + 2);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> ids(1 + rng() % 40);
    for (auto& x : ids) x = id(rng);
    check_stream(tok, ids, trial % 2 == 0);
  }
}

TEST(TokenizerDecode, SplitCharacterIsHeldBack) {
  const Tokenizer tok = Tokenizer::from_dir(test::tiny_dir());
  // "é" is 0xC3 0xA9: feed its two byte tokens one at a time.
  const std::string bytes = "\xC3\xA9";
  std::vector<int32_t> byte_ids;
  for (unsigned char b : bytes) {
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
      if (tok.has_token(id) && tok.token_bytes(id) == std::string(1, static_cast<char>(b))) {
        byte_ids.push_back(id);
        break;
      }
    }
  }
  ASSERT_EQ(byte_ids.size(), 2u);
  IncrementalDecoder decoder(tok);
  EXPECT_EQ(decoder.push(byte_ids[0]), "");
  EXPECT_EQ(decoder.push(byte_ids[1]), "é");
  EXPECT_EQ(decoder.push(byte_ids[0]), "");
  EXPECT_EQ(decoder.flush(), "\xEF\xBF\xBD");  // an incomplete character at the end
  EXPECT_EQ(tok.decode(std::vector<int32_t>{byte_ids[0]}), "\xEF\xBF\xBD");
}

TEST(TokenizerDecode, LossyFollowsMaximalSubparts) {
  // Expected strings are Python's bytes.decode("utf-8", "replace"), which uses the same
  // maximal-subpart rule as Rust.
  auto lossy = [](std::string_view in) {
    std::string out;
    tokenizer_detail::append_utf8_lossy(in, true, out);
    return out;
  };
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(lossy("a\x80" "b"), "a" + r + "b");
  EXPECT_EQ(lossy("\xE2\x82"), r);                 // truncated 3-byte sequence: one U+FFFD
  EXPECT_EQ(lossy("\xE2\x82" "a"), r + "a");
  EXPECT_EQ(lossy("\xF0\x80\x80"), r + r + r);     // F0 80: 80 is not a valid second byte
  EXPECT_EQ(lossy("\xED\xA0\x80"), r + r + r);     // a surrogate
  EXPECT_EQ(lossy("\xC0\xAF"), r + r);
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), r + r + r + r);
}

}  // namespace
}  // namespace deepinfer
