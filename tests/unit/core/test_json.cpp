// core/json.h: the one JSON reading policy (size, UTF-8, depth, duplicate keys, bounded
// errors) and bounded snippets of values for error messages. Deep and large inputs are built
// here, at test time.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "core/json.h"

namespace deepinfer {
namespace {

std::string error_of(std::string_view text, const JsonLimits& limits = {}) {
  try {
    parse_json(text, "t.json", limits);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for input of " << text.size() << " bytes";
  return "";
}

std::string nested_arrays(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(Json, ParsesValuesAndKeepsOrderWhenAsked) {
  const nlohmann::json j = parse_json(R"({"b": [1, 2.5, "x", null, true], "a": {"c": -3}})", "t.json");
  EXPECT_EQ(j["b"][0], 1);
  EXPECT_EQ(j["b"][1], 2.5);
  EXPECT_EQ(j["b"][2], "x");
  EXPECT_TRUE(j["b"][3].is_null());
  EXPECT_EQ(j["a"]["c"], -3);
  EXPECT_EQ(j.dump(), nlohmann::json::parse(R"({"b": [1, 2.5, "x", null, true], "a": {"c": -3}})").dump());
  const nlohmann::ordered_json o = parse_ordered_json(R"({"z": 1, "a": 2, "m": {"y": 3, "b": 4}})", "t.json");
  EXPECT_EQ(o.dump(), R"({"z":1,"a":2,"m":{"y":3,"b":4}})");
}

TEST(Json, RefusesTextOverTheSizeLimit) {
  JsonLimits limits;
  limits.max_bytes = 10;
  const std::string msg = error_of("[1,2,3,4,5,6]", limits);
  EXPECT_NE(msg.find("t.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("13 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("limit of 10 bytes"), std::string::npos) << msg;
}

TEST(Json, ValidatesUtf8UpFrontNamingTheOffset) {
  const std::string msg = error_of("{\"k\": \"ab\xff\"}");
  EXPECT_NE(msg.find("invalid UTF-8 at byte offset 9"), std::string::npos) << msg;
  EXPECT_NE(error_of("[\"\xed\xa0\x80\"]").find("invalid UTF-8 at byte offset 2"), std::string::npos);  // surrogate
  EXPECT_NE(error_of("[\"\xc0\xaf\"]").find("invalid UTF-8"), std::string::npos);  // overlong
  EXPECT_NE(error_of("[\"\xe2\x82").find("invalid UTF-8 at byte offset 2"), std::string::npos);  // truncated
  EXPECT_EQ(find_invalid_utf8_offset("plain \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), std::string_view::npos);
}

TEST(Json, RefusesNestingPastTheDepthLimitWithoutRecursing) {
  // 200,000 deep: the reader used to build it, and any dump() of it overflowed the stack.
  const std::string msg = error_of(nested_arrays(200000));
  EXPECT_NE(msg.find("t.json: JSON nested deeper than the limit of 256"), std::string::npos) << msg;
  EXPECT_NE(msg.find("byte offset 256"), std::string::npos) << msg;
  EXPECT_NO_THROW(parse_json(nested_arrays(256), "t.json"));
  EXPECT_NE(error_of(nested_arrays(257)).find("deeper"), std::string::npos);
  const std::string objects = "{\"a\":" + std::string() + "{\"a\":{\"a\":1}}}";
  JsonLimits limits;
  limits.max_depth = 2;
  EXPECT_NE(error_of(objects, limits).find("limit of 2 "), std::string::npos);
  // Brackets inside strings (and escaped quotes) are not nesting.
  const std::string in_string = "[\"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"]";
  EXPECT_EQ(parse_json(in_string, "t.json")[0].get<std::string>().size(), 2001u);
}

TEST(Json, RefusesDuplicateKeysUnlessAllowed) {
  const std::string text = R"({"a": 1, "b": {"x": 1, "x": 2}})";
  const std::string msg = error_of(text);
  EXPECT_NE(msg.find("key 'x' appears twice"), std::string::npos) << msg;
  try {
    parse_ordered_json(R"({"q": 1, "q": 2})", "o.json");
    ADD_FAILURE() << "duplicate accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("o.json: key 'q' appears twice"), std::string::npos) << e.what();
  }
  JsonLimits limits;
  limits.allow_duplicate_keys = true;
  EXPECT_EQ(parse_json(text, "t.json", limits)["b"]["x"], 2);
  EXPECT_EQ(parse_ordered_json(R"({"q": 1, "r": 0, "q": 2})", "o.json", limits).dump(), R"({"q":2,"r":0})");
}

TEST(Json, SyntaxErrorsAreBoundedAndNameTheOffset) {
  // An unterminated 1 MB string: the parser's message quotes the token read so far.
  const std::string text = "{\"k\": \"" + std::string(1 << 20, 'a');
  const std::string msg = error_of(text);
  EXPECT_NE(msg.find("t.json: not valid JSON at byte offset"), std::string::npos) << msg.substr(0, 300);
  EXPECT_LT(msg.size(), 400u) << msg.substr(0, 300);
  EXPECT_NE(error_of("[1, 2").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("[1] x").find("not valid JSON"), std::string::npos);
}

TEST(Json, SyntaxErrorsStayValidUtf8) {
  // U+077E is valid UTF-8, but the lexer quotes its first byte alone as the bad token (found by
  // fuzz_request_line: "\xdd\xbe" as a JSONL line).
  for (const char* text : {"\xdd\xbe", "[\xe4\xb8\xad]", "{\"a\": \xf0\x9f\x98\x80}"}) {
    const std::string msg = error_of(text);
    EXPECT_NE(msg.find("not valid JSON at byte offset"), std::string::npos) << msg;
    EXPECT_EQ(find_invalid_utf8_offset(msg), std::string_view::npos) << msg;
  }
}

TEST(Json, LargeOrderedObjectsParseInLinearTime) {
  // 200,000 keys in one object: ordered_json's own parser searched every key (quadratic).
  std::string text = "{";
  for (int i = 0; i < 200000; ++i) text += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + std::to_string(i);
  text += "}";
  const nlohmann::ordered_json o = parse_ordered_json(text, "big.json");
  ASSERT_EQ(o.size(), 200000u);
  EXPECT_EQ(o.begin().key(), "k0");
  EXPECT_EQ(o.back(), 199999);
}

TEST(Json, SnippetsAreBoundedAndIterative) {
  nlohmann::json deep = nlohmann::json::array();
  for (int i = 0; i < 1000000; ++i) {  // far deeper than any recursive printer survives
    nlohmann::json outer = nlohmann::json::array();
    outer.push_back(std::move(deep));
    deep = std::move(outer);
  }
  const std::string s = json_snippet(deep, 40);
  EXPECT_EQ(s, std::string(40, '[') + "...");
  const nlohmann::json small = {{"a", 1}, {"b", {true, nullptr, "x"}}};
  EXPECT_EQ(json_snippet(small, 80), small.dump());
  const std::string long_string(100000, 'z');
  const std::string ls = json_snippet(nlohmann::json(long_string), 20);
  EXPECT_EQ(ls, "\"" + std::string(19, 'z') + "...");
  nlohmann::ordered_json keys = nlohmann::ordered_json::object();
  keys[std::string(5000, 'k')] = 1;
  EXPECT_EQ(json_snippet(keys, 10), "{\"kkkkkkkk...");
  // Cut at a character boundary: "é" is 2 bytes.
  EXPECT_EQ(json_snippet(nlohmann::json("\xc3\xa9\xc3\xa9\xc3\xa9"), 4), "\"\xc3\xa9...");
}

TEST(Json, TextSnippetKeepsShortTextAndCutsLongText) {
  EXPECT_EQ(text_snippet("short", 80), "short");
  EXPECT_EQ(text_snippet(std::string(1000, 'n'), 10), std::string(10, 'n') + "... (1000 bytes)");
}

}  // namespace
}  // namespace deepinfer
