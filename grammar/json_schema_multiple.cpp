// Integers divisible by k (see json_schema_multiple.h). The unbounded side is a DFA over the
// digits written as right-recursive rules: rule q (residue q of the digits so far) is
// digit d then rule (10 q + d) % k, or the end when q == 0. Each digit calls one rule, so the
// matcher's stack grows by one per digit (numbers are short). A bounded side is the list of
// its multiples.
#include "grammar/json_schema_multiple.h"

#include <vector>

#include "core/error.h"

namespace deepinfer::grammar {
namespace {

constexpr int64_t kMaxStep = 1000;        // rules in the residue DFA
constexpr int64_t kMaxEnumerated = 4096;  // literals for a bounded side

// Digit strings of residue 0 read from the state "residue q" (rule per residue, k rules).
std::vector<int32_t> residue_rules(GrammarIR& ir, int64_t k) {
  std::vector<int32_t> rules(k);
  for (int64_t q = 0; q < k; ++q) rules[q] = ir.add_rule("multiple_of_" + std::to_string(k));
  for (int64_t q = 0; q < k; ++q) {
    std::vector<int32_t> alts;
    if (q == 0) alts.push_back(ir.empty());
    // Digits leading to the same residue share one byte class.
    std::vector<std::vector<std::pair<uint32_t, uint32_t>>> by_target(k);
    for (int d = 0; d <= 9; ++d) by_target[(10 * q + d) % k].push_back({'0' + d, '0' + d});
    for (int64_t t = 0; t < k; ++t)
      if (!by_target[t].empty()) alts.push_back(ir.seq({ir.byte_ranges(by_target[t]), ir.ref(rules[t])}));
    ir.set_body(rules[q], ir.alt(std::move(alts)));
  }
  return rules;
}

// Positive multiples of k without bound: [1-9] then the residue DFA.
int32_t positive_multiples(GrammarIR& ir, int64_t k, std::vector<int32_t>* rules) {
  if (rules->empty()) *rules = residue_rules(ir, k);
  std::vector<int32_t> alts;
  for (int d = 1; d <= 9; ++d) alts.push_back(ir.seq({ir.byte(static_cast<uint8_t>('0' + d)), ir.ref((*rules)[d % k])}));
  return ir.alt(std::move(alts));
}

// Multiples of k in [a, b] (0 < a <= b), as literals; `sign` prefixes each.
int32_t enumerated(GrammarIR& ir, int64_t k, int64_t a, int64_t b, const std::string& sign, const std::string& path) {
  int64_t first = (a + k - 1) / k * k;
  if (first > b) return ir.nothing();
  if ((b - first) / k + 1 > kMaxEnumerated)
    fail("json schema: multipleOf ", k, " over a bounded range with more than ", kMaxEnumerated,
         " multiples is not supported at ", path);
  std::vector<int32_t> alts;
  for (int64_t v = first; v <= b; v += k) alts.push_back(ir.literal(sign + std::to_string(v)));
  return ir.alt(std::move(alts));
}

}  // namespace

int32_t integer_multiples(GrammarIR& ir, int64_t k, std::optional<int64_t> lo, std::optional<int64_t> hi,
                          const std::string& path) {
  if (k < 1 || k > kMaxStep) fail("json schema: multipleOf ", k, " outside 1..", kMaxStep, " is not supported at ", path);
  if (lo && hi && *lo > *hi) fail("json schema: minimum above maximum: no number matches at ", path);
  std::vector<int32_t> rules, alts;
  const bool zero = (!lo || *lo <= 0) && (!hi || *hi >= 0);
  if (zero) alts.push_back(ir.alt({ir.literal("0"), ir.literal("-0")}));
  // Positive side: (max(lo, 1) .. hi].
  if (!hi || *hi > 0) {
    if (!hi && lo && *lo > 1)
      fail("json schema: multipleOf with a positive minimum and no maximum is not supported at ", path);
    alts.push_back(hi ? enumerated(ir, k, lo ? std::max<int64_t>(*lo, 1) : 1, *hi, "", path)
                      : positive_multiples(ir, k, &rules));
  }
  // Negative side: "-" then magnitudes in [max(-hi, 1), -lo].
  if (!lo || *lo < 0) {
    if (!lo && hi && *hi < -1)
      fail("json schema: multipleOf with a negative maximum and no minimum is not supported at ", path);
    alts.push_back(lo ? enumerated(ir, k, hi ? std::max<int64_t>(-*hi, 1) : 1, -*lo, "-", path)
                      : ir.seq({ir.literal("-"), positive_multiples(ir, k, &rules)}));
  }
  return ir.alt(std::move(alts));
}

}  // namespace deepinfer::grammar
