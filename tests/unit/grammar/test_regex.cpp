// Regex front-end against std::regex (ECMAScript, an independent implementation): random
// strings over each pattern's alphabet must be full matches for both or for neither.
#include <gtest/gtest.h>

#include <regex>

#include "core/error.h"
#include "tests/unit/grammar/test_util.h"

namespace deepinfer::grammar {
namespace {

using testing::matches;
using testing::small_vocab;

struct Case {
  const char* pattern;
  const char* alphabet;
};

TEST(GrammarRegex, AgreesWithStdRegexOnRandomStrings) {
  const Case cases[] = {
      {"[a-c]+", "abcd"},
      {"a|bc|", "abc"},
      {"(ab)*c?", "abc"},
      {"a{2,4}b{3}", "ab"},
      {"a{2,}", "ab"},
      {"[^ab]x", "abx-"},
      {"\\d+(\\.\\d{1,2})?", "0189.a"},
      {"(?:x|yz){1,3}", "xyz"},
      {"[\\w-]+@[a-z]+\\.(com|org)", "ab_-@.comrgx"},
      {"\\s*\\S\\s*", " \tab"},
      {"(a|b)*abb", "ab"},
      {"[0-9]{4}-[01][0-9]", "0129-"},
      {"\\x41\\u0042[\\-.]", "AB-.C"},
      {"colou?r", "colur"},
  };
  std::mt19937 rng(1234);
  auto vocab = small_vocab({});
  for (const auto& c : cases) {
    auto g = CompiledGrammar::compile({GrammarSpec::Kind::Regex, c.pattern}, vocab);
    std::regex re(c.pattern, std::regex::ECMAScript);
    std::string alphabet = c.alphabet;
    int num_match = 0;
    for (int i = 0; i < 400; ++i) {
      std::string s;
      int len = static_cast<int>(rng() % 9);
      for (int k = 0; k < len; ++k) s.push_back(alphabet[rng() % alphabet.size()]);
      bool expected = std::regex_match(s, re);
      num_match += expected;
      EXPECT_EQ(matches(g, s), expected) << "pattern /" << c.pattern << "/ text '" << s << "'";
    }
    (void)num_match;
  }
}

TEST(GrammarRegex, Utf8Classes) {
  auto vocab = small_vocab({});
  auto g = CompiledGrammar::compile({GrammarSpec::Kind::Regex, "[α-ω]+[^a]"}, vocab);
  EXPECT_TRUE(matches(g, "αβγ€"));
  EXPECT_TRUE(matches(g, "ωb"));
  EXPECT_FALSE(matches(g, "αa"));
  EXPECT_FALSE(matches(g, "a"));
  EXPECT_FALSE(matches(g, std::string("\xce", 1)));  // a lone lead byte is not a character
}

TEST(GrammarRegex, BadRegexSaysWhatAndWhere) {
  auto vocab = small_vocab({});
  for (const char* bad : {"(ab", "ab)", "[a-", "a{3,1}", "\\1", "(?=a)", "*a", "[z-a]", "\\p{L}"}) {
    try {
      CompiledGrammar::compile({GrammarSpec::Kind::Regex, bad}, vocab);
      ADD_FAILURE() << "accepted bad regex " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("position"), std::string::npos) << e.what();
    }
  }
}

TEST(GrammarRegex, HugeRepetitionIsRefusedNotExpanded) {
  auto vocab = small_vocab({});
  EXPECT_THROW(CompiledGrammar::compile({GrammarSpec::Kind::Regex, "(a{1000}){1000}"}, vocab), Error);
  EXPECT_THROW(CompiledGrammar::compile({GrammarSpec::Kind::Regex, "a{99999}"}, vocab), Error);
}

}  // namespace
}  // namespace deepinfer::grammar
