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

}  // namespace
}  // namespace deepinfer::server
