// Hostile grammars (issue #12): each is refused with an error naming the real cause, quickly
// and in bounded memory, or compiles without recursing on its depth. Every input is built
// here, at test time. Budgets are CompileLimits fields (grammar/ir.h).
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "tests/unit/grammar/test_util.h"

namespace deepinfer::grammar {
namespace {

using testing::matches;
using testing::small_vocab;

std::string compile_error(GrammarSpec::Kind kind, const std::string& source, const CompileLimits& limits = {}) {
  try {
    CompiledGrammar::compile({kind, source}, small_vocab({}), limits);
  } catch (const Error& e) {
    return e.what();
  }
  return "compiled";
}

std::string schema_error(const std::string& schema, const CompileLimits& limits = {}) {
  return compile_error(GrammarSpec::Kind::JsonSchema, schema, limits);
}

// {"type":"object","properties":{"a": ... {"type":"string"} ...}} nested `levels` deep.
std::string nested_properties(int levels) {
  std::string s;
  for (int i = 0; i < levels; ++i) s.append(R"({"type":"object","properties":{"a":)");
  s.append(R"({"type":"string"})");
  for (int i = 0; i < levels; ++i) s.append("}}");
  return s;
}

// "a0 ::= a1<tail>\n" ... up to a<n-1> (appends, not operator+: GCC 12 warns falsely on those).
std::string rule_chain(int n, const char* tail) {
  std::string g;
  for (int i = 0; i < n; ++i) {
    g.append("a").append(std::to_string(i)).append(" ::= a").append(std::to_string(i + 1)).append(tail).append("\n");
  }
  return g;
}

// `inner` inside `depth` arrays.
std::string nested_arrays(int depth, const std::string& inner) {
  std::string s(static_cast<size_t>(depth), '[');
  s.append(inner);
  s.append(static_cast<size_t>(depth), ']');
  return s;
}

TEST(GrammarBudgets, SchemaNested10000DeepIsRefusedByTheJsonReader) {
  // Took 43 s to refuse before; now the reader's depth limit refuses it in one linear scan.
  const std::string msg = schema_error(nested_properties(10000));
  EXPECT_EQ(msg.rfind("json schema: JSON nested deeper than the limit of 256", 0), 0u) << msg.substr(0, 300);
}

TEST(GrammarBudgets, SchemaNestedPastTheSchemaDepthLimitNamesIt) {
  // 100 levels (200 JSON levels: within the reader's limit) against max_schema_depth 64.
  const std::string msg = schema_error(nested_properties(100));
  EXPECT_NE(msg.find("schema nested too deeply (more than 64 levels"), std::string::npos) << msg.substr(0, 300);
  EXPECT_NE(msg.find("CompileLimits::max_schema_depth"), std::string::npos);
  CompileLimits deeper;
  deeper.max_schema_depth = 128;
  auto g = CompiledGrammar::compile({GrammarSpec::Kind::JsonSchema, nested_properties(100)}, small_vocab({}), deeper);
  std::string doc;
  for (int i = 0; i < 100; ++i) doc.append("{\"a\":");
  doc.append("\"x\"");
  doc.append(100, '}');
  EXPECT_TRUE(matches(g, doc));
}

TEST(GrammarBudgets, EnumNested30000DeepIsRefusedNotACrash) {
  // Was a SIGSEGV (recursion in the enum's literal and in dump()).
  const std::string v = nested_arrays(30000, "1");
  const std::string msg = schema_error(R"({"enum": [)" + v + "]}");
  EXPECT_EQ(msg.rfind("json schema: JSON nested deeper than the limit of 256", 0), 0u) << msg.substr(0, 300);
  const std::string c = schema_error(R"({"const": )" + v + "}");
  EXPECT_NE(c.find("nested deeper"), std::string::npos) << c.substr(0, 300);
  // Deep but within the reader's limit: compiles and matches.
  const std::string w = nested_arrays(250, "1");
  auto g = CompiledGrammar::compile({GrammarSpec::Kind::JsonSchema, R"({"const": )" + w + "}"}, small_vocab({}));
  EXPECT_TRUE(matches(g, w));
  EXPECT_FALSE(matches(g, w.substr(1)));
}

TEST(GrammarBudgets, TenMegabyteEnumNamesTheEnum) {
  // Peaked at 2.9 GB and blamed "maxLength/maxItems"; now refused while the enum is read.
  std::string schema = R"({"enum": [)";
  for (int i = 0; i < 1000000; ++i) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%s\"v%07d\"", i ? "," : "", i);
    schema += buf;
  }
  schema += "]}";
  ASSERT_GT(schema.size(), 10u << 20);
  const std::string msg = schema_error(schema);
  EXPECT_EQ(msg.rfind("json schema: enum/const values too large", 0), 0u) << msg.substr(0, 300);
  EXPECT_NE(msg.find("of 1000000 spell more than 400000 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at #/enum"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("maxLength"), std::string::npos) << msg;
}

TEST(GrammarBudgets, EbnfChainOf100000RulesIsRefusedQuickly) {
  // Took 87 s (a line count per new rule, fixpoints iterated over all rules); now linear.
  const std::string g = "root ::= a0\n" + rule_chain(100000, "") + "a100000 ::= \"x\"\n";
  const std::string msg = compile_error(GrammarSpec::Kind::Ebnf, g);
  EXPECT_EQ(msg.rfind("grammar too large: more than 60000 automaton states", 0), 0u) << msg;
}

TEST(GrammarBudgets, LongRuleChainsCompileWithoutRecursion) {
  // 10,000 rules, each calling the next before any byte: the left-recursion search was
  // recursive and the nullable/productive fixpoints quadratic.
  const std::string g = "root ::= a0\n" + rule_chain(10000, "") + "a10000 ::= \"x\" | \"\"\n";
  auto c = CompiledGrammar::compile({GrammarSpec::Kind::Ebnf, g}, small_vocab({}));
  EXPECT_TRUE(matches(c, "x"));
  EXPECT_TRUE(matches(c, ""));
  EXPECT_FALSE(matches(c, "xx"));
  // A left-recursive cycle through all of them is named, cut short.
  const std::string cyc = "root ::= a0 \"y\"\n" + rule_chain(10000, " | \"x\"") + "a10000 ::= root\n";
  const std::string msg = compile_error(GrammarSpec::Kind::Ebnf, cyc);
  EXPECT_NE(msg.find("left recursion is not supported"), std::string::npos) << msg.substr(0, 300);
  EXPECT_NE(msg.find("more)"), std::string::npos) << msg.substr(0, 300);
  EXPECT_LT(msg.size(), 600u);
  // A $ref chain of 5,000 schemas: compiled one after another, not nested.
  std::string defs;
  for (int i = 0; i < 5000; ++i) {
    defs.append(i ? ",\"a" : "\"a").append(std::to_string(i)).append("\":{\"$ref\":\"#/$defs/a");
    defs.append(std::to_string(i + 1)).append("\"}");
  }
  auto s = CompiledGrammar::compile(
      {GrammarSpec::Kind::JsonSchema, R"({"$ref": "#/$defs/a0", "$defs": {)" + defs + R"(, "a5000": {"type": "integer"}}})"},
      small_vocab({}));
  EXPECT_TRUE(matches(s, "42"));
  EXPECT_FALSE(matches(s, "\"x\""));
}

TEST(GrammarBudgets, KeywordOfTheWrongTypeIsTheSchemasError) {
  // Found by fuzz_json_schema: nlohmann's type_error escaped as an internal error.
  const std::string e = schema_error(R"({"type":"string","maxLength":"integer"})");
  EXPECT_NE(e.find("json schema: a keyword's value has the wrong type"), std::string::npos) << e;
}

TEST(GrammarBudgets, EbnfWithoutRootIsAnError) {
  const std::string msg = compile_error(GrammarSpec::Kind::Ebnf, "a ::= \"x\"\nb ::= a a\n");
  EXPECT_EQ(msg.rfind("ebnf: no rule named 'root'", 0), 0u) << msg;
  EXPECT_NE(msg.find("2 rules are defined"), std::string::npos) << msg;
}

TEST(GrammarBudgets, NestingPastTheLimitNamesTheLine) {
  // Each postfix operator wraps the expression once more: 10,000 of them.
  const std::string msg = compile_error(GrammarSpec::Kind::Ebnf, "root ::= \"a\"\nb ::= \"x\"" + std::string(10000, '?'));
  EXPECT_EQ(msg.rfind("ebnf: expressions nested more than 4096 deep (CompileLimits::max_nesting) at line 2", 0), 0u)
      << msg;
}

TEST(GrammarBudgets, MemoryTimeAndSizeBudgetsAreFieldsOfTheLimits) {
  std::string schema = R"({"enum": [)";
  for (int i = 0; i < 20000; ++i) schema += (i ? ",\"" : "\"") + std::to_string(i) + "\"";
  schema += "]}";
  ASSERT_EQ(schema_error(schema).find("json schema"), std::string::npos);  // compiles by default
  CompileLimits small_memory;
  small_memory.max_memory_bytes = 1 << 20;
  const std::string mem = schema_error(schema, small_memory);
  EXPECT_EQ(mem.rfind("json schema: grammar too large: building the grammar IR needs more than the memory budget of 1 MiB "
                      "(CompileLimits::max_memory_bytes)",
                      0),
            0u)
      << mem;
  EXPECT_NE(mem.find("compiling #"), std::string::npos) << mem;
  CompileLimits no_time;
  no_time.max_seconds = 0;
  const std::string t = schema_error(schema, no_time);
  EXPECT_NE(t.find("time budget of 0 s (CompileLimits::max_seconds)"), std::string::npos) << t;
  const std::string e = compile_error(GrammarSpec::Kind::Ebnf, "root ::= \"a\"", no_time);
  EXPECT_NE(e.find("time budget"), std::string::npos) << e;
  CompileLimits tiny_source;
  tiny_source.max_source_bytes = 100;
  const std::string src = schema_error(schema, tiny_source);
  EXPECT_NE(src.find("over the limit of 100 bytes (CompileLimits::max_source_bytes)"), std::string::npos) << src;
}

TEST(GrammarBudgets, SchemaJsonFollowsTheReadingPolicy) {
  EXPECT_NE(schema_error(R"({"type": "string", "type": "integer"})").find("'type' appears twice"), std::string::npos);
  EXPECT_NE(schema_error("{\"const\": \"\xff\"}").find("invalid UTF-8 at byte offset 11"), std::string::npos);
  // Paths quote user keys: bounded in messages.
  const std::string key(100000, 'k');
  const std::string msg = schema_error(R"({"properties": {")" + key + R"(": {"if": {}}}})");
  EXPECT_NE(msg.find("keyword 'if' is not supported"), std::string::npos) << msg.substr(0, 300);
  EXPECT_LT(msg.size(), 500u);
}

}  // namespace
}  // namespace deepinfer::grammar
