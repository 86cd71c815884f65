// JSONL batch requests: one line -> Prompt + SamplingParams, with every value checked
// before it is converted (no wrap, no float overflow) and error messages that quote at
// most a few bytes of the input. Used by `deepinfer generate --input`, its tests and
// tests/fuzz/fuzz_request_line.cpp (deepinfer_app_request: core, tokenizer, nlohmann_json).
//
// Line format: {"prompt": "..."} | {"messages": [{"role", "content"}...]} |
// {"prompt_token_ids": [...]} plus optional SamplingParams fields by their names.
#pragma once
#include <cstddef>
#include <cstdint>
#include <istream>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "deepinfer/engine.h"

namespace deepinfer::app {

// A line longer than this is that line's error (the reader skips to its newline).
inline constexpr size_t kMaxRequestLineBytes = size_t{16} << 20;  // 16 MiB
// Arrays/objects nested deeper than this are refused before parsing.
inline constexpr int kMaxRequestJsonDepth = 128;

// Parses one JSON text of a request line or file (`what` names it in errors). Checks UTF-8
// and nesting depth up front; messages never echo more than a few bytes of `text`.
// The lead replaces the body with core/json.h's parse_json(text, what, limits).
nlohmann::json parse_request_json(std::string_view text, const std::string& what);

struct RequestLine {
  Prompt prompt;
  SamplingParams params;
};

// One JSONL request line; absent fields keep `defaults`. Throws Error("line N: ...")
// naming the field. Values are converted exactly (or refused); their ranges are
// SamplingParams::validate()'s, which BatchJob and the engine call (this file does not
// link the engine, so the fuzz build stays small).
RequestLine parse_request_line(std::string_view text, int64_t line_no, const SamplingParams& defaults);

// Checked conversions of a JSON value for field `field` (Error names it and the range).
int32_t json_to_int32(const nlohmann::json& v, std::string_view field);
uint64_t json_to_uint64(const nlohmann::json& v, std::string_view field);
float json_to_float(const nlohmann::json& v, std::string_view field);

// At most `max_bytes` of `s` (cut at a UTF-8 character boundary) with "..." when cut.
std::string truncate_for_message(std::string_view s, size_t max_bytes = 64);

// Reads a JSONL stream line by line with a byte limit per line; blank lines are skipped.
class JsonlReader {
 public:
  explicit JsonlReader(std::istream& in, size_t max_line_bytes = kMaxRequestLineBytes)
      : in_(in), max_line_bytes_(max_line_bytes) {}
  struct Line {
    std::string text;     // empty when too_long
    int64_t line_no = 0;  // 1-based line number in the stream
    bool too_long = false;
  };
  // The next non-blank line; nullopt at the end of the stream.
  std::optional<Line> next();

 private:
  std::istream& in_;
  size_t max_line_bytes_;
  int64_t line_no_ = 0;
};

// generation_config.json's sampling defaults (vLLM's --generation-config auto): the fields
// present in the file. do_sample is not read (as vLLM).
struct GenerationDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k, max_tokens;  // max_tokens from max_new_tokens
  bool empty() const {
    return !temperature && !top_p && !min_p && !repetition_penalty && !top_k && !max_tokens;
  }
};
GenerationDefaults parse_generation_config(std::string_view text, const std::string& path);

}  // namespace deepinfer::app
