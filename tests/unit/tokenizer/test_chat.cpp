// Chat encodings: errors, format detection, and DeepSeek-V3 / V3.1 rendering with tool calls,
// tool results and thinking equal to transformers' (deepseek_chat_tools.jsonl.gz, made by
// tools/server/make_chat_tools_fixture.py; the ids of the V3 rows are checked in
// test_deepseek_v3.cpp with the real tokenizer).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tests/unit/tokenizer/chat_rows.h"
#include "tests/unit/tokenizer/fixture.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(TokenizerChat, UnknownRoleIsAnError) {
  const Tokenizer tok = Tokenizer::from_dir(test::tiny_dir());
  EXPECT_THROW(apply_chat_template(tok, {{"narrator", "x"}}, true), Error);
  ChatOptions o;
  EXPECT_THROW(apply_chat_template(ChatFormat::DeepSeekV31, kBos, {{"narrator", "x"}}, o), Error);
}

TEST(TokenizerChat, FormatFromTheTemplateText) {
  EXPECT_EQ(chat_format_of_template(read_file(test::tokenizer_data_dir() + "/deepseek_v31_chat_template.jinja")),
            ChatFormat::DeepSeekV31);
  // The tiny checkpoint carries DeepSeek-V3's template.
  EXPECT_EQ(Tokenizer::from_dir(test::tiny_dir()).chat_format(), ChatFormat::DeepSeekV3);
  EXPECT_EQ(chat_format_of_template(""), ChatFormat::DeepSeekV3);
  EXPECT_STREQ(to_string(ChatFormat::DeepSeekV31), "deepseek_v31");
}

TEST(TokenizerChat, ToolCallsAndThinkingMatchTransformers) {
  const auto rows = test::read_jsonl_gz(test::tokenizer_data_dir() + "/deepseek_chat_tools.jsonl.gz");
  ASSERT_GE(rows.size(), 400u);
  size_t v3 = 0, v31 = 0, with_calls = 0, thinking = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    const ChatFormat format = row["format"] == "deepseek_v31" ? ChatFormat::DeepSeekV31 : ChatFormat::DeepSeekV3;
    (format == ChatFormat::DeepSeekV31 ? v31 : v3)++;
    const std::vector<ChatMessage> messages = test::chat_messages(row["messages"]);
    for (const ChatMessage& m : messages) with_calls += m.tool_calls && !m.tool_calls->empty();
    thinking += row["thinking"].get<bool>();
    ASSERT_EQ(apply_chat_template(format, kBos, messages, test::chat_options(row)), row["text"].get<std::string>())
        << "row " << i << " (" << row["format"] << "): " << row["messages"].dump();
  }
  EXPECT_GT(v3, 150u);
  EXPECT_GT(v31, 150u);
  EXPECT_GT(with_calls, 100u);
  EXPECT_GT(thinking, 50u);
}

}  // namespace
}  // namespace deepinfer
