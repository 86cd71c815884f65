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

int32_t GrammarIR::add_rule(std::string name) {
  rules_.push_back({std::move(name), -1});
  return static_cast<int32_t>(rules_.size() - 1);
}

}  // namespace deepinfer::grammar
