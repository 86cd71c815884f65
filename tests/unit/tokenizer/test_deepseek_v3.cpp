// DeepSeek-V3's own tokenizer (/work/shared/data/tokenizers/deepseek-v3; skipped when absent):
// exact agreement with HF `tokenizers` on the 10k-string corpus (make_fixture.py), and chat
// encoding equal to transformers' apply_chat_template on its tokenizer_config template
// (make_chat_fixture.py), whose rendered text must also encode to HF's ids.
// Loading the 7.8 MB tokenizer.json makes this binary slow under sanitizers: LABELS slow.
#include <gtest/gtest.h>

#include "tests/unit/tokenizer/chat_rows.h"
#include "tests/unit/tokenizer/check_fixture.h"
#include "tests/unit/tokenizer/fixture.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

TEST(TokenizerAgreement, DeepSeekV3MatchesHfTokenizers) {
  if (!test::have_deepseek_v3()) GTEST_SKIP() << "no " << test::deepseek_v3_dir();
  const Tokenizer tok = Tokenizer::from_dir(test::deepseek_v3_dir());
  EXPECT_EQ(tok.vocab_size(), 128815);
  EXPECT_EQ(tok.bos_id(), 0);
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_TRUE(tok.add_bos_token());
  test::check_fixture(tok, test::tokenizer_data_dir() + "/deepseek_v3_fixture.jsonl.gz", 10000);
}

TEST(TokenizerChat, DeepSeekV3MatchesTransformersTemplate) {
  if (!test::have_deepseek_v3()) GTEST_SKIP() << "no " << test::deepseek_v3_dir();
  const Tokenizer tok = Tokenizer::from_dir(test::deepseek_v3_dir());
  const auto rows = test::read_jsonl_gz(test::tokenizer_data_dir() + "/deepseek_v3_chat.jsonl.gz");
  ASSERT_GE(rows.size(), 100u);
  size_t num_with_tools = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<ChatMessage> messages;
    for (const auto& m : rows[i]["messages"]) {
      messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
      num_with_tools += messages.back().role == "tool";
    }
    const std::string text = apply_chat_template(tok, messages, rows[i]["add_generation_prompt"].get<bool>());
    ASSERT_EQ(text, rows[i]["text"].get<std::string>()) << "conversation " << i;
    EXPECT_EQ(tok.encode(text), rows[i]["ids"].get<std::vector<int32_t>>()) << "conversation " << i;
  }
  EXPECT_GT(num_with_tools, 10u);
}

// Tool calls and tool results (deepseek_chat_tools.jsonl.gz, V3 rows): the checkpoint's own
// template is picked from its tokenizer_config, and the rendered text encodes to HF's ids.
TEST(TokenizerChat, DeepSeekV3ToolCallsMatchTransformers) {
  if (!test::have_deepseek_v3()) GTEST_SKIP() << "no " << test::deepseek_v3_dir();
  const Tokenizer tok = Tokenizer::from_dir(test::deepseek_v3_dir());
  EXPECT_EQ(tok.chat_format(), ChatFormat::DeepSeekV3);
  const auto rows = test::read_jsonl_gz(test::tokenizer_data_dir() + "/deepseek_chat_tools.jsonl.gz");
  size_t checked = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i]["format"] != "deepseek_v3") continue;
    const std::string text = apply_chat_template(tok, test::chat_messages(rows[i]["messages"]), test::chat_options(rows[i]));
    ASSERT_EQ(text, rows[i]["text"].get<std::string>()) << "row " << i;
    EXPECT_EQ(tok.encode(text), rows[i]["ids"].get<std::vector<int32_t>>()) << "row " << i;
    ++checked;
  }
  EXPECT_GT(checked, 150u);
}

}  // namespace
}  // namespace deepinfer
