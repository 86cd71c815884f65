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
inline std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace deepinfer::server
