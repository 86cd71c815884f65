// JSON Schema keywords added for issue #6 item 1/5 (presence constraints, not, multipleOf,
// pattern with lengths, enum/const filtered by the whole schema): accepted and rejected
// instances written by hand; every one was checked against Python's jsonschema 4.26
// (Draft 2020-12, Draft 7 where `dependencies` is used; FormatChecker on). The property
// test (tests/property/cases.json) validates generated strings the same way.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "tests/unit/grammar/test_util.h"

namespace deepinfer::grammar {
namespace {

using testing::matches;
using testing::small_vocab;

struct Case {
  const char* schema;
  std::vector<std::string> accepted;
  std::vector<std::string> rejected;
};

std::shared_ptr<const CompiledGrammar> compile_schema(const std::string& schema) {
  return CompiledGrammar::compile({GrammarSpec::Kind::JsonSchema, schema, true}, small_vocab({}));
}

const std::vector<Case>& cases() {
  static const std::vector<Case> kCases = {
      {R"({"type":"object","minProperties":1,"maxProperties":2,"additionalProperties":{"type":"integer"}})",
       {R"({"a":1})", R"({"a":1,"b":2})"},
       {R"({})", R"({"a":1,"b":2,"c":3})", R"({"a":"x"})"}},
      {R"({"properties":{"card":{"type":"integer"},"addr":{"type":"string"}},"dependencies":{"card":["addr"]},"additionalProperties":false})",
       {R"({})", R"({"addr":"x"})", R"({"card":1,"addr":"x"})"},
       {R"({"card":1})", R"({"card":1,"zip":"x"})"}},
      {R"({"properties":{"x":{"type":"integer"}},"dependentRequired":{"x":["y"]}})",
       {R"({"x":1,"y":null})", R"({"z":1})", R"({})"},
       {R"({"x":1})", R"({"x":1,"z":2})"}},
      {R"({"properties":{"p":{"type":"null"},"q":{"type":"null"}},"dependentSchemas":{"p":{"required":["q"]}},"additionalProperties":false})",
       {R"({"p":null,"q":null})", R"({"q":null})"},
       {R"({"p":null})"}},
      {R"({"properties":{"cmd":{"type":"string"},"args":{"type":"array"}},"not":{"allOf":[{"required":["cmd"]},{"required":["args"]}]}})",
       {R"({"cmd":"a"})", R"({"args":[]})", R"({})", R"({"cmd":"a","other":1})"},
       {R"({"cmd":"a","args":[]})", R"("str")", R"(5)"}},
      {R"({"properties":{"a":{},"b":{}},"oneOf":[{"required":["a"]},{"required":["b"]}],"additionalProperties":false})",
       {R"({"a":1})", R"({"b":2})"},
       {R"({"a":1,"b":2})", R"({})"}},
      {R"({"not":{"type":["string","object"]}})",
       {R"(1)", R"(null)", R"([1])", R"(true)", R"(2.5)"},
       {R"("x")", R"({})"}},
      {R"({"type":"integer","multipleOf":7})",
       {R"(0)", R"(7)", R"(21)", R"(-14)", R"(700000007)"},
       {R"(1)", R"(8)", R"(-15)", R"(700000008)", R"(7.5)"}},
      {R"({"type":"integer","minimum":-20,"maximum":40,"multipleOf":16})",
       {R"(-16)", R"(0)", R"(16)", R"(32)"},
       {R"(48)", R"(-32)", R"(8)", R"(-8)"}},
      {R"({"type":"number","multipleOf":5})",
       {R"(10)", R"(-5)"},
       {R"(12)", R"(2.5)"}},
      {R"({"multipleOf":3})",
       {R"(9)", R"("s")", R"(null)"},
       {R"(10)"}},
      {R"({"type":"string","minLength":1,"pattern":"^[a-z]+$"})",
       {R"("ab")", R"("z")"},
       {R"("")", R"("A")", R"("a1")"}},
      {R"({"type":"string","minLength":10,"maxLength":10,"format":"date"})",
       {R"("2024-02-29")"},
       {R"("2023-02-29")", R"("x")"}},
      {R"({"type":"string","minLength":2,"maxLength":4,"pattern":"^x[a-z]+$"})",
       {R"("xa")", R"("xabc")"},
       {R"("x")", R"("xabcd")", R"("ya")"}},
      {R"({"type":"string","maxLength":7,"pattern":"^v-(ab)*(x|y)$"})",
       {R"("v-x")", R"("v-aby")", R"("v-ababx")"},
       {R"("v-abababx")", R"("v-")", R"("v-abyz")"}},
      {R"({"allOf":[{"enum":["a","b",1,2.0]},{"enum":["b",2,3]}]})",
       {R"("b")", R"(2)", R"(2.0)"},
       {R"("a")", R"(1)", R"(3)"}},
      {R"({"enum":[1,"a",null,2.5],"not":{"type":"string"}})",
       {R"(1)", R"(null)", R"(2.5)"},
       {R"("a")", R"(2)"}},
      {R"({"allOf":[{"enum":[-2,3]},{"not":{"not":{"enum":[-2.0]}}}]})",
       {R"(-2)"},
       {R"(3)", R"(-2.5)"}},
      {R"({"type":"string","minLength":1,"not":{"enum":["upstart","a"]}})",
       {R"("upstar")", R"("upstarts")", R"("b")", R"("ab")"},
       {R"("upstart")", R"("a")", R"("")", R"("\u0061")", R"(5)"}},
      {R"({"const":{"a":1},"oneOf":[{"required":["a"]},{"required":["b"]}]})",
       {R"({"a":1})", R"({"a":1.0})"},
       {R"({"a":2})", R"({})"}},
  };
  return kCases;
}

TEST(JsonSchemaKeywords, AcceptsValidAndRejectsInvalidInstances) {
  for (const Case& c : cases()) {
    auto g = compile_schema(c.schema);
    for (const auto& text : c.accepted) EXPECT_TRUE(matches(g, text)) << c.schema << "\n  valid: " << text;
    for (const auto& text : c.rejected) EXPECT_FALSE(matches(g, text)) << c.schema << "\n  invalid: " << text;
  }
}

TEST(JsonSchemaKeywords, WhitespaceAndSeparatorsUnderPresenceRules) {
  // Separators follow whether a member was emitted, also when the first members are skipped.
  auto g = compile_schema(R"({"properties":{"a":{},"b":{},"c":{}},"maxProperties":2,"additionalProperties":false})");
  EXPECT_TRUE(matches(g, R"({ "b" : 1 , "c" : 2 })"));
  EXPECT_FALSE(matches(g, R"({,"b":1})"));
  EXPECT_FALSE(matches(g, R"({"a":1,"b":1,"c":1})"));
}

TEST(JsonSchemaKeywords, RefusesWhatAGrammarCannotExpressWithAReason) {
  const std::vector<std::pair<const char*, const char*>> refused = {
      {R"({"type":"number","multipleOf":0.01})", R"(multipleOf)"},
      {R"({"type":"string","maxLength":3,"pattern":"^([a-z]|ab)+$"})", R"(pattern)"},
      {R"({"type":"string","maxLength":3,"pattern":"[a-z]+"})", R"(pattern)"},
      {R"({"not":{"pattern":"x"}})", R"('not')"},
      {R"({"properties":{"a":{}},"dependencies":{"a":{"properties":{"b":{"type":"string"}}}}})", R"(dependencies/a)"},
      {R"({"type":"integer","minimum":5,"multipleOf":3})", R"(multipleOf)"},
  };
  for (const auto& [schema, why] : refused) {
    try {
      compile_schema(schema);
      ADD_FAILURE() << "compiled: " << schema;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
}

TEST(JsonSchemaKeywords, PresenceConstraintsOverTooManyPropertiesAreRefused) {
  std::string props, deps;
  for (int i = 0; i < 14; ++i) {
    props += std::string(i ? "," : "") + "\"p" + std::to_string(i) + "\":{}";
    deps += std::string(i ? "," : "") + "\"p" + std::to_string(i) + "\":[\"p" + std::to_string((i + 1) % 14) + "\"]";
  }
  EXPECT_THROW(compile_schema("{\"properties\":{" + props + "},\"dependencies\":{" + deps + "}}"), Error);
}

}  // namespace
}  // namespace deepinfer::grammar
