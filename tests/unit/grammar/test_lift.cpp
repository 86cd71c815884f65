// lift_call_free_loops (grammar/lift.h) keeps the language: the automaton built from the lifted
// IR accepts exactly what the one built from the original IR accepts, on strings sampled from
// the grammar and on random byte strings over its alphabet; and the wide loops did move into
// rules of their own. (The masks of lifted grammars are checked against brute force in
// test_mask.cpp.)
#include <gtest/gtest.h>

#include <random>

#include "grammar/grammar.h"
#include "grammar/lift.h"
#include "grammar/stack.h"

namespace deepinfer::grammar {
namespace {

// Full match of text by the pushdown automaton, stepping bytes (no mask cache involved).
bool accepts(const Automaton& a, const std::string& text) {
  StackArena arena;
  StepScratch scratch;
  StepFlags flags;
  std::vector<int32_t> cur, next;
  close_element(a, arena, arena.make(a.root_start(), kRoot), cur, flags, scratch);
  for (char ch : text) {
    flags = StepFlags{};
    step_byte(a, arena, cur, static_cast<uint8_t>(ch), next, flags, scratch);
    cur.swap(next);
    if (cur.empty() && !flags.root_pop) return false;
  }
  return flags.root_pop || (text.empty() && a.states[a.root_start()].final);
}

// Random strings: prefixes of `samples` with random edits, and random strings over `alphabet`.
std::vector<std::string> probes(const std::vector<std::string>& samples, const std::string& alphabet, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> out = samples;
  for (const auto& s : samples) {
    for (int k = 0; k < 40; ++k) {
      std::string t = s;
      const int num_edits = 1 + static_cast<int>(rng() % 3);
      for (int e = 0; e < num_edits && !t.empty(); ++e) {
        const size_t at = rng() % t.size();
        switch (rng() % 3) {
          case 0: t[at] = alphabet[rng() % alphabet.size()]; break;
          case 1: t.erase(at, 1); break;
          default: t.insert(at, 1, alphabet[rng() % alphabet.size()]);
        }
      }
      out.push_back(t);
    }
  }
  for (int k = 0; k < 400; ++k) {
    std::string t;
    const size_t len = rng() % 12;
    while (t.size() < len) t.push_back(alphabet[rng() % alphabet.size()]);
    out.push_back(t);
  }
  return out;
}

int count_loop_rules(const Automaton& a) {
  int n = 0;
  for (size_t r = 0; r < a.rule_names.size(); ++r)
    if (a.rule_start[r] >= 0 && a.rule_names[r].ends_with("/loop")) ++n;
  return n;
}

void expect_same_language(const GrammarIR& ir, const std::vector<std::string>& samples, const std::string& alphabet,
                          uint32_t seed) {
  const CompileLimits limits;
  const Automaton plain = build_automaton(ir, limits);
  const Automaton lifted = build_automaton(lift_call_free_loops(ir), limits);
  EXPECT_GT(count_loop_rules(lifted), 0);
  EXPECT_EQ(count_loop_rules(plain), 0);
  int num_accepted = 0;
  for (const auto& s : samples) EXPECT_TRUE(accepts(plain, s)) << s;
  for (const auto& t : probes(samples, alphabet, seed)) {
    const bool p = accepts(plain, t);
    num_accepted += p;
    EXPECT_EQ(accepts(lifted, t), p) << "'" << t << "'";
  }
  EXPECT_GT(num_accepted, static_cast<int>(samples.size()) / 2);
}

TEST(GrammarLift, JsonSchemaStringsKeepTheirLanguage) {
  // Inline strings (pattern, format, length bounds) in an object: lifted out of the object's
  // rules; the plain "string" rule has no calls and is left alone.
  const char* schema = R"({
    "type": "object",
    "properties": {
      "code": {"type": "string", "pattern": "^[a-c]+-[0-9]{2}$"},
      "name": {"type": "string", "minLength": 1, "maxLength": 3},
      "tag": {"type": "string", "pattern": "b+"},
      "any": {"type": "string"}
    },
    "required": ["code", "name"],
    "additionalProperties": false
  })";
  const std::vector<std::string> samples = {
      R"({"code":"ab-12","name":"x"})",          R"({"code":"c-00","name":"xyz","tag":"abbc"})",
      R"({"code":"a-99","name":"\"","any":""})", R"({ "code" : "aaa-10" , "name" : "é" , "tag" : "b" })"};
  expect_same_language(json_schema_to_ir(schema, true), samples, "{}\":, abc-0129xyz\\\xc3\xa9", 1);
}

TEST(GrammarLift, EbnfInlineLoopsKeepTheirLanguage) {
  // [a-z]+ and [0-9a-f]{2,4} sit inside rules that call others; [ab] is too narrow to lift.
  const char* ebnf =
      "root ::= item (\",\" item)*\n"
      "item ::= [a-z]+ \"=\" val | \"#\" [0-9a-f]{2,4} val\n"
      "val ::= \"(\" [ab]* \")\" | [a-z]+";
  const std::vector<std::string> samples = {"ab=(ab)", "x=y,#0f(a)", "#abcdq", "k=(),z=zz"};
  expect_same_language(parse_ebnf(ebnf), samples, "abz0f#=(),q", 2);
}

}  // namespace
}  // namespace deepinfer::grammar
