// lift_call_free_loops (lift.h).
#include "grammar/lift.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

namespace deepinfer::grammar {
namespace {

class Lifter {
 public:
  Lifter(const GrammarIR& ir, CompileBudget* budget)
      : ir_(ir), out_(ir), call_free_(ir.exprs().size(), -1), wide_(ir.exprs().size(), -1),
        values_(ir.exprs().size(), -1), visited_(ir.exprs().size(), 0) {
    out_.set_budget(budget);
  }

  GrammarIR run() {
    const size_t num_rules = ir_.rules().size();
    for (size_t r = 0; r < num_rules; ++r) {
      const int32_t body = ir_.rules()[r].body;
      if (body < 0 || call_free(body)) continue;
      rule_name_ = ir_.rules()[r].name;
      visit(body);
    }
    return std::move(out_);
  }

 private:
  // Expressions form a DAG (front-ends share subexpressions); properties are memoized.
  bool call_free(int32_t e) {
    if (call_free_[e] >= 0) return call_free_[e];
    const Expr& x = ir_.expr(e);
    bool r = x.kind != ExprKind::Ref;
    for (int32_t c : x.children) r = r && call_free(c);
    call_free_[e] = r;
    return r;
  }

  // Number of byte or code-point values in the classes below e (memoized, saturating: shared
  // subexpressions would otherwise be counted once per path).
  int64_t num_values(int32_t e) {
    if (values_[e] >= 0) return values_[e];
    const Expr& x = ir_.expr(e);
    int64_t n = 0;
    for (auto [lo, hi] : x.ranges) n += static_cast<int64_t>(hi) - lo + 1;
    for (int32_t c : x.children) n = std::min(n + num_values(c), kSaturated);
    values_[e] = n;
    return n;
  }

  bool has_wide_loop(int32_t e) {
    if (wide_[e] >= 0) return wide_[e];
    const Expr& x = ir_.expr(e);
    bool r = x.kind == ExprKind::Repeat && (x.max == GrammarIR::kUnbounded || x.max >= 2) &&
             num_values(x.children[0]) >= kMinLiftedLoopValues;
    for (int32_t c : x.children) r = r || has_wide_loop(c);
    wide_[e] = r;
    return r;
  }

  // e has references: lift its maximal call-free children that hold a wide loop.
  void visit(int32_t e) {
    if (visited_[e]) return;
    visited_[e] = 1;
    const std::vector<int32_t> children = ir_.expr(e).children;
    for (size_t k = 0; k < children.size(); ++k) {
      const int32_t c = children[k];
      if (!call_free(c)) {
        visit(c);
      } else if (has_wide_loop(c)) {
        auto [it, inserted] = lifted_.try_emplace(c, -1);
        if (inserted) {
          const int32_t rule = out_.add_rule(rule_name_ + "/loop");
          out_.set_body(rule, c);
          it->second = out_.ref(rule);
        }
        out_.set_child(e, k, it->second);
      }
    }
  }

  const GrammarIR& ir_;
  GrammarIR out_;
  static constexpr int64_t kSaturated = int64_t{1} << 40;
  std::vector<int8_t> call_free_, wide_;
  std::vector<int64_t> values_;
  std::vector<char> visited_;
  std::unordered_map<int32_t, int32_t> lifted_;  // call-free expression -> its Ref in out_
  std::string rule_name_;
};

}  // namespace

GrammarIR lift_call_free_loops(const GrammarIR& ir, CompileBudget* budget) {
  // The copy and the per-expression tables below, charged to the compilation's budget.
  if (budget)
    budget->charge(ir.estimated_bytes() + static_cast<int64_t>(ir.exprs().size() * 12), "lifting loops out of rules");
  return Lifter(ir, budget).run();
}

}  // namespace deepinfer::grammar
