// JSONL request lines: checked conversions (no wrap), bounds, bounded error messages,
// UTF-8 and depth checks before parsing, the line reader's byte limit, and
// generation_config.json's sampling fields.
#include <gtest/gtest.h>

#include <sstream>

#include "app/request_line.h"
#include "core/error.h"

namespace deepinfer::app {
namespace {

// As BatchJob: parse, then SamplingParams::validate() (the documented bounds).
std::string error_of(const std::string& line) {
  try {
    parse_request_line(line, 7, SamplingParams{}).params.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RequestLine, ParsesEveryField) {
  const std::string line =
      R"({"prompt": "hi", "n": 2, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.1,)"
      R"( "repetition_penalty": 1.1, "frequency_penalty": 0.5, "presence_penalty": -0.5, "max_tokens": 8.0,)"
      R"( "min_tokens": 2, "stop": ["a", "b"], "stop_token_ids": [5], "seed": 18446744073709551615,)"
      R"( "seq_seed": 3, "logprobs": 2, "ignore_eos": true, "skip_special_tokens": false,)"
      R"( "include_stop_str_in_output": true, "regex": "[a-z]+"})";
  const RequestLine r = parse_request_line(line, 1, SamplingParams{});
  EXPECT_EQ(r.prompt.text, "hi");
  EXPECT_EQ(r.params.n, 2);
  EXPECT_FLOAT_EQ(r.params.temperature, 0.5f);
  EXPECT_EQ(r.params.top_k, 40);
  EXPECT_EQ(r.params.max_tokens, 8);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(*r.params.seed, 18446744073709551615ull);
  EXPECT_EQ(r.params.logprobs, 2);
  EXPECT_TRUE(r.params.ignore_eos);
  EXPECT_FALSE(r.params.skip_special_tokens);
  EXPECT_EQ(r.params.so_args.kind, "regex");
}

TEST(RequestLine, DefaultsApplyAndLineOverrides) {
  SamplingParams d;
  d.max_tokens = 3;
  d.temperature = 0.0f;
  d.so_args = {"regex", "x+"};
  const RequestLine a = parse_request_line(R"({"prompt": "p"})", 1, d);
  EXPECT_EQ(a.params.max_tokens, 3);
  EXPECT_EQ(a.params.so_args.kind, "regex");
  const RequestLine b = parse_request_line(R"({"prompt": "p", "max_tokens": 5, "ebnf": "root ::= \"a\""})", 1, d);
  EXPECT_EQ(b.params.max_tokens, 5);
  EXPECT_EQ(b.params.so_args.kind, "ebnf");
}

TEST(RequestLine, IntegersDoNotWrap) {
  EXPECT_NE(error_of(R"({"prompt": "p", "max_tokens": 4294967298})").find("out of range"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": "p", "n": 4294967297})").find("out of range"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": "p", "n": 1e20})").find("out of range"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": "p", "n": 2.5})").find("expected an integer"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": "p", "seed": -1})").find("seed"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": "p", "seed": 18446744073709551616})").find("seed"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt_token_ids": [1, 4294967297]})").find("out of range"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": "p", "temperature": 1e300})").find("32-bit float"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": "p", "max_tokens": "8"})").find("expected an integer"), std::string::npos);
}

TEST(RequestLine, DocumentedBounds) {
  using SP = SamplingParams;
  EXPECT_NE(error_of(R"({"prompt": "p", "n": 1e9})").find("n: must be in [1, 128]"), std::string::npos);
  EXPECT_EQ(error_of(R"({"prompt": "p", "n": 128})"), "");
  EXPECT_NE(error_of(R"({"prompt": "p", "max_tokens": 1048577})").find("max_tokens"), std::string::npos);
  EXPECT_EQ(error_of(R"({"prompt": "p", "max_tokens": 1048576})"), "");
  EXPECT_NE(error_of(R"({"prompt": "p", "logprobs": 21})").find("logprobs"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": "p", "top_k": 1048577})").find("top_k"), std::string::npos);
  std::string stops = "[";
  for (size_t i = 0; i <= SP::kMaxStops; ++i) stops += std::string(i ? "," : "") + "\"s" + std::to_string(i) + "\"";
  EXPECT_NE(error_of(R"({"prompt": "p", "stop": )" + stops + "]}").find("at most 64"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": "p", "stop": ")" + std::string(SP::kMaxStopBytes + 1, 'a') + "\"}")
                .find("at most 1024"),
            std::string::npos);
  EXPECT_EQ(error_of(R"({"prompt": "p", "stop": ")" + std::string(SP::kMaxStopBytes, 'a') + "\"}"), "");
  std::string ids = "[";
  for (size_t i = 0; i <= SP::kMaxStopTokenIds; ++i) ids += std::string(i ? "," : "") + "1";
  EXPECT_NE(error_of(R"({"prompt": "p", "stop_token_ids": )" + ids + "]}").find("stop_token_ids"), std::string::npos);
}

TEST(RequestLine, InvalidUtf8IsTheLinesErrorAndNotEchoed) {
  const std::string e = error_of("{\"prompt\": \"x\xff\"}");
  EXPECT_NE(e.find("line 7: not valid JSON: invalid UTF-8 at byte offset 13"), std::string::npos) << e;
  EXPECT_EQ(e.find('\xff'), std::string::npos);
}

TEST(RequestLine, ErrorsDoNotEchoUnboundedInput) {
  const std::string big(1 << 20, 'a');
  // An unterminated string: nlohmann's own message would quote all of it. The JSON policy's
  // syntax errors (core/json.h) give the offset, line and column and a cut message: < 300 bytes.
  EXPECT_LT(error_of("{\"prompt\": \"" + big).size(), 300u);
  EXPECT_LT(error_of("{\"" + big + "\": 1}").size(), 200u);          // unknown field name
  EXPECT_LT(error_of("{\"prompt\": \"p\", \"regex\": 1" + big).size(), 200u);
  EXPECT_NE(error_of("{\"" + big + "\": 1}").find("unknown field 'aaaa"), std::string::npos);
}

TEST(RequestLine, DeepNestingIsRefusedBeforeParsing) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_NE(error_of("{\"prompt\": \"p\", \"x\": " + deep + "}").find("nested deeper than the limit of 128"), std::string::npos);
  // Brackets inside strings do not count.
  EXPECT_EQ(error_of("{\"prompt\": \"" + std::string(1000, '[') + "\"}"), "");
}

TEST(RequestLine, ShapesAndTypes) {
  EXPECT_NE(error_of("[1, 2]").find("expected a JSON object"), std::string::npos);
  EXPECT_NE(error_of("{}").find("needs a non-empty prompt"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": "a", "prompt_token_ids": [1]})").find("one of prompt"), std::string::npos);
  EXPECT_NE(error_of(R"({"messages": [{"role": "user"}]})").find("\"content\""), std::string::npos);
  EXPECT_NE(error_of(R"({"messages": "hi"})").find("messages"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": 5})").find("prompt: expected a string"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": "p", "ignore_eos": 1})").find("ignore_eos"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": "p", "regex": "a", "ebnf": "b"})").find("only one of"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": "p", "json_schema": 3})").find("json_schema"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": "p", "temperature": -1})").find("temperature"), std::string::npos);
}

TEST(JsonlReader, SkipsBlankLinesAndLimitsLineLength) {
  std::istringstream in("{\"a\":1}\n\n  \r\n" + std::string(100, 'x') + "\nlast");
  JsonlReader reader(in, 50);
  auto a = reader.next();
  ASSERT_TRUE(a);
  EXPECT_EQ(a->text, "{\"a\":1}");
  EXPECT_EQ(a->line_no, 1);
  auto b = reader.next();
  ASSERT_TRUE(b);
  EXPECT_TRUE(b->too_long);
  EXPECT_TRUE(b->text.empty());
  EXPECT_EQ(b->line_no, 4);
  auto c = reader.next();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->text, "last");
  EXPECT_EQ(c->line_no, 5);
  EXPECT_FALSE(reader.next());
}

TEST(RequestLine, TruncateKeepsUtf8Boundaries) {
  EXPECT_EQ(truncate_for_message("abc", 5), "abc");
  EXPECT_EQ(truncate_for_message("abcdef", 3), "abc...");
  EXPECT_EQ(truncate_for_message("a\xc3\xa9z", 2), "a...");  // does not split é
}

TEST(GenerationConfig, ReadsSamplingFields) {
  const GenerationDefaults g = parse_generation_config(
      R"({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 64, "do_sample": true, "min_p": null})",
      "gc.json");
  EXPECT_FLOAT_EQ(*g.temperature, 0.6f);
  EXPECT_FLOAT_EQ(*g.top_p, 0.95f);
  EXPECT_EQ(*g.top_k, 20);
  EXPECT_EQ(*g.max_tokens, 64);
  EXPECT_FALSE(g.min_p);
  EXPECT_FALSE(g.repetition_penalty);
  EXPECT_TRUE(parse_generation_config(R"({"bos_token_id": 0, "do_sample": false})", "gc.json").empty());
  try {
    parse_generation_config(R"({"top_k": "x"})", "gc.json");
    FAIL() << "a string top_k was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gc.json: top_k: expected an integer"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer::app
