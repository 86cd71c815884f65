// Typed access to config.json fields, shared by every architecture's config
// reader (model/<arch>/config.cpp): errors name the file and the field.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/error.h"
#include "core/json.h"

namespace deepinfer::config_fields {

using json = nlohmann::json;

// Typed access to config.json fields with errors naming the file and field.
// A field that is absent or null takes the default (transformers semantics).
class Fields {
 public:
  Fields(const json& object, std::string source, std::string prefix = "")
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool present(const char* key) const {
    auto it = object_.find(key);
    return it != object_.end() && !it->is_null();
  }
  const json* find(const char* key) const {
    auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void bad(const char* key, const char* expected) const {
    auto it = object_.find(key);
    fail(source_, ": field '", prefix_, key, "': expected ", expected,
         it == object_.end() ? std::string(", but it is missing") : ", got " + json_snippet(*it));
  }
  int64_t integer(const char* key, std::optional<int64_t> fallback) const {
    const json* v = find(key);
    if (v == nullptr) {
      if (!fallback) bad(key, "an integer");
      return *fallback;
    }
    if (v->is_number_integer()) return v->get<int64_t>();
    // Some configs spell integers as 2.0; accept exact integral floats only.
    if (v->is_number_float()) {
      double d = v->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
    }
    bad(key, "an integer");
  }
  int small_int(const char* key, std::optional<int64_t> fallback) const {
    int64_t v = integer(key, fallback);
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
      bad(key, "an integer that fits 32 bits");
    return static_cast<int>(v);
  }
  double number(const char* key, std::optional<double> fallback) const {
    const json* v = find(key);
    if (v == nullptr) {
      if (!fallback) bad(key, "a number");
      return *fallback;
    }
    if (!v->is_number()) bad(key, "a number");
    return v->get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) bad(key, "true or false");
    return v->get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) bad(key, "a string");
    return v->get<std::string>();
  }
  const std::string& source() const { return source_; }

 private:
  const json& object_;
  std::string source_;
  std::string prefix_;
};

inline void require(bool ok, const std::string& source, const char* field, const std::string& what) {
  if (!ok) fail(source, ": field '", field, "': ", what);
}

inline std::string str(int64_t v) { return std::to_string(v); }

}  // namespace deepinfer::config_fields
