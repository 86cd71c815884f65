// GrammarIR constructors and range helpers.
#include "grammar/ir.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace deepinfer::grammar {

std::vector<std::pair<uint32_t, uint32_t>> normalize_ranges(std::vector<std::pair<uint32_t, uint32_t>> r) {
  std::sort(r.begin(), r.end());
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (auto [lo, hi] : r) {
    if (lo > hi) continue;
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.push_back({lo, hi});
    }
  }
  return out;
}

std::vector<std::pair<uint32_t, uint32_t>> complement_ranges(const std::vector<std::pair<uint32_t, uint32_t>>& r,
                                                             uint32_t max_value) {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  uint32_t next = 0;
  bool done = false;
  for (auto [lo, hi] : normalize_ranges(r)) {
    if (lo > next) out.push_back({next, lo - 1});
    if (hi >= max_value) {
      done = true;
      break;
    }
    next = hi + 1;
  }
  if (!done) out.push_back({next, max_value});
  return out;
}

void append_utf8(std::string& out, uint32_t cp) { tokenizer_detail::append_code_point(cp, out); }

int32_t GrammarIR::byte_ranges(std::vector<std::pair<uint32_t, uint32_t>> ranges) {
  ranges = normalize_ranges(std::move(ranges));
  if (ranges.empty()) return nothing();
  return add({ExprKind::Bytes, {}, std::move(ranges), -1, 0, 0});
}

int32_t GrammarIR::char_ranges(std::vector<std::pair<uint32_t, uint32_t>> ranges) {
  for (auto& r : ranges) r.second = std::min<uint32_t>(r.second, 0x10FFFF);
  ranges = normalize_ranges(std::move(ranges));
  if (ranges.empty()) return nothing();
  if (ranges.back().second < 0x80) return add({ExprKind::Bytes, {}, std::move(ranges), -1, 0, 0});
  return add({ExprKind::Chars, {}, std::move(ranges), -1, 0, 0});
}

int32_t GrammarIR::literal(const std::string& bytes) {
  if (bytes.empty()) return empty();
  std::vector<int32_t> parts;
  parts.reserve(bytes.size());
  for (unsigned char c : bytes) parts.push_back(byte(c));
  return parts.size() == 1 ? parts[0] : seq(std::move(parts));
}

int32_t GrammarIR::seq(std::vector<int32_t> children) {
  if (children.empty()) return empty();
  if (children.size() == 1) return children[0];
  return add({ExprKind::Seq, std::move(children), {}, -1, 0, 0});
}

int32_t GrammarIR::alt(std::vector<int32_t> children) {
  if (children.empty()) return nothing();
  if (children.size() == 1) return children[0];
  return add({ExprKind::Alt, std::move(children), {}, -1, 0, 0});
}

int32_t GrammarIR::repeat(int32_t child, int32_t min, int32_t max) {
  DI_CHECK(min >= 0 && (max == kUnbounded || max >= min), "grammar: bad repetition bounds {", min, ",", max, "}");
  if (max == 0) return empty();
  if (min == 1 && max == 1) return child;
  return add({ExprKind::Repeat, {child}, {}, -1, min, max});
}

int32_t GrammarIR::ref(int32_t rule) { return add({ExprKind::Ref, {}, {}, rule, 0, 0}); }

int32_t GrammarIR::add(Expr e) {
  int32_t nesting = 1;
  for (int32_t c : e.children) nesting = std::max(nesting, nesting_[c] + 1);
  const int32_t max_nesting = budget_ ? budget_->limits().max_nesting : CompileLimits{}.max_nesting;
  if (nesting > max_nesting)
    throw GrammarBudgetError(detail::concat("grammar: expressions nested more than ", max_nesting,
                                            " deep (CompileLimits::max_nesting)"));
  // A heap block per non-empty vector, ~16 bytes of allocator overhead each.
  const int64_t bytes = static_cast<int64_t>(sizeof(Expr) + sizeof(int32_t)) +
                        static_cast<int64_t>(e.children.capacity() * sizeof(int32_t)) +
                        static_cast<int64_t>(e.ranges.capacity() * sizeof(e.ranges[0])) +
                        16 * (!e.children.empty() + !e.ranges.empty());
  bytes_ += bytes;
  if (budget_) budget_->charge(bytes, "building the grammar IR");
  exprs_.push_back(std::move(e));
  nesting_.push_back(nesting);
  return static_cast<int32_t>(exprs_.size() - 1);
}

int32_t GrammarIR::import_rules(const GrammarIR& other) {
  DI_CHECK(other.root() >= 0, "grammar: importing a grammar without a root rule");
  std::vector<int32_t> rule_map(other.rules().size());
  for (size_t r = 0; r < other.rules().size(); ++r) rule_map[r] = add_rule(other.rules()[r].name);
  std::vector<int32_t> expr_map(other.exprs().size(), -1);
  for (size_t i = 0; i < other.exprs().size(); ++i) {
    Expr e = other.exprs()[i];
    for (int32_t& c : e.children) {
      DI_CHECK(c >= 0 && static_cast<size_t>(c) < i, "grammar: import: expression ", i, " has a later child ", c);
      c = expr_map[c];
    }
    if (e.kind == ExprKind::Ref) e.rule = rule_map[e.rule];
    expr_map[i] = add(std::move(e));
  }
  for (size_t r = 0; r < other.rules().size(); ++r)
    if (other.rules()[r].body >= 0) set_body(rule_map[r], expr_map[other.rules()[r].body]);
  return rule_map[other.root()];
}

int32_t GrammarIR::add_rule(std::string name) {
  const int64_t bytes = static_cast<int64_t>(sizeof(Rule) + name.capacity());
  bytes_ += bytes;
  if (budget_) budget_->charge(bytes, "building the grammar IR");
  rules_.push_back({std::move(name), -1});
  return static_cast<int32_t>(rules_.size() - 1);
}

CompileBudget::CompileBudget(const CompileLimits& limits)
    : limits_(limits),
      deadline_(std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(std::max(0.0, std::min(limits.max_seconds, 1e9))))) {}

void CompileBudget::check_time(const char* stage) const {
  if (std::chrono::steady_clock::now() >= deadline_)
    throw GrammarBudgetError(detail::concat("grammar: compilation ran past its time budget of ", limits_.max_seconds,
                                            " s (CompileLimits::max_seconds) while ", stage));
}

void CompileBudget::over_memory(const char* stage) const {
  throw GrammarBudgetError(detail::concat("grammar too large: ", stage, " needs more than the memory budget of ",
                                          limits_.max_memory_bytes >> 20, " MiB (CompileLimits::max_memory_bytes)"));
}

}  // namespace deepinfer::grammar
