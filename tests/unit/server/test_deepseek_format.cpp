// OutputParser: DeepSeek reasoning and tool-call parsing, whole and fed piece by piece.
#include <gtest/gtest.h>

#include "server/deepseek_format.h"

namespace deepinfer::server {
namespace {

struct Parsed {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
};

Parsed parse(const std::string& text, bool reasoning, bool tools, size_t piece) {
  OutputParser p(reasoning, tools);
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

}  // namespace
}  // namespace deepinfer::server
