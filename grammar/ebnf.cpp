// EBNF front-end: llama.cpp GBNF and W3C-style EBNF (the common subset plus each one's
// extras): `name ::= alternatives`, "lit" / 'lit', [classes], #xHH, (groups), . (any char),
// postfix * + ? {m} {m,} {m,n}, comments `# ...` and `/* ... */`. The root is the rule named
// `root` (a grammar without one is refused: silently starting at the first rule hid typos).
#include <cctype>
#include <map>

#include "core/error.h"
#include "core/json.h"
#include "grammar/grammar.h"
#include "tokenizer/utf8.h"

namespace deepinfer::grammar {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

class EbnfParser {
 public:
  EbnfParser(const std::string& s, CompileBudget* budget) : s_(s) { ir_.set_budget(budget); }

  GrammarIR parse() {
    try {
      return parse_rules();
    } catch (const GrammarBudgetError& e) {
      if (e.located()) throw;
      throw GrammarBudgetError(detail::concat("ebnf: ", e.cause(), " at ", where(pos_)), true);
    }
  }

 private:
  GrammarIR parse_rules() {
    // Validated once here (the tokenizer's UTF-8 rules: no overlongs, surrogates or truncation),
    // so read_cp below decodes without checks.
    const size_t bad = tokenizer_detail::find_invalid_utf8(s_);
    if (bad != std::string::npos) {
      pos_ = bad;
      error("invalid UTF-8");
    }
    skip_space();
    if (eof()) error("empty grammar");
    while (!eof()) {
      std::string name = read_name();
      if (name.empty()) error("expected a rule name");
      skip_space();
      if (s_.compare(pos_, 3, "::=") != 0) error("expected '::=' after rule name '" + text_snippet(name) + "'");
      pos_ += 3;
      int32_t rule = rule_id(name);
      if (defined_.count(rule)) error("rule '" + text_snippet(name) + "' defined twice");
      defined_[rule] = true;
      ir_.set_body(rule, parse_alt(0));
      skip_space();
    }
    for (const auto& [name, id] : ids_)
      if (!defined_.count(id))
        fail("ebnf: rule '", text_snippet(name), "' is used but not defined (first use at ", where(uses_[id]), ")");
    auto it = ids_.find("root");
    if (it == ids_.end())
      fail("ebnf: no rule named 'root' (the grammar starts at the rule 'root'; ", ids_.size(),
           ids_.size() == 1 ? " rule is" : " rules are", " defined, none of them 'root')");
    ir_.set_root(it->second);
    return std::move(ir_);
  }

  // "line L, column C" of a byte offset (computed only for messages: linear in the offset).
  std::string where(size_t pos) const { return line_and_column(s_, pos); }
  [[noreturn]] void error(const std::string& what) const { fail("ebnf: ", what, " at ", where(pos_)); }
  bool eof() const { return pos_ >= s_.size(); }
  char peek() const { return s_[pos_]; }
  static bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'; }

  void skip_space() {
    while (!eof()) {
      char c = peek();
      if (std::isspace(static_cast<unsigned char>(c))) {
        ++pos_;
      } else if (c == '#' && !(pos_ + 1 < s_.size() && s_[pos_ + 1] == 'x')) {
        while (!eof() && peek() != '\n') ++pos_;
      } else if (s_.compare(pos_, 2, "/*") == 0) {
        size_t end = s_.find("*/", pos_ + 2);
        if (end == std::string::npos) error("unterminated comment");
        pos_ = end + 2;
      } else {
        break;
      }
    }
  }

  std::string read_name() {
    size_t start = pos_;
    while (!eof() && name_char(peek()) && !(peek() == '.' && pos_ == start)) ++pos_;
    return s_.substr(start, pos_ - start);
  }

  int32_t rule_id(const std::string& name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    int32_t id = ir_.add_rule(name);
    ids_[name] = id;
    uses_[id] = pos_;
    return id;
  }

  // True when the upcoming text is `name ::=` (the start of the next rule).
  bool at_rule_start() {
    size_t save = pos_;
    std::string name = read_name();
    skip_space();
    bool yes = !name.empty() && s_.compare(pos_, 3, "::=") == 0;
    pos_ = save;
    return yes;
  }

  int32_t parse_alt(int depth) {
    if (depth > 200) error("groups nested too deeply");
    std::vector<int32_t> alts{parse_seq(depth)};
    skip_space();
    while (!eof() && peek() == '|') {
      ++pos_;
      alts.push_back(parse_seq(depth));
      skip_space();
    }
    return ir_.alt(std::move(alts));
  }

  int32_t parse_seq(int depth) {
    std::vector<int32_t> items;
    while (true) {
      skip_space();
      if (eof() || peek() == '|' || peek() == ')') break;
      if (peek() == '-' ) error("exclusion 'A - B' is not supported");
      if (name_char(peek()) && peek() != '.' && at_rule_start()) break;
      items.push_back(parse_postfix(parse_atom(depth)));
    }
    return ir_.seq(std::move(items));
  }

  int32_t read_int() {
    int64_t v = 0;
    if (eof() || !std::isdigit(static_cast<unsigned char>(peek()))) error("expected a number");
    while (!eof() && std::isdigit(static_cast<unsigned char>(peek()))) {
      v = v * 10 + (peek() - '0');
      if (v > 1000000) error("repetition bound too large");
      ++pos_;
    }
    return static_cast<int32_t>(v);
  }

  int32_t parse_postfix(int32_t atom) {
    while (!eof()) {
      char c = peek();
      if (c == '*') {
        ++pos_;
        atom = ir_.star(atom);
      } else if (c == '+') {
        ++pos_;
        atom = ir_.plus(atom);
      } else if (c == '?') {
        ++pos_;
        atom = ir_.opt(atom);
      } else if (c == '{') {
        ++pos_;
        skip_space();
        int32_t lo = read_int(), hi = lo;
        skip_space();
        if (!eof() && peek() == ',') {
          ++pos_;
          skip_space();
          hi = (!eof() && peek() == '}') ? GrammarIR::kUnbounded : read_int();
          skip_space();
        }
        if (eof() || peek() != '}') error("expected '}'");
        ++pos_;
        if (hi != GrammarIR::kUnbounded && hi < lo) error("repetition {m,n} with n < m");
        atom = ir_.repeat(atom, lo, hi);
      } else {
        break;
      }
    }
    return atom;
  }

  uint32_t hex(int max_digits, bool exact) {
    uint32_t v = 0;
    int n = 0;
    while (n < max_digits && !eof() && std::isxdigit(static_cast<unsigned char>(peek()))) {
      char h = s_[pos_++];
      v = v * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
      ++n;
    }
    if (n == 0 || (exact && n != max_digits) || v > 0x10FFFF) error("bad hex escape");
    return v;
  }

  uint32_t read_cp() {
    size_t num_bytes = 0;
    const uint32_t cp = tokenizer_detail::decode_code_point(s_, pos_, num_bytes);
    pos_ += num_bytes;
    return cp;
  }

  // One character of a literal or class, with escapes; `quote` ends literals.
  uint32_t read_char() {
    if (peek() == '#' && pos_ + 1 < s_.size() && s_[pos_ + 1] == 'x') {
      pos_ += 2;
      return hex(6, false);
    }
    if (peek() != '\\') return read_cp();
    ++pos_;
    if (eof()) error("trailing backslash");
    char c = s_[pos_++];
    switch (c) {
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return 0;
      case 'x': return hex(2, true);
      case 'u': return hex(4, true);
      case 'U': return hex(8, true);
      default:
        --pos_;
        return read_cp();
    }
  }

  int32_t parse_atom(int depth) {
    char c = peek();
    if (c == '(') {
      ++pos_;
      int32_t inner = parse_alt(depth + 1);
      skip_space();
      if (eof() || peek() != ')') error("missing ')'");
      ++pos_;
      return inner;
    }
    if (c == '"' || c == '\'') {
      ++pos_;
      std::string bytes;
      while (true) {
        if (eof()) error("unterminated string literal");
        if (peek() == c) break;
        if (peek() == '#') {  // '#' inside a literal is itself
          bytes.push_back(s_[pos_++]);
          continue;
        }
        append_utf8(bytes, read_char());
      }
      ++pos_;
      return ir_.literal(bytes);
    }
    if (c == '[') {
      ++pos_;
      bool negate = !eof() && peek() == '^';
      if (negate) ++pos_;
      Ranges set;
      while (true) {
        if (eof()) error("unterminated character class");
        if (peek() == ']') break;
        uint32_t lo = read_char(), hi = lo;
        if (pos_ + 1 < s_.size() && peek() == '-' && s_[pos_ + 1] != ']') {
          ++pos_;
          hi = read_char();
          if (hi < lo) error("character class range out of order");
        }
        set.push_back({lo, hi});
      }
      ++pos_;
      return ir_.char_ranges(negate ? complement_ranges(set, 0x10FFFF) : set);
    }
    if (c == '#' && pos_ + 1 < s_.size() && s_[pos_ + 1] == 'x') {
      uint32_t cp = read_char();
      return ir_.char_ranges({{cp, cp}});
    }
    if (c == '.') {
      ++pos_;
      return ir_.char_ranges({{0, 0x10FFFF}});
    }
    if (name_char(c)) return ir_.ref(rule_id(read_name()));
    error(std::string("unexpected character '") + c + "'");
  }

  const std::string& s_;
  size_t pos_ = 0;
  GrammarIR ir_;
  std::map<std::string, int32_t> ids_;
  std::map<int32_t, bool> defined_;
  std::map<int32_t, size_t> uses_;  // byte offset of each rule's first mention
};

}  // namespace

GrammarIR parse_ebnf(const std::string& text, CompileBudget* budget) { return EbnfParser(text, budget).parse(); }

}  // namespace deepinfer::grammar
