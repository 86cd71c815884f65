// Request bodies: depth and size limits, invalid JSON and invalid UTF-8 give clear errors.
#include <gtest/gtest.h>

#include "server/json_body.h"

namespace deepinfer::server {
namespace {

TEST(JsonBody, ParsesObjects) {
  EXPECT_EQ(parse_request_json(R"({"a": [1, {"b": 2}]})", 1000)["a"][1]["b"], 2);
}

TEST(JsonBody, RejectsDeepNestingWithoutRecursingFar) {
  const std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_NO_THROW(parse_request_json(ok, 1 << 20));
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  try {
    parse_request_json(deep, 1 << 20);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("deeper than 64"), std::string::npos) << e.what();
  }
}

TEST(JsonBody, RejectsOversizeInvalidAndBadUtf8) {
  EXPECT_THROW(parse_request_json(std::string(2000, ' '), 1000), std::invalid_argument);
  EXPECT_THROW(parse_request_json("{\"a\": ", 1000), std::invalid_argument);
  EXPECT_THROW(parse_request_json("{\"a\": \"\xff\"}", 1000), std::invalid_argument);
}

TEST(JsonBody, DumpReplacesInvalidUtf8) {
  nlohmann::json j = {{"text", std::string("ok\xff")}};
  EXPECT_EQ(dump_json(j), "{\"text\":\"ok\xEF\xBF\xBD\"}");
}

TEST(JsonBody, DumpEscapesUnicodeLineSeparators) {
  // Raw, these split an SSE line in clients that read lines like str.splitlines() (httpx).
  nlohmann::json j = {{"text", std::string("a\xE2\x80\xA8" "b\xE2\x80\xA9" "c\xC2\x85" "d\xC3\xA9")}};
  const std::string s = dump_json(j);
  EXPECT_EQ(s, "{\"text\":\"a\\u2028b\\u2029c\\u0085d\xC3\xA9\"}");
  EXPECT_EQ(nlohmann::json::parse(s), j);  // same value after the escape
}

}  // namespace
}  // namespace deepinfer::server
