// The mask against brute force: on small vocabularies, along random walks, bit t is set
// exactly when accept_bytes(token t) would succeed from the same state (byte-level stepping,
// independent of the mask cache), and EOS exactly when the grammar can terminate. Strings
// sampled under the mask are checked by std::regex. Rollback restores earlier masks. Large random
// vocabularies exercise what small ones never reach: subtree reuse (needs >= 64 tokens below a
// first byte) and entries shared by grammars of one vocabulary.
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

// Every single byte plus num_tokens random strings (length 2..7) over JSON-ish bytes, so many
// tokens share each first byte, plus num_long longer than kShortTokenBytes (17..40 bytes).
std::shared_ptr<const Vocabulary> random_vocab(int num_tokens, uint32_t seed, int num_long = 0) {
  const std::string alphabet = "\"{}[]:, abcnm01\\-.e\xc3\xa9";
  std::mt19937 rng(seed);
  std::vector<std::string> extra;
  for (int k = 0; k < num_tokens + num_long; ++k) {
    std::string t;
    const size_t len = k < num_tokens ? 2 + rng() % 6 : kShortTokenBytes + 1 + rng() % 24;
    while (t.size() < len) t.push_back(alphabet[rng() % alphabet.size()]);
    extra.push_back(t);
  }
  return small_vocab(extra);
}

const char* kKeyedSchema = R"({
  "type": "object",
  "properties": {"name": {"type": "string"}, "nab": {"type": "integer"}, "m": {"type": "string", "maxLength": 3}},
  "required": ["name"],
  "additionalProperties": {"type": "array", "items": {"type": "number"}}
})";

TEST(GrammarMask, LargeVocabMaskIsExact) {
  // Extra keys (a trie over the declared names that leaves into plain string content) make many
  // states reach the same situation after their first byte: the subtree reuse path.
  auto vocab = random_vocab(2000, 5);
  auto g = CompiledGrammar::compile({GrammarSpec::Kind::JsonSchema, kKeyedSchema}, vocab);
  check_walks(g, 4, 20, 6, nullptr);
}

TEST(GrammarMask, SharedEntriesAcrossGrammarsAreExact) {
  // The second grammar meets the first one's string and number states: its level-1 entries for
  // them come from the vocabulary's shared cache and must still be exact in its own context.
  auto vocab = random_vocab(2000, 7);
  auto g1 = CompiledGrammar::compile({GrammarSpec::Kind::JsonSchema, kKeyedSchema}, vocab);
  check_walks(g1, 2, 20, 8, nullptr);
  const size_t num_shared = vocab->shared_masks().num_entries();
  EXPECT_GT(num_shared, 0u);
  auto g2 = CompiledGrammar::compile({GrammarSpec::Kind::JsonObject, ""}, vocab);
  check_walks(g2, 3, 20, 9, nullptr);
  EXPECT_GT(g2->mask_cache().num_shared_hits(), 0u);
  // A rooted regex whose whole stack is one call-free DFA: shared under the rooted key.
  auto r1 = CompiledGrammar::compile({GrammarSpec::Kind::Regex, "[a-c]+(-[0-9]+)?"}, vocab);
  auto r2 = CompiledGrammar::compile({GrammarSpec::Kind::Regex, "[a-c]+(-[0-9]+)?"}, vocab);
  std::regex re("[a-c]+(-[0-9]+)?");
  check_walks(r1, 2, 8, 10, &re);
  check_walks(r2, 2, 8, 11, &re);
  EXPECT_GT(r2->mask_cache().num_shared_hits(), 0u);
}

TEST(GrammarMask, BoundedStringsShareEntriesAndStayExact) {
  // Count positions of strings with maxLength far from both bounds share one entry keyed to
  // kShortTokenBytes, within a grammar and across grammars; tokens longer than that (which may
  // cross a bound) are walked from each real state. Long tokens here include quotes, so a long
  // token can close the string early, late or not at all.
  auto vocab = random_vocab(1500, 12, 300);
  auto g1 = CompiledGrammar::compile(
      {GrammarSpec::Kind::JsonSchema,
       R"({"type": "object", "properties": {"s": {"type": "string", "minLength": 3, "maxLength": 45},
           "t": {"type": "string", "maxLength": 60}}, "required": ["s", "t"], "additionalProperties": false})"},
      vocab);
  check_walks(g1, 3, 24, 13, nullptr);
  auto g2 = CompiledGrammar::compile({GrammarSpec::Kind::JsonSchema, R"({"type": "string", "maxLength": 50})"}, vocab);
  check_walks(g2, 3, 16, 14, nullptr);
  EXPECT_GT(g2->mask_cache().num_shared_hits(), 0u);
}

TEST(GrammarMask, LiftedLoopsAreExactAndShared) {
  // Strings with a pattern or length bounds inside objects are lifted into rules of their own
  // (grammar/lift.h): their states' entries and first-byte subtrees are then keyed by the small
  // loop automaton, shared by the two grammars, while the tokens that close the string and go
  // on into the object ("\",", "\"}") are decided from the real stack. A second grammar with
  // the same string shapes in other objects must hit the shared entries and stay exact.
  auto vocab = random_vocab(1500, 17, 100);
  const char* s1 = R"({"type": "object", "properties": {
      "a": {"type": "string", "pattern": "^[a-n0-9]+$"}, "b": {"type": "string", "maxLength": 30},
      "c": {"type": "string", "pattern": "b"}}, "required": ["a", "b"], "additionalProperties": false})";
  const char* s2 = R"({"type": "object", "properties": {
      "n": {"type": "array", "items": {"type": "string", "pattern": "^[a-n0-9]+$"}},
      "m": {"type": "string", "pattern": "b"}}, "additionalProperties": {"type": "string", "maxLength": 30}})";
  auto g1 = CompiledGrammar::compile({GrammarSpec::Kind::JsonSchema, s1}, vocab);
  check_walks(g1, 2, 20, 18, nullptr);
  auto g2 = CompiledGrammar::compile({GrammarSpec::Kind::JsonSchema, s2}, vocab);
  check_walks(g2, 2, 20, 19, nullptr);
  EXPECT_GT(g2->mask_cache().num_shared_hits(), 0u);
}

// The mask after `prefix` against brute force (as check_walks, at one chosen state).
void check_after(const std::shared_ptr<const CompiledGrammar>& g, const std::string& prefix) {
  const Vocabulary& v = g->vocab();
  GrammarMatcher m(g);
  ASSERT_TRUE(m.accept_bytes(prefix)) << prefix;
  std::vector<uint32_t> mask(v.num_mask_words());
  m.fill_mask(mask.data());
  for (int32_t id = 0; id < v.size(); ++id) {
    if (id == v.eos_id() || v.is_special(id)) continue;
    GrammarMatcher probe(g);
    const bool expected = probe.accept_bytes(prefix) && probe.accept_bytes(v.token_bytes(id));
    ASSERT_EQ(bit(mask, id), expected) << "token '" << v.token_bytes(id) << "' after '" << prefix << "'";
  }
}

// 40 first bytes with 70 tokens below each (a FormUnion needs >= 32 first bytes whose subtrees
// are cached, i.e. hold >= 64 tokens).
std::vector<std::string> union_tokens(const std::string& alphabet, uint32_t seed) {
  const std::string firsts = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN";
  std::mt19937 rng(seed);
  std::vector<std::string> tokens;
  for (char c : firsts)
    for (int k = 0; k < 70; ++k) {
      std::string t(1, c);
      const size_t len = 2 + rng() % 6;
      while (t.size() < len) t.push_back(alphabet[rng() % alphabet.size()]);
      tokens.push_back(t);
    }
  return tokens;
}

TEST(GrammarMask, FirstByteUnionsSubtractUncoveredBytes) {
  // After "<" all 40 first bytes lead to one form (the call of `rest`): that walk builds the
  // form's union of subtrees. After "<#" only a-f lead to it: the union's other 34 bytes must
  // be taken out again (their tokens are dead there).
  auto tokens = union_tokens("abcdefghijklmnopqrstuvwxyz>", 31);
  for (const char* t : {"<", "#", "<#", "#a"}) tokens.push_back(t);
  auto vocab = small_vocab(tokens);
  auto g = CompiledGrammar::compile(
      {GrammarSpec::Kind::Ebnf, "root ::= \"<\" k \"!\"\nk ::= [a-zA-N] rest | \"#\" [a-f] rest\nrest ::= [a-z]* \">\""},
      vocab);
  check_after(g, "<");
  ASSERT_GT(vocab->shared_masks().subtrees().num_unions(), 0u);
  check_after(g, "<#");
  check_after(g, "<#a");
}

TEST(GrammarMask, FirstByteUnionsAreExactInKeyTries) {
  // States of an extra-key trie lead to the same "rest of the key" form after most first
  // bytes: the union built by the first grammar serves the second, whose trie excludes other
  // bytes.
  auto tokens = union_tokens("\"{}[]:, abcnm01\\-.eoqz", 23);
  for (const char* t : {"{\"", "\":", "\",\"", "\"}", "1,", "12"}) tokens.push_back(t);
  auto vocab = small_vocab(tokens);
  auto g1 = CompiledGrammar::compile(
      {GrammarSpec::Kind::JsonSchema, R"({"type": "object", "properties": {"name": {"type": "integer"},
          "nab": {"type": "integer"}, "bo": {"type": "integer"}}, "additionalProperties": {"type": "integer"}})"},
      vocab);
  check_walks(g1, 3, 12, 24, nullptr);
  EXPECT_GT(vocab->shared_masks().subtrees().num_unions(), 0u);
  auto g2 = CompiledGrammar::compile(
      {GrammarSpec::Kind::JsonSchema, R"({"type": "object", "properties": {"cab": {"type": "integer"},
          "a": {"type": "integer"}, "zz": {"type": "integer"}}, "additionalProperties": {"type": "integer"}})"},
      vocab);
  check_after(g2, "{\"");
  check_after(g2, "{\"c");
  check_after(g2, "{\"ca");
  check_walks(g2, 3, 12, 25, nullptr);
}

TEST(GrammarMask, UnionThatDoesNotFitIsDecidedOnce) {
  // A full cache keeps the form without a union, so walks do not rebuild it every time.
  SubtreeCache cache(64);
  auto big = std::make_shared<FormUnion>();
  big->dense.assign(100, 1u);  // 400 bytes > 64
  EXPECT_FALSE(cache.union_decided(3));
  cache.insert_union(3, big);
  EXPECT_TRUE(cache.union_decided(3));
  EXPECT_EQ(cache.find_union(3), nullptr);
  EXPECT_EQ(cache.num_unions(), 0u);
  auto small = std::make_shared<FormUnion>();
  small->dense.assign(4, 1u);
  cache.insert_union(4, small);
  EXPECT_NE(cache.find_union(4), nullptr);
  EXPECT_EQ(cache.num_unions(), 1u);
}

TEST(GrammarMask, SubtreesWithCallsKeepTheirReturnPoints) {
  // After "n" and after "m" the byte 'a' leads to two states that, after 'b', call w alike but
  // return to different continuations ("{" vs "}"): their first-byte subtrees (>= 64 tokens
  // below 'a') must not be shared. r, not root, so the walks are over the sentinel where
  // subtrees are cached.
  std::vector<std::string> tokens;
  for (std::string mid : {"", "a", "c", "ca", "bb", "abc"})
    for (std::string end : {"", "{", "}", "{a", "}c", "{{", "0"}) tokens.push_back("ab" + mid + end);
  // append, not "a" + std::to_string(k): g++ 12 -O2 raises a false -Wrestrict on that.
  for (int k = 0; k < 40; ++k) tokens.push_back(std::string("a").append(std::to_string(k)));
  auto vocab = small_vocab(tokens);
  auto g = CompiledGrammar::compile(
      {GrammarSpec::Kind::Ebnf, "root ::= r\nr ::= \"n\" \"ab\" w \"{\" [a-z]* | \"m\" \"ab\" w \"}\" [a-z]*\nw ::= [abc]*"},
      vocab);
  check_walks(g, 12, 5, 16, nullptr);
}

TEST(GrammarMask, CanonicalKeyIgnoresStateNumbering) {
  // The same DFA at different state numbers (after a different prefix) gets the same key; a
  // different DFA a different one; a state that reaches a call none.
  auto vocab = small_vocab({});
  auto a = CompiledGrammar::from_ir(parse_regex_grammar("x[0-9]+"), vocab);
  auto b = CompiledGrammar::from_ir(parse_regex_grammar("yyy[0-9]+"), vocab);
  auto c = CompiledGrammar::from_ir(parse_regex_grammar("x[0-8]+"), vocab);
  auto after = [](const Automaton& au, const std::string& text) {
    int32_t s = au.root_start();
    for (char ch : text) s = au.next(s, static_cast<uint8_t>(ch));
    return s;
  };
  std::string ka, kb, kc;
  ASSERT_TRUE(canonical_dfa_key(a->automaton(), after(a->automaton(), "x"), false, 64, 64, ka));
  ASSERT_TRUE(canonical_dfa_key(b->automaton(), after(b->automaton(), "yyy"), false, 64, 64, kb));
  ASSERT_TRUE(canonical_dfa_key(c->automaton(), after(c->automaton(), "x"), false, 64, 64, kc));
  EXPECT_EQ(ka, kb);
  EXPECT_NE(ka, kc);
  std::string kr;
  ASSERT_TRUE(canonical_dfa_key(a->automaton(), after(a->automaton(), "x"), true, 64, 64, kr));
  EXPECT_NE(ka, kr);
  auto e = CompiledGrammar::compile({GrammarSpec::Kind::Ebnf, "root ::= \"(\" (root | \"a\")* \")\""}, vocab);
  std::string ke;
  EXPECT_FALSE(canonical_dfa_key(e->automaton(), after(e->automaton(), "("), false, 64, 64, ke));
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
