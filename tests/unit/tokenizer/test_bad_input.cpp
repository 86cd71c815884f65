// Malformed or unsupported tokenizer files give an Error naming the file and the JSON field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/unit/tokenizer/fixture.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

using nlohmann::json;

// A small valid byte-level BPE tokenizer.json: 256 byte tokens, "ab" via one merge, one
// special token.
json valid_tokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[tokenizer_detail::byte_level_encode(std::string(1, static_cast<char>(b)))] = b;
  }
  vocab["ab"] = 256;
  return {
      {"version", "1.0"},
      {"added_tokens", json::array({{{"id", 257}, {"content", "<s>"}, {"special", true},
                                     {"normalized", false}, {"lstrip", false}, {"rstrip", false},
                                     {"single_word", false}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", json::array({{{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,3}"}}},
                                        {"behavior", "Isolated"}, {"invert", false}},
                                       {{"type", "ByteLevel"}, {"add_prefix_space", false},
                                        {"use_regex", false}}})}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a b"})}}}};
}

class TokenizerBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("deepinfer_tok_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    const auto path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  // Loading `text` as tokenizer.json must throw an Error naming the file and each of `parts`.
  void expect_error(const std::string& text, std::initializer_list<std::string> parts) {
    const std::string path = write("tokenizer.json", text);
    try {
      Tokenizer::from_file(path);
      ADD_FAILURE() << "no error for " << text.substr(0, 200);
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(path), std::string::npos) << message;
      for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
    }
  }
  std::filesystem::path dir_;
};

TEST_F(TokenizerBadInput, ValidBaselineLoads) {
  const auto tok = Tokenizer::from_file(write("tokenizer.json", valid_tokenizer().dump()));
  EXPECT_EQ(tok.vocab_size(), 258);
  EXPECT_EQ(tok.encode("xab<s>12345"), (std::vector<int32_t>{'x', 256, 257, '1', '2', '3', '4', '5'}));
}

TEST_F(TokenizerBadInput, NotJson) { expect_error("{\"model\": ", {"not valid JSON"}); }
TEST_F(TokenizerBadInput, NotAnObject) { expect_error("[1, 2]", {"expected a JSON object"}); }

// The JSON reading policy (core/json.h) applies: depth (built here, 200,000 deep), UTF-8,
// duplicate keys; and an unsupported value is shown cut short.
TEST_F(TokenizerBadInput, DeepNestingInvalidUtf8AndDuplicateKeys) {
  expect_error("{\"model\": " + std::string(200000, '[') + std::string(200000, ']') + "}",
               {"nested deeper than the limit of 256"});
  expect_error("{\"version\": \"1\xc0\"}", {"invalid UTF-8 at byte offset 14"});
  expect_error(R"({"version": "1.0", "version": "1.0"})", {"'version' appears twice"});
  json j = valid_tokenizer();
  j["normalizer"] = {{"type", std::string(100000, 'N')}};
  const std::string path = write("tokenizer.json", j.dump());
  try {
    Tokenizer::from_file(path);
    ADD_FAILURE() << "unsupported normalizer accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported normalizer"), std::string::npos) << e.what();
    EXPECT_LT(std::string(e.what()).size(), 600u);
  }
}

TEST_F(TokenizerBadInput, TokenizerConfigFollowsTheSamePolicy) {
  write("tokenizer.json", valid_tokenizer().dump());
  write("tokenizer_config.json", std::string(300, '[') + std::string(300, ']'));
  try {
    Tokenizer::from_dir(dir_.string());
    ADD_FAILURE() << "deep tokenizer_config.json accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: JSON nested deeper"), std::string::npos) << e.what();
  }
}

TEST_F(TokenizerBadInput, MissingVocab) {
  json j = valid_tokenizer();
  j["model"].erase("vocab");
  expect_error(j.dump(), {"model.vocab", "missing"});
}

TEST_F(TokenizerBadInput, VocabWrongType) {
  json j = valid_tokenizer();
  j["model"]["vocab"] = json::array({"a"});
  expect_error(j.dump(), {"model.vocab", "expected an object"});
}

TEST_F(TokenizerBadInput, VocabIdWrongType) {
  json j = valid_tokenizer();
  j["model"]["vocab"]["ab"] = "256";
  expect_error(j.dump(), {"model.vocab[\"ab\"]", "expected an integer"});
}

TEST_F(TokenizerBadInput, VocabIdOutOfRange) {
  json j = valid_tokenizer();
  j["model"]["vocab"]["ab"] = 1LL << 40;
  expect_error(j.dump(), {"model.vocab[\"ab\"]", "out of range"});
}

TEST_F(TokenizerBadInput, DuplicateVocabId) {
  json j = valid_tokenizer();
  j["model"]["vocab"]["ab"] = 5;
  expect_error(j.dump(), {"model.vocab", "also used"});
}

TEST_F(TokenizerBadInput, MergeReferencesUnknownToken) {
  json j = valid_tokenizer();
  j["model"]["merges"] = json::array({"a b", "ab zz"});
  expect_error(j.dump(), {"model.merges[1]", "'zz' is not in model.vocab"});
}

TEST_F(TokenizerBadInput, MergeResultNotInVocab) {
  json j = valid_tokenizer();
  j["model"]["merges"] = json::array({json::array({"b", "a"})});
  expect_error(j.dump(), {"model.merges[0]", "'ba' is not in model.vocab"});
}

TEST_F(TokenizerBadInput, MergeMalformed) {
  json j = valid_tokenizer();
  j["model"]["merges"] = json::array({"ab"});
  expect_error(j.dump(), {"model.merges[0]", "two tokens"});
  j["model"]["merges"] = json::array({42});
  expect_error(j.dump(), {"model.merges[0]", "expected a string or a pair"});
}

TEST_F(TokenizerBadInput, UnsupportedModelType) {
  json j = valid_tokenizer();
  j["model"]["type"] = "Unigram";
  expect_error(j.dump(), {"model.type", "unsupported model type 'Unigram'"});
}

TEST_F(TokenizerBadInput, AddedTokenWrongType) {
  json j = valid_tokenizer();
  j["added_tokens"][0]["content"] = 7;
  expect_error(j.dump(), {"added_tokens[0].content", "expected a string"});
  j = valid_tokenizer();
  j["added_tokens"][0]["special"] = "yes";
  expect_error(j.dump(), {"added_tokens[0].special", "expected a boolean"});
}

TEST_F(TokenizerBadInput, BadRegex) {
  json j = valid_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  expect_error(j.dump(), {"pre_tokenizer.pretokenizers[0].pattern.Regex", "invalid regex"});
}

TEST_F(TokenizerBadInput, UnsupportedPreTokenizer) {
  json j = valid_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Metaspace"}};
  expect_error(j.dump(), {"pre_tokenizer.pretokenizers[0].type", "unsupported pre-tokenizer type 'Metaspace'"});
}

TEST_F(TokenizerBadInput, MissingByteLevel) {
  json j = valid_tokenizer();
  j["pre_tokenizer"]["pretokenizers"].erase(1);
  expect_error(j.dump(), {"pre_tokenizer", "ByteLevel"});
}

TEST_F(TokenizerBadInput, UnsupportedNormalizer) {
  json j = valid_tokenizer();
  j["normalizer"] = {{"type", "NFC"}};
  expect_error(j.dump(), {"normalizer", "unsupported normalizer"});
}

TEST_F(TokenizerBadInput, UnsupportedDecoder) {
  json j = valid_tokenizer();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error(j.dump(), {"decoder.type", "unsupported decoder type 'WordPiece'"});
}

TEST_F(TokenizerBadInput, MissingFile) {
  try {
    Tokenizer::from_dir((dir_ / "nowhere").string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nowhere"), std::string::npos) << e.what();
  }
}

TEST_F(TokenizerBadInput, ConfigBosNotInVocab) {
  write("tokenizer.json", valid_tokenizer().dump());
  const std::string config = write("tokenizer_config.json", R"({"add_bos_token": true, "bos_token": "<bos>"})");
  try {
    Tokenizer::from_dir(dir_.string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(config), std::string::npos) << message;
    EXPECT_NE(message.find("bos_token"), std::string::npos) << message;
  }
}

TEST_F(TokenizerBadInput, ConfigAddsBos) {
  write("tokenizer.json", valid_tokenizer().dump());
  write("tokenizer_config.json", R"({"add_bos_token": true, "bos_token": {"content": "<s>"}})");
  const auto tok = Tokenizer::from_dir(dir_.string());
  EXPECT_EQ(tok.bos_id(), 257);
  EXPECT_EQ(tok.encode("ab", true), (std::vector<int32_t>{257, 256}));
  EXPECT_EQ(tok.encode("ab", false), (std::vector<int32_t>{256}));
}

}  // namespace
}  // namespace deepinfer
