// Numeric bounds (see json_schema_number.h).
#include "grammar/json_schema_number.h"

#include <algorithm>
#include <climits>
#include <vector>

#include "core/error.h"

namespace deepinfer::grammar {
namespace {

using json = nlohmann::ordered_json;

class Numbers {
 public:
  explicit Numbers(GrammarIR& ir) : ir_(ir) {}

  // Decimal strings for non-negative integers in [lo, hi] of equal length.
  int32_t same_length(const std::string& lo, const std::string& hi) {
    if (lo.empty()) return ir_.empty();
    auto d = [&](char a, char b) { return ir_.byte_ranges({{static_cast<uint32_t>(a), static_cast<uint32_t>(b)}}); };
    if (lo.size() == 1) return d(lo[0], hi[0]);
    if (lo[0] == hi[0]) return ir_.seq({d(lo[0], lo[0]), same_length(lo.substr(1), hi.substr(1))});
    std::vector<int32_t> alts;
    size_t n = lo.size() - 1;
    alts.push_back(ir_.seq({d(lo[0], lo[0]), same_length(lo.substr(1), std::string(n, '9'))}));
    if (lo[0] + 1 <= hi[0] - 1) alts.push_back(ir_.seq({d(lo[0] + 1, hi[0] - 1), ir_.repeat(d('0', '9'), n, n)}));
    alts.push_back(ir_.seq({d(hi[0], hi[0]), same_length(std::string(n, '0'), hi.substr(1))}));
    return ir_.alt(std::move(alts));
  }
  // Non-negative integers in [lo, hi] (hi < 0: unbounded), canonical decimal.
  int32_t magnitude_range(int64_t lo, int64_t hi) {
    std::vector<int32_t> alts;
    std::string los = std::to_string(lo);
    int64_t pow = 1;
    for (size_t i = 1; i < los.size(); ++i) pow *= 10;
    for (size_t len = los.size(); len <= 19; ++len, pow = pow > INT64_MAX / 10 ? INT64_MAX : pow * 10) {
      int64_t first = len == 1 ? 0 : pow;
      int64_t last = pow > INT64_MAX / 10 ? INT64_MAX : pow * 10 - 1;
      if (hi >= 0 && first > hi) break;
      if (hi < 0 && len > los.size()) {
        alts.push_back(ir_.seq({ir_.byte_ranges({{'1', '9'}}), ir_.repeat(ir_.byte_ranges({{'0', '9'}}),
                                                                           static_cast<int32_t>(len - 1), GrammarIR::kUnbounded)}));
        break;
      }
      int64_t a = std::max(lo, first), b = hi >= 0 ? std::min(hi, last) : last;
      if (a <= b) alts.push_back(same_length(std::to_string(a), std::to_string(b)));
    }
    return ir_.alt(std::move(alts));
  }

  // A decimal bound, exactly as written in the schema: negative, integer digits, fraction
  // digits without trailing zeros (1.50 -> {false, "1", "5"}; 1e-05 -> {false, "0", "00001"}).
  struct Decimal {
    bool negative = false;
    std::string int_digits = "0", frac_digits;
    bool is_zero() const { return int_digits == "0" && frac_digits.empty(); }
  };
  static Decimal to_decimal(const json& v) {
    std::string t = v.dump();  // shortest round-trip text, as Python's json reads it
    Decimal d;
    if (!t.empty() && t[0] == '-') d.negative = true, t.erase(0, 1);
    int exp = 0;
    if (size_t e = t.find_first_of("eE"); e != std::string::npos) exp = std::stoi(t.substr(e + 1)), t.resize(e);
    size_t dot = t.find('.');
    std::string digits = dot == std::string::npos ? t : t.substr(0, dot) + t.substr(dot + 1);
    int point = static_cast<int>(dot == std::string::npos ? t.size() : dot) + exp;  // digits before the point
    if (point <= 0) digits.insert(0, static_cast<size_t>(-point) + 1, '0'), point = 1;
    if (point > static_cast<int>(digits.size())) digits.append(point - digits.size(), '0');
    d.int_digits = digits.substr(0, point);
    d.frac_digits = digits.substr(point);
    d.int_digits.erase(0, std::min(d.int_digits.find_first_not_of('0'), d.int_digits.size() - 1));
    while (!d.frac_digits.empty() && d.frac_digits.back() == '0') d.frac_digits.pop_back();
    if (d.is_zero()) d.negative = false;
    return d;
  }
  // Compares the magnitudes of two decimals: -1, 0, 1.
  static int compare_magnitude(const Decimal& a, const Decimal& b) {
    if (a.int_digits.size() != b.int_digits.size()) return a.int_digits.size() < b.int_digits.size() ? -1 : 1;
    if (int c = a.int_digits.compare(b.int_digits)) return c < 0 ? -1 : 1;
    if (int c = a.frac_digits.compare(b.frac_digits)) return c < 0 ? -1 : 1;
    return 0;
  }

  // Fraction digit strings s (possibly empty) of value 0.s within the bounds: >= 0.lo (> if
  // lo_strict) while tight_lo (the digits so far equal lo's), <= 0.hi (< if hi_strict) while
  // tight_hi. Returns {empty s allowed, expression for non-empty s}.
  std::pair<bool, int32_t> fraction_digits(const std::string& lo, bool lo_strict, bool tight_lo, const std::string& hi,
                                           bool hi_strict, bool tight_hi, size_t i) {
    const bool lo_done = tight_lo && i >= lo.size(), hi_done = tight_hi && i >= hi.size();
    auto zeros_then = [&](bool strict) {  // digits of value >= 0 (strict: > 0)
      return strict ? ir_.seq({ir_.star(lit("0")), ir_.byte_ranges({{'1', '9'}}), ir_.star(ir_.byte_ranges({{'0', '9'}}))})
                    : ir_.plus(ir_.byte_ranges({{'0', '9'}}));
    };
    if (!tight_lo && !tight_hi) return {true, ir_.plus(ir_.byte_ranges({{'0', '9'}}))};
    if (hi_done) {  // the rest must be zeros; lo's rest (if tight) is positive unless done
      bool ok = !hi_strict && (!tight_lo || (lo_done && !lo_strict));
      return {ok, ok ? ir_.plus(lit("0")) : ir_.nothing()};
    }
    if (lo_done && !tight_hi) return {!lo_strict, zeros_then(lo_strict)};
    const int da = tight_lo ? (i < lo.size() ? lo[i] - '0' : 0) : 0;
    const int db = tight_hi ? hi[i] - '0' : 9;
    // Ending here: at or above lo only if lo has no non-zero digit left; below hi (tight_hi,
    // not done) because hi's rest is positive.
    bool end_ok = !tight_lo || (lo_done && !lo_strict);
    std::vector<int32_t> alts;
    for (int c = da; c <= db; ++c) {
      bool tl = tight_lo && c == da, th = tight_hi && c == db;
      if (!tl && !th) {  // a run of free digits: [c..c'] then anything
        int c_end = c;
        while (c_end + 1 <= db && !(tight_hi && c_end + 1 == db)) ++c_end;
        alts.push_back(ir_.seq({ir_.byte_ranges({{static_cast<uint32_t>('0' + c), static_cast<uint32_t>('0' + c_end)}}),
                                ir_.star(ir_.byte_ranges({{'0', '9'}}))}));
        c = c_end;
        continue;
      }
      auto [end, more] = fraction_digits(lo, lo_strict, tl, hi, hi_strict, th, i + 1);
      int32_t digit = ir_.byte(static_cast<uint8_t>('0' + c));
      alts.push_back(end ? ir_.seq({digit, ir_.opt(more)}) : ir_.seq({digit, more}));
    }
    return {end_ok, alts.empty() ? ir_.nothing() : ir_.alt(std::move(alts))};
  }
  // Optional fraction part ("" or "." digits) of value within the bounds (see fraction_digits).
  int32_t fraction_part(const std::string& lo, bool lo_strict, bool tight_lo, const std::string& hi, bool hi_strict,
                        bool tight_hi) {
    auto [end, more] = fraction_digits(lo, lo_strict, tight_lo, hi, hi_strict, tight_hi, 0);
    int32_t dotted = ir_.seq({lit("."), more});
    return end ? ir_.opt(dotted) : dotted;
  }
  // Non-negative decimals m (canonical integer part, optional fraction, no exponent) with
  // lo <= m (< if lo_strict) and, if has_hi, m <= hi (< if hi_strict).
  int32_t decimal_magnitudes(const Decimal& lo, bool lo_strict, bool has_hi, const Decimal& hi, bool hi_strict) {
    const int64_t a = std::stoll(lo.int_digits);
    if (has_hi && lo.int_digits == hi.int_digits)
      return ir_.seq({lit(lo.int_digits), fraction_part(lo.frac_digits, lo_strict, true, hi.frac_digits, hi_strict, true)});
    std::vector<int32_t> alts{ir_.seq({lit(lo.int_digits), fraction_part(lo.frac_digits, lo_strict, true, "", false, false)})};
    const int64_t b = has_hi ? std::stoll(hi.int_digits) : -1;
    if (!has_hi || a + 1 <= b - 1)
      alts.push_back(ir_.seq({magnitude_range(a + 1, has_hi ? b - 1 : -1), ir_.opt(ir_.seq({lit("."), digits()}))}));
    if (has_hi) alts.push_back(ir_.seq({lit(hi.int_digits), fraction_part("", false, false, hi.frac_digits, hi_strict, true)}));
    return ir_.alt(std::move(alts));
  }
  // Non-negative part, then "-" and the negative part's magnitudes.
  int32_t bounded_decimal(const json& s, const std::string& path) {
    bool has_lo = false, has_hi = false, lo_strict = false, hi_strict = false;
    Decimal lo, hi;
    auto tighter = [&](const Decimal& x, const Decimal& y, bool want_larger) {  // signed comparison
      int c = x.negative != y.negative ? (x.negative ? -1 : 1)
                                       : (x.negative ? -compare_magnitude(x, y) : compare_magnitude(x, y));
      return want_larger ? c > 0 : c < 0;
    };
    auto bound = [&](const char* key, bool is_lo, bool exclusive) {
      if (!s.contains(key) || s[key].is_boolean()) return;
      Decimal d = to_decimal(s[key]);
      bool strict = exclusive || s.value(is_lo ? "exclusiveMinimum" : "exclusiveMaximum", json(false)) == json(true);
      Decimal& cur = is_lo ? lo : hi;
      bool& has = is_lo ? has_lo : has_hi;
      bool& cur_strict = is_lo ? lo_strict : hi_strict;
      if (!has || tighter(d, cur, is_lo) || (compare_magnitude(d, cur) == 0 && d.negative == cur.negative && strict)) {
        cur = d;
        cur_strict = strict;
      }
      has = true;
    };
    bound("minimum", true, false);
    bound("exclusiveMinimum", true, true);
    bound("maximum", false, false);
    bound("exclusiveMaximum", false, true);
    if (has_lo && has_hi && (tighter(lo, hi, true) || (compare_magnitude(lo, hi) == 0 && lo.negative == hi.negative &&
                                                       (lo_strict || hi_strict))))
      fail("json schema: minimum above maximum: no number matches at ", path);
    std::vector<int32_t> alts;
    const Decimal zero;
    if (!has_hi || !hi.negative) {  // x >= 0
      bool lo_nonneg = has_lo && !lo.negative;
      alts.push_back(decimal_magnitudes(lo_nonneg ? lo : zero, lo_nonneg && lo_strict, has_hi, hi, hi_strict));
    }
    if (!has_lo || lo.negative) {  // x < 0: "-" m with m > 0, m <= -lo, m >= -hi
      bool hi_neg = has_hi && hi.negative;
      Decimal mlo = hi_neg ? hi : zero, mhi = lo;
      mlo.negative = mhi.negative = false;
      alts.push_back(ir_.seq({lit("-"), decimal_magnitudes(mlo, hi_neg ? hi_strict : true, has_lo, mhi, lo_strict)}));
    }
    return ir_.alt(std::move(alts));
  }

 private:
  int32_t lit(const std::string& s) { return ir_.literal(s); }
  int32_t digits() { return ir_.plus(ir_.byte_ranges({{'0', '9'}})); }
  GrammarIR& ir_;
};

}  // namespace

int32_t bounded_integer(GrammarIR& ir, std::optional<int64_t> lo, std::optional<int64_t> hi) {
  Numbers n(ir);
  std::vector<int32_t> alts;
  if (!hi || *hi >= 0) alts.push_back(n.magnitude_range(lo ? std::max<int64_t>(*lo, 0) : 0, hi ? *hi : -1));
  if (!lo || *lo < 0) alts.push_back(ir.seq({ir.literal("-"), n.magnitude_range(hi ? std::max<int64_t>(-*hi, 1) : 1, lo ? -*lo : -1)}));
  return ir.alt(std::move(alts));
}

int32_t bounded_decimal(GrammarIR& ir, const json& s, const std::string& path) {
  return Numbers(ir).bounded_decimal(s, path);
}

}  // namespace deepinfer::grammar
