// Request bodies: JSON parsed with a nesting limit (the lead can swap this one function for
// core/json.h's parse_json(text, what, limits) once that lands). Throws std::invalid_argument
// with a message naming what was wrong.
#pragma once
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

namespace deepinfer::server {

inline constexpr int kMaxJsonDepth = 64;

inline nlohmann::json parse_request_json(std::string_view text, size_t max_bytes) {
  if (text.size() > max_bytes)
    throw std::invalid_argument("request body has " + std::to_string(text.size()) + " bytes, more than " +
                                std::to_string(max_bytes));
  struct TooDeep {};
  try {
    return nlohmann::json::parse(
        text, [](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
          if (depth > kMaxJsonDepth) throw TooDeep{};
          return true;
        });
  } catch (const TooDeep&) {
    throw std::invalid_argument("request body: JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                                " levels");
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("request body is not valid JSON: ") + e.what());
  }
}

// Serializes for the wire: invalid UTF-8 (a model's partial bytes) becomes U+FFFD, never throws.
// U+0085, U+2028 and U+2029 are written as \u escapes: they are valid raw inside JSON strings,
// but line readers that follow str.splitlines() (httpx's aiter_lines, hence many SSE clients)
// split a `data:` line there and then fail to parse either half. Their UTF-8 bytes can only
// occur inside strings (JSON's structure is ASCII), so the escape keeps the same value.
inline std::string dump_json(const nlohmann::json& j) {
  std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.find("\xC2\x85") == std::string::npos && s.find("\xE2\x80\xA8") == std::string::npos &&
      s.find("\xE2\x80\xA9") == std::string::npos)
    return s;
  std::string out;
  out.reserve(s.size() + 16);
  for (size_t i = 0; i < s.size(); ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x85) {
      out += "\\u0085";
      i += 1;
    } else if (b == 0xE2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
               (static_cast<unsigned char>(s[i + 2]) == 0xA8 || static_cast<unsigned char>(s[i + 2]) == 0xA9)) {
      out += static_cast<unsigned char>(s[i + 2]) == 0xA8 ? "\\u2028" : "\\u2029";
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace deepinfer::server
