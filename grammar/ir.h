// GrammarIR: the one representation every front-end (regex, JSON Schema, EBNF) lowers to.
// A grammar is a set of named rules; each rule body is an expression tree over
// byte classes, code-point classes (lowered to UTF-8 byte sequences later), sequences,
// alternations, bounded/unbounded repetition and references to other rules.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace deepinfer::grammar {

enum class ExprKind : uint8_t {
  Empty,    // matches the empty string
  Nothing,  // matches no string (e.g. an empty character class)
  Bytes,    // one byte in `ranges` (values 0..255)
  Chars,    // one code point in `ranges` (values 0..0x10FFFF), UTF-8 encoded
  Seq,      // children in order
  Alt,      // any one child
  Repeat,   // child repeated min..max times (max == kUnbounded: no upper bound)
  Ref,      // rule `rule`
};

struct Expr {
  ExprKind kind = ExprKind::Empty;
  std::vector<int32_t> children;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // inclusive [lo, hi], sorted, disjoint
  int32_t rule = -1;
  int32_t min = 0;
  int32_t max = 0;
};

struct Rule {
  std::string name;
  int32_t body = -1;  // expression index; -1 until defined
};

// Limits that bound compile work and memory; a grammar past them is refused with a reason
// (deepinfer::Error whose message starts with the front-end or "grammar" and names the limit).
struct CompileLimits {
  int64_t max_nfa_nodes = 400000;
  int64_t max_dfa_states = 60000;
  int32_t max_repeat = 4096;  // largest finite repetition bound expanded
  // Budgets of one compilation, checked as it goes (front-end -> IR, IR -> automaton), so an
  // oversized or pathological grammar is refused early, naming the stage and the cause:
  int64_t max_source_bytes = int64_t{16} << 20;   // the regex / JSON Schema / EBNF text (16 MiB)
  int64_t max_memory_bytes = int64_t{256} << 20;  // estimated IR + NFA + subset-construction memory
  double max_seconds = 10.0;                      // wall clock of one compilation
  int32_t max_nesting = 4096;      // IR expressions nested in one another (later passes recurse)
  int32_t max_schema_depth = 64;   // JSON Schema levels nested without a $ref
};

// Thrown when a CompileLimits budget runs out; front-ends catch it once to add where (EBNF
// line and column, JSON Schema path) and rethrow it.
class GrammarBudgetError : public Error {
 public:
  explicit GrammarBudgetError(const std::string& message, bool located = false)
      : Error(message), located_(located) {}
  bool located() const { return located_; }
  // The message for a front-end's prefix ("ebnf: ..."): without a leading "grammar: ".
  std::string cause() const {
    const std::string m = what();
    return m.rfind("grammar: ", 0) == 0 ? m.substr(9) : m;
  }

 private:
  bool located_;
};

// The running budget of one compilation: memory estimates charged as structures grow (never
// credited back, so an upper bound of what was built) and the wall clock checked every
// kTicksPerClock ticks. Throws GrammarBudgetError naming the stage.
class CompileBudget {
 public:
  explicit CompileBudget(const CompileLimits& limits = {});
  const CompileLimits& limits() const { return limits_; }
  void charge(int64_t bytes, const char* stage) {
    bytes_ += bytes;
    if (bytes_ > limits_.max_memory_bytes) over_memory(stage);
    tick(stage);
  }
  void tick(const char* stage) {
    if (++ticks_ % kTicksPerClock == 0) check_time(stage);
  }
  void check_time(const char* stage) const;
  int64_t bytes() const { return bytes_; }

 private:
  static constexpr uint32_t kTicksPerClock = 256;
  [[noreturn]] void over_memory(const char* stage) const;
  CompileLimits limits_;
  std::chrono::steady_clock::time_point deadline_;
  int64_t bytes_ = 0;
  uint32_t ticks_ = 0;
};

class GrammarIR {
 public:
  static constexpr int32_t kUnbounded = -1;

  int32_t empty() { return add({ExprKind::Empty, {}, {}, -1, 0, 0}); }
  int32_t nothing() { return add({ExprKind::Nothing, {}, {}, -1, 0, 0}); }
  int32_t byte_ranges(std::vector<std::pair<uint32_t, uint32_t>> ranges);
  int32_t byte(uint8_t b) { return byte_ranges({{b, b}}); }
  // Code points; ranges need not be sorted or disjoint (normalized here).
  int32_t char_ranges(std::vector<std::pair<uint32_t, uint32_t>> ranges);
  int32_t literal(const std::string& bytes);  // exact byte string
  int32_t seq(std::vector<int32_t> children);
  int32_t alt(std::vector<int32_t> children);
  int32_t repeat(int32_t child, int32_t min, int32_t max);
  int32_t star(int32_t child) { return repeat(child, 0, kUnbounded); }
  int32_t plus(int32_t child) { return repeat(child, 1, kUnbounded); }
  int32_t opt(int32_t child) { return repeat(child, 0, 1); }
  int32_t ref(int32_t rule);

  // Charges every expression added from now on to `budget` (may be null: no budget) and
  // refuses nesting deeper than its max_nesting.
  void set_budget(CompileBudget* budget) { budget_ = budget; }
  CompileBudget* budget() const { return budget_; }
  // Estimated bytes held by the expressions and rules (what CompileBudget charges).
  int64_t estimated_bytes() const { return bytes_; }

  // Declares a rule (body set later); returns its index. Names need not be unique.
  int32_t add_rule(std::string name);
  void set_body(int32_t rule, int32_t expr) { rules_[rule].body = expr; }
  // Replaces child k of expression `expr` (used by rewriting passes such as lift.h).
  void set_child(int32_t expr, size_t k, int32_t child) { exprs_[expr].children[k] = child; }
  void set_root(int32_t rule) { root_ = rule; }
  // Copies every rule and expression of `other` into this grammar (charged to this one's
  // budget); returns the index here of other's root rule. Other's root stays a rule of its own.
  int32_t import_rules(const GrammarIR& other);

  const std::vector<Expr>& exprs() const { return exprs_; }
  const Expr& expr(int32_t i) const { return exprs_[i]; }
  const std::vector<Rule>& rules() const { return rules_; }
  int32_t root() const { return root_; }

 private:
  int32_t add(Expr e);
  std::vector<Expr> exprs_;
  std::vector<int32_t> nesting_;  // per expression: 1 + the deepest child's (children come first)
  std::vector<Rule> rules_;
  int32_t root_ = -1;
  CompileBudget* budget_ = nullptr;
  int64_t bytes_ = 0;
};

// Normalizes inclusive ranges: sorted, merged.
std::vector<std::pair<uint32_t, uint32_t>> normalize_ranges(std::vector<std::pair<uint32_t, uint32_t>> r);
// Complement within [0, max_value].
std::vector<std::pair<uint32_t, uint32_t>> complement_ranges(const std::vector<std::pair<uint32_t, uint32_t>>& r,
                                                             uint32_t max_value);
// Appends the UTF-8 encoding of a code point (the tokenizer's encoder, tokenizer/utf8.h).
void append_utf8(std::string& out, uint32_t cp);

}  // namespace deepinfer::grammar
