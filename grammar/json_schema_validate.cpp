// Single-value JSON Schema validation (see json_schema_validate.h). Recursive over the schema;
// depth bounded (recursive $ref on a finite value terminates with the value, but a schema
// may $ref itself without consuming it, so depth is capped).
#include "grammar/json_schema_validate.h"

#include <cmath>
#include <regex>
#include <set>

#include "core/error.h"
#include "core/json.h"

namespace deepinfer::grammar {
namespace {

using json = nlohmann::ordered_json;

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

class Validator {
 public:
  Validator(const json& root, const std::string& path, CompileBudget* budget)
      : root_(root), path_(path), budget_(budget) {}

  bool accepts(const json& s, const json& v, int depth) {
    if (depth > 200) fail("json schema: $ref recursion deeper than 200 while checking enum/const at ", path_);
    if (budget_) budget_->tick("checking enum/const values against their schema");
    if (s.is_boolean()) return s.get<bool>();
    if (!s.is_object()) fail("json schema: a schema must be an object or a boolean at ", path_);
    for (const char* k : {"unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"})
      if (s.contains(k)) fail("json schema: keyword '", k, "' is not supported at ", path_);
    if (s.contains("$ref") && !accepts(resolve(s["$ref"]), v, depth + 1)) return false;
    if (s.value("nullable", false) && v.is_null()) return true;
    if (s.contains("type") && !type_ok(s["type"], v)) return false;
    if (s.contains("const") && s["const"] != v) return false;
    if (s.contains("enum") && !contains(s["enum"], v)) return false;
    if (s.contains("not") && accepts(s["not"], v, depth + 1)) return false;
    if (s.contains("allOf"))
      for (const auto& sub : s["allOf"])
        if (!accepts(sub, v, depth + 1)) return false;
    if (s.contains("anyOf")) {
      bool any = false;
      for (const auto& sub : s["anyOf"]) any = any || accepts(sub, v, depth + 1);
      if (!any) return false;
    }
    if (s.contains("oneOf")) {
      int n = 0;
      for (const auto& sub : s["oneOf"]) n += accepts(sub, v, depth + 1);
      if (n != 1) return false;
    }
    if (s.contains("if")) {
      const char* branch = accepts(s["if"], v, depth + 1) ? "then" : "else";
      if (s.contains(branch) && !accepts(s[branch], v, depth + 1)) return false;
    }
    if (v.is_number()) return number_ok(s, v);
    if (v.is_string()) return string_ok(s, v.get<std::string>());
    if (v.is_array()) return array_ok(s, v, depth);
    if (v.is_object()) return object_ok(s, v, depth);
    return true;
  }

 private:
  const json& resolve(const json& ref) {
    if (!ref.is_string() || ref.get<std::string>().empty() || ref.get<std::string>()[0] != '#')
      fail("json schema: only local $ref ('#...') is supported at ", path_);
    try {
      std::string ptr = ref.get<std::string>().substr(1);
      return ptr.empty() ? root_ : root_.at(json::json_pointer(ptr));
    } catch (const std::exception&) {
      fail("json schema: $ref '", text_snippet(ref.get<std::string>()), "' does not resolve at ", path_);
    }
  }
  static bool contains(const json& list, const json& v) {
    for (const auto& x : list)
      if (x == v) return true;
    return false;
  }
  static bool type_ok(const json& t, const json& v) {
    if (t.is_array()) {
      for (const auto& x : t)
        if (type_ok(x, v)) return true;
      return false;
    }
    const std::string name = t.is_string() ? t.get<std::string>() : "";
    if (name == "integer")
      return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    return (name == "number" && v.is_number()) || (name == "string" && v.is_string()) ||
           (name == "boolean" && v.is_boolean()) || (name == "null" && v.is_null()) ||
           (name == "array" && v.is_array()) || (name == "object" && v.is_object());
  }
  static bool number_ok(const json& s, const json& v) {
    const double x = v.get<double>();
    auto bound = [&](const char* key, const char* draft4_flag, bool is_lo) {
      if (!s.contains(key) || !s[key].is_number()) return true;
      double b = s[key].get<double>();
      bool strict = std::string(key).rfind("exclusive", 0) == 0 || s.value(draft4_flag, json(false)) == json(true);
      return is_lo ? (strict ? x > b : x >= b) : (strict ? x < b : x <= b);
    };
    if (!bound("minimum", "exclusiveMinimum", true) || !bound("exclusiveMinimum", "", true) ||
        !bound("maximum", "exclusiveMaximum", false) || !bound("exclusiveMaximum", "", false))
      return false;
    if (s.contains("multipleOf") && s["multipleOf"].is_number()) {
      const json& k = s["multipleOf"];
      if (k.get<double>() <= 0) fail("json schema: multipleOf must be positive");
      if (k.is_number_integer() && v.is_number_integer()) return v.get<int64_t>() % k.get<int64_t>() == 0;
      if (k.is_number_integer()) return std::fmod(x, k.get<double>()) == 0;
      double q = x / k.get<double>();  // Python jsonschema: int(quotient) == quotient
      return std::isfinite(q) && std::trunc(q) == q;
    }
    return true;
  }
  bool string_ok(const json& s, const std::string& str) {
    size_t n = code_points(str);
    if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return false;
    if (s.contains("pattern") && !search(s["pattern"].get<std::string>(), str)) return false;
    return true;
  }
  bool search(const std::string& pattern, const std::string& str) {
    return ecma_regex_search(ecma_regex(pattern, path_), str, path_);
  }
  bool array_ok(const json& s, const json& v, int depth) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    if (s.value("uniqueItems", false))
      for (size_t i = 0; i < v.size(); ++i)
        for (size_t j = i + 1; j < v.size(); ++j)
          if (v[i] == v[j]) return false;
    const json* prefix = s.contains("prefixItems") ? &s["prefixItems"]
                         : s.contains("items") && s["items"].is_array() ? &s["items"]
                                                                          : nullptr;
    const json* rest = s.contains("prefixItems") ? (s.contains("items") ? &s["items"] : nullptr)
                       : prefix                  ? (s.contains("additionalItems") ? &s["additionalItems"] : nullptr)
                                                 : (s.contains("items") ? &s["items"] : nullptr);
    for (size_t i = 0; i < v.size(); ++i) {
      const json* item = prefix && i < prefix->size() ? &(*prefix)[i] : rest;
      if (item && !accepts(*item, v[i], depth + 1)) return false;
    }
    if (s.contains("contains")) {
      bool any = false;
      for (const auto& x : v) any = any || accepts(s["contains"], x, depth + 1);
      if (!any) return false;
    }
    return true;
  }
  bool object_ok(const json& s, const json& v, int depth) {
    if (s.contains("minProperties") && v.size() < s["minProperties"].get<size_t>()) return false;
    if (s.contains("maxProperties") && v.size() > s["maxProperties"].get<size_t>()) return false;
    if (s.contains("required"))
      for (const auto& r : s["required"])
        if (!v.contains(r.get<std::string>())) return false;
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string& k = it.key();
      bool matched = false;
      if (s.contains("properties") && s["properties"].contains(k)) {
        matched = true;
        if (!accepts(s["properties"][k], it.value(), depth + 1)) return false;
      }
      if (s.contains("patternProperties"))
        for (auto p = s["patternProperties"].begin(); p != s["patternProperties"].end(); ++p)
          if (search(p.key(), k)) {
            matched = true;
            if (!accepts(p.value(), it.value(), depth + 1)) return false;
          }
      if (!matched && s.contains("additionalProperties") && !accepts(s["additionalProperties"], it.value(), depth + 1))
        return false;
      if (s.contains("propertyNames") && !accepts(s["propertyNames"], json(k), depth + 1)) return false;
    }
    for (const char* key : {"dependencies", "dependentRequired", "dependentSchemas"}) {
      if (!s.contains(key)) continue;
      for (auto d = s[key].begin(); d != s[key].end(); ++d) {
        if (!v.contains(d.key())) continue;
        if (d.value().is_array()) {
          for (const auto& r : d.value())
            if (!v.contains(r.get<std::string>())) return false;
        } else if (!accepts(d.value(), v, depth + 1)) {
          return false;
        }
      }
    }
    return true;
  }

  const json& root_;
  const std::string& path_;
  CompileBudget* budget_;
};

}  // namespace

std::regex ecma_regex(const std::string& pattern, const std::string& path) {
  // std::regex compiles groups recursively: bound their nesting as our regex parser does.
  int depth = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\') ++i;
    else if (pattern[i] == '(' && ++depth > 200) fail("json schema: pattern '", text_snippet(pattern), "' nests groups deeper than 200 at ", path);
    else if (pattern[i] == ')') --depth;
  }
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error&) {
    fail("json schema: pattern '", text_snippet(pattern), "' is not a valid regex at ", path);
  }
}

bool ecma_regex_search(const std::regex& re, const std::string& text, const std::string& path) {
  // libstdc++'s matcher recurses once per character: longer strings could overflow the stack.
  if (text.size() > kMaxEcmaRegexInput)
    fail("json schema: a pattern check of a ", text.size(), "-byte string is not supported (at most ", kMaxEcmaRegexInput,
         " bytes) at ", path);
  return std::regex_search(text, re);
}

bool schema_accepts(const json& root, const json& schema, const json& value, const std::string& path,
                    CompileBudget* budget) {
  try {
    return Validator(root, path, budget).accepts(schema, value, 0);
  } catch (const nlohmann::json::exception& e) {  // a keyword of the wrong JSON type
    fail("json schema: malformed keyword while checking enum/const at ", path, ": ", e.what());
  }
}

}  // namespace deepinfer::grammar
