// OutputParser: DeepSeek reasoning and tool-call parsing, whole and fed piece by piece.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "server/deepseek_format.h"

namespace deepinfer::server {
namespace {

struct Parsed {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
};

Parsed parse(const std::string& text, bool reasoning, bool tools, size_t piece,
             ToolFormat format = ToolFormat::V3) {
  OutputParser p(reasoning, tools, format);
  Parsed out;
  std::string sofar;
  for (size_t i = 0; i < text.size(); i += piece) {
    sofar += text.substr(i, piece);
    const bool final = sofar.size() == text.size();
    ParsedDelta d = p.feed(sofar, final);
    out.reasoning += d.reasoning;
    out.content += d.content;
    for (auto& c : d.calls) out.calls.push_back(c);
  }
  return out;
}

const std::string kCall1 =
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>";
const std::string kCall2 =
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{\"a\": 1, \"b\": 2}\n```<｜tool▁call▁end｜>";

TEST(OutputParser, ToolCallsWholeAndByPieces) {
  const std::string text = "Let me check.<｜tool▁calls▁begin｜>" + kCall1 + "\n" + kCall2 + "<｜tool▁calls▁end｜>";
  for (size_t piece : {text.size(), size_t{1}, size_t{3}, size_t{7}}) {
    Parsed p = parse(text, false, true, piece);
    EXPECT_EQ(p.content, "Let me check.") << piece;
    ASSERT_EQ(p.calls.size(), 2u) << piece;
    EXPECT_EQ(p.calls[0].name, "get_weather");
    EXPECT_EQ(p.calls[0].arguments, "{\"city\": \"Paris\"}");
    EXPECT_EQ(p.calls[1].name, "add");
    EXPECT_EQ(p.calls[1].arguments, "{\"a\": 1, \"b\": 2}");
  }
}

TEST(OutputParser, RenderedCallsParseBack) {
  const std::vector<ToolCall> calls = {{"f", "{}"}, {"g", "{\"x\": [1]}"}};
  Parsed p = parse(render_tool_calls(calls), false, true, 5);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[1].name, "g");
  EXPECT_EQ(p.calls[1].arguments, "{\"x\": [1]}");
  EXPECT_EQ(p.content, "");
}

TEST(OutputParser, ReasoningWithAndWithoutOpeningTag) {
  for (const std::string& text : {std::string("<think>step one</think>The answer."),
                                  std::string("step one</think>The answer.")}) {
    for (size_t piece : {text.size(), size_t{1}, size_t{4}}) {
      Parsed p = parse(text, true, false, piece);
      EXPECT_EQ(p.reasoning, "step one") << text << " " << piece;
      EXPECT_EQ(p.content, "The answer.") << text << " " << piece;
    }
  }
  // Never closed: all of it is reasoning (R1's rule).
  Parsed open = parse("<think>still going", true, false, 2);
  EXPECT_EQ(open.reasoning, "still going");
  EXPECT_EQ(open.content, "");
}

TEST(OutputParser, PlainTextUnchangedAndMarkerPrefixesReleasedAtTheEnd) {
  Parsed p = parse("a <｜tool", false, true, 1);  // a prefix of the marker that never completes
  EXPECT_EQ(p.content, "a <｜tool");
  EXPECT_TRUE(p.calls.empty());
  Parsed q = parse("x </thi", true, false, 1);
  EXPECT_EQ(q.reasoning, "x </thi");
}

TEST(OutputParser, CallCutOffKeepsTextAsContent) {
  const std::string text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\"";
  Parsed p = parse(text, false, true, 3);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_NE(p.content.find("{\"a\""), std::string::npos);
}

TEST(OutputParser, V31CallsChainedWithoutSeparator) {
  const std::string text = "ok<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜>"
                           "<｜tool▁call▁begin｜>g<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  for (size_t piece : {text.size(), size_t{1}, size_t{5}}) {
    Parsed p = parse(text, false, true, piece, ToolFormat::V31);
    EXPECT_EQ(p.content, "ok");
    ASSERT_EQ(p.calls.size(), 2u) << piece;
    EXPECT_EQ(p.calls[0].name, "f");
    EXPECT_EQ(p.calls[0].arguments, "{\"a\": 1}");
    EXPECT_EQ(p.calls[1].name, "g");
  }
  const std::vector<ToolCall> calls = {{"f", "{}"}, {"g", "{\"x\": [1]}"}};
  EXPECT_EQ(render_tool_calls(calls, ToolFormat::V31),
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁call▁begin｜>g<｜tool▁sep｜>"
            "{\"x\": [1]}<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  EXPECT_EQ(tool_format_of("deepseek_v31"), ToolFormat::V31);
  EXPECT_EQ(tool_format_of("deepseek_v3"), ToolFormat::V3);
}

// deepseek_tool_parse.json (tools/server/make_chat_tools_fixture.py): model outputs and what vLLM's
// deepseek_v3 / deepseek_v31 tool parsers extract from them (their regexes restated there); where
// a case says "ours", our parser differs on purpose and the case gives our output and why.
TEST(OutputParser, MatchesVllmToolParsers) {
  std::ifstream f(std::string(DEEPINFER_SOURCE_DIR) + "/tests/unit/server/data/deepseek_tool_parse.json");
  ASSERT_TRUE(f.good());
  const nlohmann::json cases = nlohmann::json::parse(f);
  ASSERT_GE(cases.size(), 10u);
  for (const auto& c : cases) {
    const ToolFormat format = tool_format_of(c["format"].get<std::string>());
    const std::string output = c["output"].get<std::string>();
    const nlohmann::json& want = c.contains("ours") ? c["ours"] : c["vllm"];
    for (size_t piece : {output.size(), size_t{1}, size_t{4}}) {
      Parsed p = parse(output, false, true, piece, format);
      nlohmann::json calls = nlohmann::json::array();
      for (const ToolCall& t : p.calls) calls.push_back({{"name", t.name}, {"arguments", t.arguments}});
      EXPECT_EQ(calls, want["tool_calls"]) << c["format"] << " " << output << " piece " << piece;
      // vLLM: the text before the call list, null when empty (and the whole text without a list).
      const nlohmann::json content = p.calls.empty() && output.find(std::string(kToolCallsBegin)) == std::string::npos
                                         ? nlohmann::json(p.content)
                                         : p.content.empty() ? nlohmann::json(nullptr) : nlohmann::json(p.content);
      EXPECT_EQ(content, want["content"]) << c["format"] << " " << output << " piece " << piece;
    }
  }
}

}  // namespace
}  // namespace deepinfer::server
