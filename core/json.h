// The one JSON reading policy: every file and request deepinfer reads as JSON (safetensors
// headers, config.json, tokenizer.json, tokenizer_config.json, index files, JSON Schemas,
// JSONL request lines) goes through parse_json / parse_ordered_json, which
//   - refuse text over a size limit (JsonLimits::max_bytes, default 64 MiB),
//   - validate UTF-8 up front (the error names the byte offset),
//   - refuse nesting deeper than JsonLimits::max_depth (default 256 arrays/objects) in a
//     linear pre-scan, before any value is built, so no later traversal (dump, copy,
//     comparison, a schema compiler) can recurse deeper than that,
//   - refuse duplicate object keys (ambiguous: parsers differ on which one wins),
//   - build the value in time linear in the input (also for ordered_json objects, whose
//     own parser searches every key linearly), and
//   - throw deepinfer::Error naming `what` (a file or request name) and the byte offset, with
//     any input quoted in the message cut to a bounded snippet.
// json_snippet prints a value for an error message within max_chars, without recursion.
#pragma once
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace deepinfer {

struct JsonLimits {
  size_t max_bytes = size_t{64} << 20;  // text size limit (64 MiB)
  int max_depth = 256;                   // arrays/objects nested inside each other
  bool allow_duplicate_keys = false;     // true: the last value of a repeated key wins
};

// Parses `text` as one JSON value under `limits`; throws Error "<what>: ..." otherwise.
nlohmann::json parse_json(std::string_view text, std::string_view what, const JsonLimits& limits = {});
// The same, keeping object keys in input order.
nlohmann::ordered_json parse_ordered_json(std::string_view text, std::string_view what,
                                          const JsonLimits& limits = {});

// Compact JSON text of v for an error message: at most max_chars bytes of it (cut at a UTF-8
// boundary, then "..." appended). Linear in max_chars, iterative (any depth).
std::string json_snippet(const nlohmann::json& v, size_t max_chars = 80);
std::string json_snippet(const nlohmann::ordered_json& v, size_t max_chars = 80);
// Raw text (a name, a key, a line) for an error message: the first max_chars bytes (cut at a
// UTF-8 boundary) followed by "... (N bytes)" when longer; the text itself otherwise.
std::string text_snippet(std::string_view text, size_t max_chars = 80);

// "line L, column C" (1-based; columns count bytes) of a byte offset, for error messages.
std::string line_and_column(std::string_view text, size_t offset);

// Byte offset of the first byte that is not part of well-formed UTF-8 (no overlongs,
// surrogates or truncated sequences), or npos.
size_t find_invalid_utf8_offset(std::string_view bytes);

}  // namespace deepinfer
