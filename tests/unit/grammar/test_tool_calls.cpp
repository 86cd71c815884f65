// Tool-call grammars (grammar/tool_calls.cpp): marker-wrapped calls whose arguments follow each
// function's JSON Schema, in DeepSeek-V3's and V3.1's layouts as the server writes them.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tests/unit/grammar/test_util.h"

namespace deepinfer::grammar {
namespace {

using testing::matches;
using testing::small_vocab;

const nlohmann::json kWeather = {{"type", "object"},
                                 {"properties", {{"city", {{"type", "string"}}}}},
                                 {"required", {"city"}},
                                 {"additionalProperties", false}};
const nlohmann::json kAdd = {{"type", "object"},
                             {"properties", {{"a", {{"type", "integer"}}}, {"b", {{"type", "integer"}}}}},
                             {"required", {"a", "b"}},
                             {"additionalProperties", false}};

std::shared_ptr<const CompiledGrammar> compile(const nlohmann::json& source) {
  return CompiledGrammar::compile({GrammarSpec::Kind::ToolCalls, source.dump(), false}, small_vocab({}));
}

TEST(GrammarToolCalls, V3LayoutOneOrMoreCallsWithSchemaArguments) {
  const nlohmann::json src = {
      {"begin", "<B>"}, {"end", "<E>"}, {"separator", "\n"}, {"min_calls", 1}, {"max_calls", -1},
      {"calls",
       {{{"prefix", "<c>function<s>get_weather\n```json\n"}, {"schema", kWeather}, {"suffix", "\n```</c>"}},
        {{"prefix", "<c>function<s>add\n```json\n"}, {"schema", kAdd}, {"suffix", "\n```</c>"}}}}};
  auto g = compile(src);
  const std::string w = "<c>function<s>get_weather\n```json\n{\"city\":\"Paris\"}\n```</c>";
  const std::string a = "<c>function<s>add\n```json\n{\"a\":1,\"b\":-2}\n```</c>";
  EXPECT_TRUE(matches(g, "<B>" + w + "<E>"));
  EXPECT_TRUE(matches(g, "<B>" + w + "\n" + a + "\n" + w + "<E>"));
  EXPECT_FALSE(matches(g, "<B><E>"));                        // at least one call
  EXPECT_FALSE(matches(g, "<B>" + w + a + "<E>"));           // the separator is required
  EXPECT_FALSE(matches(g, "<B><c>function<s>add\n```json\n{\"a\":1}\n```</c><E>"));  // b required
  EXPECT_FALSE(matches(g, "<B><c>function<s>add\n```json\n{\"a\":\"x\",\"b\":2}\n```</c><E>"));
  EXPECT_FALSE(matches(g, "<B><c>function<s>get_time\n```json\n{}\n```</c><E>"));  // unknown name
}

TEST(GrammarToolCalls, V31LayoutExactlyOneCall) {
  const nlohmann::json src = {{"begin", "<B>"}, {"end", "<E>"}, {"min_calls", 1}, {"max_calls", 1},
                              {"calls", {{{"prefix", "<c>add<s>"}, {"schema", kAdd}, {"suffix", "</c>"}}}}};
  auto g = compile(src);
  EXPECT_TRUE(matches(g, "<B><c>add<s>{\"a\":1,\"b\":2}</c><E>"));
  EXPECT_FALSE(matches(g, "<B><c>add<s>{\"a\":1,\"b\":2}</c><c>add<s>{\"a\":1,\"b\":2}</c><E>"));
  EXPECT_FALSE(matches(g, "<B><c>add<s>{\"a\":1,\"b\":2,\"c\":3}</c><E>"));  // additionalProperties false
}

TEST(GrammarToolCalls, BadSourcesNameTheField) {
  auto error = [](const std::string& source) {
    try {
      CompiledGrammar::compile({GrammarSpec::Kind::ToolCalls, source, false}, small_vocab({}));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error("[]").find("tool calls"), std::string::npos);
  EXPECT_NE(error(R"({"begin": "<B>", "end": "<E>", "calls": []})").find("calls"), std::string::npos);
  EXPECT_NE(error(R"({"begin": "<B>", "end": "<E>", "min_calls": 0, "calls": [{"prefix": "", "schema": {}, "suffix": ""}]})")
                .find("min_calls"), std::string::npos);
  EXPECT_NE(error(R"({"begin": "<B>", "end": "<E>", "calls": [{"prefix": "", "schema": {"type": "nope"}, "suffix": ""}]})")
                .find("calls[0].schema"), std::string::npos);
  EXPECT_NE(error(R"({"begin": "<B>", "end": "<E>", "calls": [{"schema": {}, "suffix": ""}]})").find("prefix"),
            std::string::npos);
}

}  // namespace
}  // namespace deepinfer::grammar
