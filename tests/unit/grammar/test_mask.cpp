// The mask against brute force: on small vocabularies, along random walks, bit t is set
// exactly when accept_bytes(token t) would succeed from the same state (byte-level stepping,
// independent of the mask cache), and EOS exactly when the grammar can terminate. Strings
// sampled under the mask are checked by std::regex. Rollback restores earlier masks.
#include <gtest/gtest.h>

#include <regex>

#include "tests/unit/grammar/test_util.h"

namespace deepinfer::grammar {
namespace {

using testing::bit;
using testing::small_vocab;

const std::vector<std::string> kJsonTokens = {
    "{\"", "\":", "\": ", "\",", "\", \"", "\"}", "\"]", "\"},", "}}", "]}", "[{", "true", "null", "false",
    "12", "0.", ".5", "e+", "ab", " \"", ", ", "\\n", "\\\"", "\\u00", "caf\xc3\xa9", "\xc3", "\xa9x", "name",
    "age", "\"name", "name\"", "tags", "\":[", "\": [", "1,", "\"a\"", "x\"", "  ", "\n", "-1", "id"};

void check_walks(const std::shared_ptr<const CompiledGrammar>& g, int num_walks, int max_steps, uint32_t seed,
                 const std::regex* oracle) {
  const Vocabulary& v = g->vocab();
  std::mt19937 rng(seed);
  std::vector<uint32_t> mask(v.num_mask_words());
  for (int w = 0; w < num_walks; ++w) {
    GrammarMatcher m(g);
    std::string text;
    for (int step = 0; step < max_steps; ++step) {
      m.fill_mask(mask.data());
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < v.size(); ++id) {
        bool expected;
        if (id == v.eos_id()) {
          expected = m.can_terminate();
        } else if (v.is_special(id)) {
          expected = false;
        } else {
          GrammarMatcher probe(g);
          expected = probe.accept_bytes(text) && probe.accept_bytes(v.token_bytes(id));
        }
        ASSERT_EQ(bit(mask, id), expected) << "token " << id << " '" << v.token_bytes(id) << "' after '" << text << "'";
        if (expected) allowed.push_back(id);
      }
      ASSERT_FALSE(allowed.empty()) << "dead end after '" << text << "'";
      int32_t pick = allowed[rng() % allowed.size()];
      if (pick == v.eos_id() || step + 1 == max_steps) {
        if (m.can_terminate() && oracle) {
          EXPECT_TRUE(std::regex_match(text, *oracle)) << text;
        }
        break;
      }
      ASSERT_TRUE(m.accept_token(pick));
      text += v.token_bytes(pick);
    }
  }
}

TEST(GrammarMask, RegexMaskIsExact) {
  auto vocab = small_vocab({"ab", "abc", "ba", "a1", "12", "123", "-", "x-1", "cab"});
  const char* pattern = "(ab|c)+-?[0-9]{1,3}";
  auto g = CompiledGrammar::compile({GrammarSpec::Kind::Regex, pattern}, vocab);
  std::regex re(pattern);
  check_walks(g, 30, 12, 1, &re);
}

TEST(GrammarMask, EbnfMaskIsExact) {
  auto vocab = small_vocab({"((", "))", "()", ")(", "(()", "a(", ")a"});
  auto g = CompiledGrammar::compile({GrammarSpec::Kind::Ebnf, "root ::= \"(\" (root | \"a\")* \")\""}, vocab);
  check_walks(g, 30, 14, 2, nullptr);
}

TEST(GrammarMask, JsonSchemaMaskIsExact) {
  auto vocab = small_vocab(kJsonTokens);
  const char* schema = R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 4},
      "age": {"type": "integer", "minimum": 0, "maximum": 120},
      "tags": {"type": "array", "items": {"enum": ["a", "b\"c"]}, "maxItems": 2},
      "id": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "^x[0-9]+$"}]}
    },
    "required": ["name"],
    "additionalProperties": false
  })";
  auto g = CompiledGrammar::compile({GrammarSpec::Kind::JsonSchema, schema}, vocab);
  check_walks(g, 25, 25, 3, nullptr);
}

TEST(GrammarMask, AnyJsonMaskIsExact) {
  auto vocab = small_vocab(kJsonTokens);
  auto g = CompiledGrammar::compile({GrammarSpec::Kind::JsonObject, ""}, vocab);
  check_walks(g, 20, 20, 4, nullptr);
}

TEST(GrammarMask, RollbackRestoresState) {
  auto vocab = small_vocab({"ab"});
  auto g = CompiledGrammar::compile({GrammarSpec::Kind::Regex, "(ab)+c"}, vocab);
  GrammarMatcher m(g);
  std::vector<uint32_t> before(vocab->num_mask_words()), after(vocab->num_mask_words());
  ASSERT_TRUE(m.accept_token(vocab->size() - 2));  // "ab"
  m.fill_mask(before.data());
  ASSERT_TRUE(m.accept_token('a'));
  ASSERT_FALSE(m.accept_token('c'));  // rejected tokens leave the state unchanged
  ASSERT_TRUE(m.accept_token('b'));
  ASSERT_TRUE(m.accept_token('c'));
  EXPECT_TRUE(m.can_terminate());
  EXPECT_TRUE(m.is_complete());
  m.rollback(3);
  m.fill_mask(after.data());
  EXPECT_EQ(before, after);
  EXPECT_FALSE(m.can_terminate());
  EXPECT_FALSE(m.accept_token(vocab->eos_id()));
}

}  // namespace
}  // namespace deepinfer::grammar
