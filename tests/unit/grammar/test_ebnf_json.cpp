// EBNF (GBNF and W3C forms) against std::regex / a counter on random strings, JSON object
// grammar against nlohmann::json::accept on mutated documents, errors with positions.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "core/error.h"
#include "tests/unit/grammar/test_util.h"

namespace deepinfer::grammar {
namespace {

using testing::matches;
using testing::small_vocab;

std::string random_string(std::mt19937& rng, const std::string& alphabet, int max_len) {
  std::string s;
  int len = static_cast<int>(rng() % (max_len + 1));
  for (int k = 0; k < len; ++k) s.push_back(alphabet[rng() % alphabet.size()]);
  return s;
}

TEST(GrammarEbnf, GbnfAgreesWithEquivalentRegex) {
  const char* gbnf = R"(
    # a comma-separated list
    root ::= item ("," item)*
    item ::= [a-c]+ | "x" digit{1,2}
    digit ::= [0-9]
  )";
  auto g = CompiledGrammar::compile({GrammarSpec::Kind::Ebnf, gbnf}, small_vocab({}));
  std::regex re("([a-c]+|x[0-9]{1,2})(,([a-c]+|x[0-9]{1,2}))*");
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string s = random_string(rng, "abx09,", 8);
    EXPECT_EQ(matches(g, s), std::regex_match(s, re)) << s;
  }
}

TEST(GrammarEbnf, W3cSyntaxAgreesWithEquivalentRegex) {
  const char* w3c = "root ::= 'a' #x62 [#x63-#x64]? /* comment */ tail*\ntail ::= \"e\" | [^a-e]";
  auto g = CompiledGrammar::compile({GrammarSpec::Kind::Ebnf, w3c}, small_vocab({}));
  std::regex re("ab[c-d]?(e|[^a-e])*");
  std::mt19937 rng(8);
  for (int i = 0; i < 2000; ++i) {
    std::string s = random_string(rng, "abcdefz", 7);
    EXPECT_EQ(matches(g, s), std::regex_match(s, re)) << s;
  }
}

TEST(GrammarEbnf, RecursiveGrammarAgreesWithCounter) {
  auto g = CompiledGrammar::compile({GrammarSpec::Kind::Ebnf, "root ::= \"(\" root* \")\""}, small_vocab({}));
  auto balanced = [](const std::string& s) {
    int depth = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      depth += s[i] == '(' ? 1 : -1;
      if (depth < 0 || (depth == 0 && i + 1 != s.size())) return false;
    }
    return depth == 0 && !s.empty();
  };
  std::mt19937 rng(9);
  for (int i = 0; i < 3000; ++i) {
    std::string s = random_string(rng, "()", 10);
    EXPECT_EQ(matches(g, s), balanced(s)) << s;
  }
}

TEST(GrammarEbnf, ErrorsNameLineAndColumn) {
  auto vocab = small_vocab({});
  auto message = [&](const std::string& text) -> std::string {
    try {
      CompiledGrammar::compile({GrammarSpec::Kind::Ebnf, text}, vocab);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message("root ::= \"a\"\nx ::= [a-").find("line 2"), std::string::npos);
  EXPECT_NE(message("root ::= foo").find("'foo' is used but not defined"), std::string::npos);
  EXPECT_NE(message("root ::= root \"a\" | \"b\"").find("left recursion"), std::string::npos);
  EXPECT_NE(message("root ::= (\"a\"").find("missing ')'"), std::string::npos);
  EXPECT_NE(message("root \"a\"").find("'::='"), std::string::npos);
  EXPECT_NE(message("").find("empty grammar"), std::string::npos);
}

TEST(GrammarJson, ObjectGrammarAgreesWithJsonParserOnMutations) {
  auto g = CompiledGrammar::compile({GrammarSpec::Kind::JsonObject, ""}, small_vocab({}));
  const std::string seeds[] = {
      R"({"a": [1, -2.5e3, true, null, "x\n\u00e9"], "b": {}})",
      R"({ "k" : { "n" : [ [ ] , { } ] } , "z":0.0 })",
      R"({"s":"\"quoted\" and \\ slash","e":1E+2})",
  };
  std::mt19937 rng(10);
  const std::string pieces = "{}[],:\"\\ 0123456789.eE+-truefalsn";
  for (const auto& seed : seeds) {
    EXPECT_TRUE(matches(g, seed)) << seed;
    for (int i = 0; i < 1500; ++i) {
      std::string s = seed;
      int edits = 1 + static_cast<int>(rng() % 2);
      for (int k = 0; k < edits && !s.empty(); ++k) {
        size_t pos = rng() % s.size();
        switch (rng() % 3) {
          case 0: s.erase(pos, 1); break;
          case 1: s.insert(pos, 1, pieces[rng() % pieces.size()]); break;
          default: s[pos] = pieces[rng() % pieces.size()];
        }
      }
      bool expected = nlohmann::json::accept(s) && nlohmann::json::parse(s).is_object();
      EXPECT_EQ(matches(g, s), expected) << s;
    }
  }
}

TEST(GrammarJson, SchemaErrorsNameThePath) {
  auto vocab = small_vocab({});
  auto message = [&](const std::string& schema) -> std::string {
    try {
      CompiledGrammar::compile({GrammarSpec::Kind::JsonSchema, schema}, vocab);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(R"({"properties": {"a": {"not": {}}}})").find("#/properties/a"), std::string::npos);
  EXPECT_NE(message(R"({"$ref": "#/$defs/missing"})").find("does not resolve"), std::string::npos);
  EXPECT_NE(message(R"({"type": "string", "pattern": "(a"})").find("pattern"), std::string::npos);
  EXPECT_NE(message("{not json").find("not valid JSON"), std::string::npos);
  // maxLength past the grammar size limit is capped (under-approximation); minLength is refused.
  EXPECT_NE(message(R"({"type": "string", "minLength": 100000})").find("minLength"), std::string::npos);
  EXPECT_NE(message(R"({"patternProperties": {"^a": {}, "^b": {}}})").find("patternProperties"), std::string::npos);
}

}  // namespace
}  // namespace deepinfer::grammar
