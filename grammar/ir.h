// GrammarIR: the one representation every front-end (regex, JSON Schema, EBNF) lowers to.
// A grammar is a set of named rules; each rule body is an expression tree over
// byte classes, code-point classes (lowered to UTF-8 byte sequences later), sequences,
// alternations, bounded/unbounded repetition and references to other rules.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

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

// Limits that bound compile work and memory; a grammar past them is refused with a reason.
struct CompileLimits {
  int64_t max_nfa_nodes = 400000;
  int64_t max_dfa_states = 60000;
  int32_t max_repeat = 4096;  // largest finite repetition bound expanded
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

  // Declares a rule (body set later); returns its index. Names need not be unique.
  int32_t add_rule(std::string name);
  void set_body(int32_t rule, int32_t expr) { rules_[rule].body = expr; }
  // Replaces child k of expression `expr` (used by rewriting passes such as lift.h).
  void set_child(int32_t expr, size_t k, int32_t child) { exprs_[expr].children[k] = child; }
  void set_root(int32_t rule) { root_ = rule; }

  const std::vector<Expr>& exprs() const { return exprs_; }
  const Expr& expr(int32_t i) const { return exprs_[i]; }
  const std::vector<Rule>& rules() const { return rules_; }
  int32_t root() const { return root_; }

 private:
  int32_t add(Expr e) {
    exprs_.push_back(std::move(e));
    return static_cast<int32_t>(exprs_.size() - 1);
  }
  std::vector<Expr> exprs_;
  std::vector<Rule> rules_;
  int32_t root_ = -1;
};

// Normalizes inclusive ranges: sorted, merged.
std::vector<std::pair<uint32_t, uint32_t>> normalize_ranges(std::vector<std::pair<uint32_t, uint32_t>> r);
// Complement within [0, max_value].
std::vector<std::pair<uint32_t, uint32_t>> complement_ranges(const std::vector<std::pair<uint32_t, uint32_t>>& r,
                                                             uint32_t max_value);
// Appends the UTF-8 encoding of a code point (the tokenizer's encoder, tokenizer/utf8.h).
void append_utf8(std::string& out, uint32_t cp);

}  // namespace deepinfer::grammar
