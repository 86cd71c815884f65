// Recursive-descent regex parser producing GrammarIR expressions.
#include "grammar/regex.h"

#include <algorithm>
#include <cctype>
#include <tuple>
#include <unordered_map>

#include "core/error.h"
#include "grammar/grammar.h"
#include "tokenizer/utf8.h"

namespace deepinfer::grammar {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
constexpr uint32_t kMaxCp = 0x10FFFF;

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x2028, 0x2029}, {0xFEFF, 0xFEFF}};

class RegexParser {
 public:
  RegexParser(GrammarIR& ir, const std::string& s, bool json, const std::string& where, int64_t min_chars,
              int64_t max_chars)
      : ir_(ir), s_(s), json_(json), where_(where), min_chars_(min_chars), max_chars_(max_chars) {}

  // The strings of `e` with lo..hi code points (hi -1: unbounded), exact, or -1 where the
  // structure does not allow it: inside alternatives, a sequence with one variable-length
  // part, or a repetition of a fixed-length part ([a-z]{1,} with maxLength 8 -> [a-z]{1,8}).
  int32_t restrict_length(int32_t e, int64_t lo, int64_t hi) {
    auto [elo, ehi] = length_of(e);
    if (elo >= lo && (hi < 0 || (ehi >= 0 && ehi <= hi))) return e;
    if ((ehi >= 0 && ehi < lo) || (hi >= 0 && elo > hi)) return ir_.nothing();
    const Expr x = ir_.expr(e);  // a copy: adding expressions moves the vector
    if (x.kind == ExprKind::Alt) {
      std::vector<int32_t> alts;
      for (int32_t c : x.children) {
        int32_t r = restrict_length(c, lo, hi);
        if (r < 0) return -1;
        alts.push_back(r);
      }
      return ir_.alt(std::move(alts));
    }
    if (x.kind == ExprKind::Seq) {
      int64_t fixed = 0;
      int variable = -1;
      for (size_t i = 0; i < x.children.size(); ++i) {
        auto [clo, chi] = length_of(x.children[i]);
        if (clo == chi) fixed += clo;
        else if (variable >= 0) return -1;
        else variable = static_cast<int>(i);
      }
      if (variable < 0) return -1;  // fixed length outside the bounds was handled above
      int32_t r = restrict_length(x.children[variable], std::max<int64_t>(0, lo - fixed), hi < 0 ? -1 : hi - fixed);
      if (r < 0) return -1;
      std::vector<int32_t> items = x.children;
      items[variable] = r;
      return ir_.seq(std::move(items));
    }
    if (x.kind == ExprKind::Repeat) {
      auto [clo, chi] = length_of(x.children[0]);
      if (clo != chi || clo < 1) return -1;
      int64_t a = std::max<int64_t>(x.min, (lo + clo - 1) / clo);
      int64_t b = x.max == GrammarIR::kUnbounded ? (hi < 0 ? -1 : hi / clo)
                                                  : (hi < 0 ? x.max : std::min<int64_t>(x.max, hi / clo));
      if (b >= 0 && a > b) return ir_.nothing();
      if (a > kMaxRepeatBound || b > kMaxRepeatBound) return -1;
      return ir_.repeat(x.children[0], static_cast<int32_t>(a),
                        b < 0 ? GrammarIR::kUnbounded : static_cast<int32_t>(b));
    }
    return -1;
  }

  RegexResult parse() {
    if (size_t bad = tokenizer_detail::find_invalid_utf8(s_); bad != std::string::npos) {
      pos_ = bad;
      error("invalid UTF-8");
    }
    RegexResult r;
    r.expr = parse_alt(0, &r);
    if (pos_ < s_.size()) error("unbalanced ')'");
    std::tie(r.min_chars, r.max_chars) = length_of(r.expr);
    if ((r.min_chars < min_chars_ || (max_chars_ >= 0 && (r.max_chars < 0 || r.max_chars > max_chars_))) &&
        r.anchored_start && r.anchored_end) {
      // Length bounds the pattern does not imply: restrict it where that is exact.
      int32_t restricted = restrict_length(r.expr, min_chars_, max_chars_);
      if (restricted >= 0) {
        r.expr = restricted;
        r.min_chars = std::max(r.min_chars, min_chars_);
        if (max_chars_ >= 0) r.max_chars = r.max_chars < 0 ? max_chars_ : std::min(r.max_chars, max_chars_);
      }
    }
    return r;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    std::string shown = s_.size() > 200 ? s_.substr(0, 200) + "..." : s_;
    fail(where_, ": ", what, " at position ", pos_, " in /", shown, "/");
  }
  bool eof() const { return pos_ >= s_.size(); }
  char peek() const { return s_[pos_]; }

  // One code point (the regex was checked to be valid UTF-8 in parse()).
  uint32_t read_utf8() {
    size_t num_bytes = 0;
    uint32_t cp = tokenizer_detail::decode_code_point(s_, pos_, num_bytes);
    pos_ += num_bytes;
    return cp;
  }

  int32_t chars(Ranges r) {
    return with_length(json_ ? json_string_char(ir_, std::move(r)) : ir_.char_ranges(std::move(r)), 1, 1);
  }
  // Length ranges (code points; max -1: unbounded) of the expressions built here.
  int32_t with_length(int32_t expr, int64_t lo, int64_t hi) {
    lengths_[expr] = {std::min<int64_t>(lo, kLengthCap), hi < 0 ? -1 : std::min<int64_t>(hi, kLengthCap)};
    return expr;
  }
  std::pair<int64_t, int64_t> length_of(int32_t expr) const {
    auto it = lengths_.find(expr);
    return it == lengths_.end() ? std::pair<int64_t, int64_t>{0, -1} : it->second;  // unknown: any
  }

  int32_t parse_alt(int depth, RegexResult* top) {
    if (depth > 200) error("groups nested too deeply");
    std::vector<int32_t> alts{parse_seq(depth, top)};
    while (!eof() && peek() == '|') {
      ++pos_;
      alts.push_back(parse_seq(depth, top));
    }
    int64_t lo = length_of(alts[0]).first, hi = 0;
    for (int32_t a : alts) {
      auto [alo, ahi] = length_of(a);
      lo = std::min(lo, alo);
      hi = hi < 0 || ahi < 0 ? -1 : std::max(hi, ahi);
    }
    return with_length(ir_.alt(std::move(alts)), lo, hi);
  }

  int32_t parse_seq(int depth, RegexResult* top) {
    std::vector<int32_t> items;
    while (!eof() && peek() != '|' && peek() != ')') {
      if (peek() == '^') {
        if (!items.empty()) error("'^' anchor inside the pattern is not supported");
        if (top) top->anchored_start = true;
        ++pos_;
        continue;
      }
      if (peek() == '$') {
        ++pos_;
        if (!eof() && peek() != '|' && peek() != ')') error("'$' anchor inside the pattern is not supported");
        if (top) top->anchored_end = true;
        continue;
      }
      int32_t atom = parse_atom(depth);
      items.push_back(parse_quantifiers(atom));
    }
    int64_t lo = 0, hi = 0;
    for (int32_t e : items) {
      auto [elo, ehi] = length_of(e);
      lo += elo;
      hi = hi < 0 || ehi < 0 ? -1 : hi + ehi;
    }
    return with_length(ir_.seq(std::move(items)), lo, hi);
  }

  bool read_int(int32_t* out) {
    size_t start = pos_;
    int64_t v = 0;
    while (!eof() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > 1000000) error("repetition bound too large");
      ++pos_;
    }
    *out = static_cast<int32_t>(v);
    return pos_ > start;
  }

  int32_t parse_quantifiers(int32_t atom) {
    while (!eof()) {
      char c = peek();
      int32_t lo, hi;
      if (c == '*') {
        lo = 0, hi = GrammarIR::kUnbounded, ++pos_;
      } else if (c == '+') {
        lo = 1, hi = GrammarIR::kUnbounded, ++pos_;
      } else if (c == '?') {
        lo = 0, hi = 1, ++pos_;
      } else if (c == '{') {
        size_t save = pos_++;
        if (!read_int(&lo)) {
          pos_ = save;  // a literal '{'
          return atom;
        }
        hi = lo;
        if (!eof() && peek() == ',') {
          ++pos_;
          if (!read_int(&hi)) hi = GrammarIR::kUnbounded;
        }
        if (eof() || peek() != '}') {
          pos_ = save;
          return atom;
        }
        ++pos_;
        if (hi != GrammarIR::kUnbounded && hi < lo) error("repetition {n,m} with m < n");
      } else {
        return atom;
      }
      if (!eof() && peek() == '?') ++pos_;  // lazy: same language
      else if (!eof() && peek() == '+') error("possessive quantifiers are not supported");
      auto [alo, ahi] = length_of(atom);
      atom = with_length(ir_.repeat(atom, lo, hi), alo * lo,
                         hi == GrammarIR::kUnbounded || ahi < 0 ? (ahi == 0 ? 0 : -1) : ahi * hi);
    }
    return atom;
  }

  int32_t parse_atom(int depth) {
    char c = peek();
    if (c == '(') {
      ++pos_;
      if (!eof() && peek() == '?') {
        ++pos_;
        if (eof()) error("unterminated group");
        if (peek() == ':') {
          ++pos_;
        } else if (peek() == '<' && pos_ + 1 < s_.size() && s_[pos_ + 1] != '=' && s_[pos_ + 1] != '!') {
          while (!eof() && peek() != '>') ++pos_;
          if (eof()) error("unterminated group name");
          ++pos_;
        } else if (peek() == 'P' && pos_ + 1 < s_.size() && s_[pos_ + 1] == '<') {
          while (!eof() && peek() != '>') ++pos_;
          if (eof()) error("unterminated group name");
          ++pos_;
        } else if (peek() == '=' || peek() == '!' || peek() == '<') {
          error("lookaround assertions are not supported");
        } else {
          error("inline flags and other (? groups are not supported");
        }
      }
      int32_t inner = parse_alt(depth + 1, nullptr);
      if (eof() || peek() != ')') error("missing ')'");
      ++pos_;
      return inner;
    }
    if (c == '[') return chars(parse_class());
    if (c == '.') {
      ++pos_;
      return chars(complement_ranges({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}, kMaxCp));
    }
    if (c == '*' || c == '+' || c == '?') error("quantifier without anything to repeat");
    if (c == '\\') {
      Ranges r;
      parse_escape(false, &r);
      return chars(std::move(r));
    }
    uint32_t cp = read_utf8();
    return chars({{cp, cp}});
  }

  // Parses an escape after '\'; fills a code point set.
  void parse_escape(bool in_class, Ranges* out) {
    ++pos_;  // backslash
    if (eof()) error("trailing backslash");
    char c = s_[pos_++];
    auto one = [&](uint32_t cp) { out->push_back({cp, cp}); };
    auto hex = [&](int n) -> uint32_t {
      uint32_t v = 0;
      for (int i = 0; i < n; ++i) {
        if (eof() || !std::isxdigit(static_cast<unsigned char>(peek()))) error("bad hex escape");
        char h = s_[pos_++];
        v = v * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      return v;
    };
    switch (c) {
      case 'd': *out = kDigit; return;
      case 'D': *out = complement_ranges(kDigit, kMaxCp); return;
      case 'w': *out = kWord; return;
      case 'W': *out = complement_ranges(kWord, kMaxCp); return;
      case 's': *out = kSpace; return;
      case 'S': *out = complement_ranges(kSpace, kMaxCp); return;
      case 'n': one('\n'); return;
      case 't': one('\t'); return;
      case 'r': one('\r'); return;
      case 'f': one('\f'); return;
      case 'v': one('\v'); return;
      case '0': one(0); return;
      case 'x': one(hex(2)); return;
      case 'u':
        if (!eof() && peek() == '{') {
          ++pos_;
          uint32_t v = 0;
          int n = 0;
          while (!eof() && peek() != '}') {
            v = v * 16 + hex(1);
            if (++n > 6 || v > kMaxCp) error("bad \\u{...} escape");
          }
          if (eof()) error("unterminated \\u{...}");
          ++pos_;
          one(v);
        } else {
          one(hex(4));
        }
        return;
      case 'b':
        if (in_class) {
          one('\b');
          return;
        }
        error("word boundary \\b is not supported");
      case 'B': error("\\B is not supported");
      case 'p':
      case 'P': error("Unicode property escapes \\p{...} are not supported");
      case 'c': error("control escapes \\cX are not supported");
      case 'k': error("named backreferences are not supported");
      default:
        if (c >= '1' && c <= '9') error("backreferences are not supported");
        if (std::isalnum(static_cast<unsigned char>(c))) error(std::string("unknown escape \\") + c);
        --pos_;
        uint32_t cp = read_utf8();
        one(cp);
    }
  }

  Ranges parse_class() {
    ++pos_;  // [
    bool negate = false;
    if (!eof() && peek() == '^') {
      negate = true;
      ++pos_;
    }
    Ranges set;
    bool first = true;
    while (true) {
      if (eof()) error("unterminated character class");
      if (peek() == ']' && !first) break;
      first = false;
      Ranges item;
      bool single = true;
      uint32_t lo;
      if (peek() == '\\') {
        parse_escape(true, &item);
        single = item.size() == 1 && item[0].first == item[0].second;
        lo = item[0].first;
      } else {
        lo = read_utf8();
        item = {{lo, lo}};
      }
      if (single && pos_ + 1 < s_.size() && peek() == '-' && s_[pos_ + 1] != ']') {
        ++pos_;
        uint32_t hi;
        if (peek() == '\\') {
          Ranges r;
          parse_escape(true, &r);
          if (r.size() != 1 || r[0].first != r[0].second) error("class range ends in a class escape");
          hi = r[0].first;
        } else {
          hi = read_utf8();
        }
        if (hi < lo) error("character class range out of order");
        item = {{lo, hi}};
      }
      set.insert(set.end(), item.begin(), item.end());
    }
    ++pos_;  // ]
    return negate ? complement_ranges(set, kMaxCp) : normalize_ranges(set);
  }

  static constexpr int64_t kMaxRepeatBound = 4096;  // CompileLimits::max_repeat
  static constexpr int64_t kLengthCap = int64_t{1} << 40;  // saturates; lengths above it are "long"
  std::unordered_map<int32_t, std::pair<int64_t, int64_t>> lengths_;
  GrammarIR& ir_;
  const std::string& s_;
  bool json_;
  std::string where_;
  int64_t min_chars_, max_chars_;
  size_t pos_ = 0;
};

}  // namespace

int32_t json_string_char(GrammarIR& ir, Ranges ranges) {
  ranges = normalize_ranges(std::move(ranges));
  // Plain characters: the class minus ", \ and controls.
  Ranges plain = complement_ranges({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}, kMaxCp);
  Ranges keep;
  for (auto [lo, hi] : ranges)
    for (auto [plo, phi] : plain) {
      uint32_t a = std::max(lo, plo), b = std::min(hi, phi);
      if (a <= b) keep.push_back({a, b});
    }
  std::vector<int32_t> alts;
  if (!keep.empty()) alts.push_back(ir.char_ranges(keep));
  auto in = [&](uint32_t cp) {
    for (auto [lo, hi] : ranges)
      if (cp >= lo && cp <= hi) return true;
    return false;
  };
  static const char kHex[] = "0123456789abcdef";
  for (uint32_t cp = 0; cp < 0x20; ++cp) {
    if (!in(cp)) continue;
    const char* shortform = cp == '\n' ? "\\n" : cp == '\t' ? "\\t" : cp == '\r' ? "\\r" : cp == '\b' ? "\\b" : cp == '\f' ? "\\f" : nullptr;
    std::vector<int32_t> forms;
    if (shortform) forms.push_back(ir.literal(shortform));
    std::string u = "\\u00";
    forms.push_back(ir.seq({ir.literal(u), ir.byte(kHex[cp >> 4]), ir.byte_ranges({{static_cast<uint32_t>(std::toupper(kHex[cp & 15])), static_cast<uint32_t>(std::toupper(kHex[cp & 15]))}, {static_cast<uint32_t>(kHex[cp & 15]), static_cast<uint32_t>(kHex[cp & 15])}})}));
    alts.push_back(ir.alt(std::move(forms)));
  }
  if (in('"')) alts.push_back(ir.literal("\\\""));
  if (in('\\')) alts.push_back(ir.literal("\\\\"));
  return ir.alt(std::move(alts));
}

RegexResult parse_regex(GrammarIR& ir, const std::string& regex, bool json_escape, const std::string& where,
                        int64_t min_chars, int64_t max_chars) {
  return RegexParser(ir, regex, json_escape, where, min_chars, max_chars).parse();
}

GrammarIR parse_regex_grammar(const std::string& regex, CompileBudget* budget) {
  GrammarIR ir;
  ir.set_budget(budget);
  int32_t root = ir.add_rule("root");
  RegexResult r = parse_regex(ir, regex, false, "regex");
  ir.set_body(root, r.expr);
  ir.set_root(root);
  return ir;
}

}  // namespace deepinfer::grammar
