// Regex front-end: the regex syntax used in JSON Schema patterns and constrained decoding
// (ECMAScript-like: classes, escapes, bounded quantifiers, alternation, groups).
#pragma once
#include <cstdint>
#include <string>

#include "grammar/ir.h"

namespace deepinfer::grammar {

struct RegexResult {
  int32_t expr = -1;
  bool anchored_start = false;  // began with ^
  bool anchored_end = false;    // ended with $
  // Length range, in code points, of the strings `expr` matches (anchors aside);
  // max_chars -1: unbounded.
  int64_t min_chars = 0;
  int64_t max_chars = -1;
};

// Parses `regex` into expressions of `ir`. json_escape: the regex describes a decoded JSON
// string, so characters that JSON must escape (", \, controls) are emitted as their escape
// sequences. `where` names the source in errors (e.g. "regex", "pattern at /properties/x").
// With length bounds (code points; max_chars -1: none) that the pattern does not imply and
// anchors at both ends, the expression is restricted to them where that is exact (see
// RegexParser::restrict_length); min_chars/max_chars report the result, so a caller can
// refuse what could not be restricted.
RegexResult parse_regex(GrammarIR& ir, const std::string& regex, bool json_escape, const std::string& where,
                        int64_t min_chars = 0, int64_t max_chars = -1);

// A JSON string character of class `ranges` (code points) in escaped form.
int32_t json_string_char(GrammarIR& ir, std::vector<std::pair<uint32_t, uint32_t>> ranges);

}  // namespace deepinfer::grammar
