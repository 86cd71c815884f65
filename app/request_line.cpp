#include "app/request_line.h"

#include <cfloat>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/json.h"

namespace deepinfer::app {
namespace {

using nlohmann::json;

const char* type_name(const json& v) {
  return v.is_number_float() ? "a non-integer number" : v.type_name();
}

// Integer value of `v` in [lo, hi]; integral floats (2.0, 1e3) are accepted.
template <typename T>
T json_to_integer(const json& v, std::string_view field) {
  constexpr T lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
  auto out_of_range = [&](const auto& shown) {
    fail(field, ": ", shown, " is out of range [", +lo, ", ", +hi, "]");
  };
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) out_of_range(u);
    return static_cast<T>(u);
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if constexpr (std::is_unsigned_v<T>) {
      if (i < 0) out_of_range(i);
    } else {
      if (i < static_cast<int64_t>(lo) || i > static_cast<int64_t>(hi)) out_of_range(i);
    }
    return static_cast<T>(i);
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // hi + 1 is a power of two, exact in a double; compare against it, not against hi.
    const double hi_exclusive = static_cast<double>(hi / 2 + 1) * 2.0;
    if (!(d >= static_cast<double>(lo) && d < hi_exclusive)) out_of_range(d);
    DI_CHECK(d == std::floor(d), field, ": expected an integer, got ", d);
    return static_cast<T>(d);
  }
  fail(field, ": expected an integer, got ", type_name(v));
}

std::string json_to_string(const json& v, std::string_view field) {
  DI_CHECK(v.is_string(), field, ": expected a string, got ", v.type_name());
  return v.get<std::string>();
}

bool json_to_bool(const json& v, std::string_view field) {
  DI_CHECK(v.is_boolean(), field, ": expected true or false, got ", v.type_name());
  return v.get<bool>();
}

std::vector<std::string> json_to_strings(const json& v, std::string_view field, size_t max_count) {
  if (v.is_string()) return {v.get<std::string>()};
  DI_CHECK(v.is_array(), field, ": expected a string or an array of strings, got ", v.type_name());
  DI_CHECK(v.size() <= max_count, field, ": ", v.size(), " entries, at most ", max_count);
  std::vector<std::string> out;
  for (const json& s : v) out.push_back(json_to_string(s, field));
  return out;
}

std::vector<int32_t> json_to_int32s(const json& v, std::string_view field, size_t max_count) {
  DI_CHECK(v.is_array(), field, ": expected an array of integers, got ", v.type_name());
  DI_CHECK(v.size() <= max_count, field, ": ", v.size(), " entries, at most ", max_count);
  std::vector<int32_t> out;
  out.reserve(v.size());
  for (const json& t : v) out.push_back(json_to_int32(t, field));
  return out;
}

void parse_field(const std::string& key, const json& v, Prompt& prompt, SamplingParams& p) {
  using SP = SamplingParams;
  if (key == "prompt") prompt.text = json_to_string(v, key);
  else if (key == "messages") {
    DI_CHECK(v.is_array(), "messages: expected an array of {\"role\", \"content\"} objects, got ", v.type_name());
    for (const json& m : v) {
      DI_CHECK(m.is_object() && m.contains("role") && m.contains("content"),
               "messages: each entry needs \"role\" and \"content\"");
      prompt.messages.push_back({json_to_string(m["role"], "messages.role"),
                                 json_to_string(m["content"], "messages.content")});
    }
  } else if (key == "prompt_token_ids") prompt.token_ids = json_to_int32s(v, key, kMaxRequestLineBytes);
  else if (key == "n") p.n = json_to_int32(v, key);
  else if (key == "temperature") p.temperature = json_to_float(v, key);
  else if (key == "top_p") p.top_p = json_to_float(v, key);
  else if (key == "top_k") p.top_k = json_to_int32(v, key);
  else if (key == "min_p") p.min_p = json_to_float(v, key);
  else if (key == "repetition_penalty") p.repetition_penalty = json_to_float(v, key);
  else if (key == "frequency_penalty") p.frequency_penalty = json_to_float(v, key);
  else if (key == "presence_penalty") p.presence_penalty = json_to_float(v, key);
  else if (key == "max_tokens") p.max_tokens = json_to_int32(v, key);
  else if (key == "min_tokens") p.min_tokens = json_to_int32(v, key);
  else if (key == "stop") p.stop = json_to_strings(v, key, SP::kMaxStops);
  else if (key == "stop_token_ids") p.stop_token_ids = json_to_int32s(v, key, SP::kMaxStopTokenIds);
  else if (key == "seed") p.seed = json_to_uint64(v, key);
  else if (key == "seq_seed") p.seq_seed = json_to_uint64(v, key);
  else if (key == "logprobs") p.logprobs = json_to_int32(v, key);
  else if (key == "ignore_eos") p.ignore_eos = json_to_bool(v, key);
  else if (key == "skip_special_tokens") p.skip_special_tokens = json_to_bool(v, key);
  else if (key == "include_stop_str_in_output") p.include_stop_str_in_output = json_to_bool(v, key);
  else if (key == "regex" || key == "json_schema" || key == "ebnf" || key == "json_object") {
    DI_CHECK(p.so_args.kind.empty(), key, ": only one of regex, json_schema, ebnf, json_object per request (",
             p.so_args.kind, " is given too)");
    if (key == "regex") p.so_args = {"regex", json_to_string(v, key)};
    else if (key == "ebnf") p.so_args = {"ebnf", json_to_string(v, key)};
    else if (key == "json_schema") {
      DI_CHECK(v.is_string() || v.is_object() || v.is_boolean(),
               "json_schema: expected a schema object or its text, got ", v.type_name());
      p.so_args = {"json_schema", v.is_string() ? v.get<std::string>() : v.dump()};
    } else if (json_to_bool(v, key)) {
      p.so_args = {"json_object", ""};
    }
  } else {
    fail("unknown field '", truncate_for_message(key), "'");
  }
}

}  // namespace

std::string truncate_for_message(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return std::string(s);
  size_t cut = max_bytes;
  // Back up over UTF-8 continuation bytes so the cut stays a valid character boundary.
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return std::string(s.substr(0, cut)) + "...";
}

// Request lines follow the one JSON reading policy (core/json.h) with the request bounds.
json parse_request_json(std::string_view text, const std::string& what) {
  JsonLimits limits;
  limits.max_bytes = kMaxRequestLineBytes;
  limits.max_depth = kMaxRequestJsonDepth;
  return parse_json(text, what, limits);
}

int32_t json_to_int32(const json& v, std::string_view field) { return json_to_integer<int32_t>(v, field); }
uint64_t json_to_uint64(const json& v, std::string_view field) { return json_to_integer<uint64_t>(v, field); }

float json_to_float(const json& v, std::string_view field) {
  DI_CHECK(v.is_number(), field, ": expected a number, got ", v.type_name());
  const double d = v.get<double>();
  DI_CHECK(std::isfinite(d) && std::fabs(d) <= FLT_MAX, field, ": ", d, " is out of range of a 32-bit float");
  return static_cast<float>(d);
}

RequestLine parse_request_line(std::string_view text, int64_t line_no, const SamplingParams& defaults) {
  const std::string where = "line " + std::to_string(line_no);
  const json j = parse_request_json(text, where);
  DI_CHECK(j.is_object(), where, ": expected a JSON object, got ", j.type_name());
  RequestLine r;
  r.params = defaults;
  // Per-request constraints replace the defaults' (one kind at a time within a line).
  if (j.contains("regex") || j.contains("json_schema") || j.contains("ebnf") || j.contains("json_object"))
    r.params.so_args = {};
  for (const auto& [key, v] : j.items()) {
    try {
      parse_field(key, v, r.prompt, r.params);
    } catch (const Error& e) {
      fail(where, ": ", e.what());
    }
  }
  DI_CHECK(!r.prompt.text.empty() || !r.prompt.messages.empty() || !r.prompt.token_ids.empty(), where,
           ": needs a non-empty prompt, messages or prompt_token_ids");
  DI_CHECK(int(!r.prompt.text.empty()) + int(!r.prompt.messages.empty()) + int(!r.prompt.token_ids.empty()) == 1,
           where, ": give one of prompt, messages or prompt_token_ids");
  return r;
}

std::optional<JsonlReader::Line> JsonlReader::next() {
  Line line;
  while (true) {
    line.text.clear();
    line.too_long = false;
    if (!in_.good() || in_.peek() == std::char_traits<char>::eof()) return std::nullopt;
    line.line_no = ++line_no_;
    std::streambuf* buf = in_.rdbuf();
    size_t length = 0;
    for (int c = buf->sbumpc(); c != std::char_traits<char>::eof() && c != '\n'; c = buf->sbumpc()) {
      if (line.too_long) continue;
      if (++length > max_line_bytes_) {
        line.too_long = true;
        line.text = std::string();
      } else {
        line.text.push_back(static_cast<char>(c));
      }
    }
    if (buf->sgetc() == std::char_traits<char>::eof()) in_.setstate(std::ios::eofbit);
    if (line.too_long || line.text.find_first_not_of(" \t\r") != std::string::npos) return line;
  }
}

GenerationDefaults parse_generation_config(std::string_view text, const std::string& path) {
  const json j = parse_request_json(text, path);
  DI_CHECK(j.is_object(), path, ": expected a JSON object, got ", j.type_name());
  GenerationDefaults g;
  auto field = [&](const char* name) -> const json* {
    auto it = j.find(name);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };
  const std::string at = path + ": ";
  try {
    if (auto* v = field("temperature")) g.temperature = json_to_float(*v, "temperature");
    if (auto* v = field("top_p")) g.top_p = json_to_float(*v, "top_p");
    if (auto* v = field("min_p")) g.min_p = json_to_float(*v, "min_p");
    if (auto* v = field("repetition_penalty")) g.repetition_penalty = json_to_float(*v, "repetition_penalty");
    if (auto* v = field("top_k")) g.top_k = json_to_int32(*v, "top_k");
    if (auto* v = field("max_new_tokens")) g.max_tokens = json_to_int32(*v, "max_new_tokens");
  } catch (const Error& e) {
    fail(at, e.what());
  }
  return g;
}

}  // namespace deepinfer::app
