// JSON Schema front-end: a schema (draft 4 .. 2020-12 subset) lowered to GrammarIR.
// Objects list their properties in schema order (optional ones may be skipped); allowed
// additional properties follow the declared ones. Unsupported keywords that constrain the
// language (not, if/then/else, patternProperties, ...) are refused with the JSON path.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "core/error.h"
#include "core/json.h"
#include "grammar/grammar.h"
#include "grammar/json_schema_multiple.h"
#include "grammar/json_schema_number.h"
#include "grammar/json_schema_object.h"
#include "grammar/json_schema_validate.h"
#include "grammar/regex.h"
#include "tokenizer/utf8.h"

namespace deepinfer::grammar {
namespace {

using json = nlohmann::ordered_json;

class SchemaCompiler {
 public:
  SchemaCompiler(const json& root, bool any_ws, CompileBudget& budget)
      : root_(root), any_ws_(any_ws), budget_(budget) {
    ir_.set_budget(&budget);
  }

  GrammarIR run() {
    try {
      int32_t top = ir_.add_rule("root");
      ir_.set_root(top);
      ir_.set_body(top, ir_.seq({ws(), compile(root_, "#", 0), ws()}));
      // $ref targets, compiled here rather than where they are met so that a chain of $refs
      // is not a chain of nested calls (each body may add more).
      while (!pending_refs_.empty()) {
        auto [rule, ref] = std::move(pending_refs_.back());
        pending_refs_.pop_back();
        ir_.set_body(rule, compile(resolve(ref, ref), ref, 0));
      }
    } catch (const GrammarBudgetError& e) {
      if (e.located()) throw;
      throw GrammarBudgetError(detail::concat("json schema: ", e.cause(), " (compiling ", shown(where_), ")"), true);
    }
    return std::move(ir_);
  }

  GrammarIR any_object() {
    int32_t top = ir_.add_rule("root");
    ir_.set_root(top);
    ir_.set_body(top, ir_.seq({ws(), ir_.ref(object_rule()), ws()}));
    return std::move(ir_);
  }

 private:
  // A JSON path as messages show it (keys are user input: bounded).
  static std::string shown(const std::string& path) { return text_snippet(path, 200); }
  [[noreturn]] static void refuse(const std::string& path, const std::string& what) {
    fail("json schema: ", what, " at ", shown(path));
  }

  int32_t ws() {
    if (!any_ws_) return ir_.empty();
    return ir_.star(ir_.byte_ranges({{' ', ' '}, {'\t', '\t'}, {'\n', '\n'}, {'\r', '\r'}}));
  }
  int32_t lit(const std::string& s) { return ir_.literal(s); }

  int32_t shared(const std::string& name, int32_t* slot, auto&& body) {
    if (*slot < 0) {
      *slot = ir_.add_rule(name);
      ir_.set_body(*slot, body());
    }
    return *slot;
  }

  int32_t string_rule() {
    return shared("string", &string_rule_, [&] {
      int32_t plain = ir_.char_ranges(complement_ranges({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}, 0x10FFFF));
      int32_t hex = ir_.byte_ranges({{'0', '9'}, {'a', 'f'}, {'A', 'F'}});
      int32_t esc = ir_.seq({lit("\\"), ir_.alt({ir_.byte_ranges({{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', 'b'},
                                                                  {'f', 'f'}, {'n', 'n'}, {'r', 'r'}, {'t', 't'}}),
                                                 ir_.seq({lit("u"), ir_.repeat(hex, 4, 4)})})});
      return ir_.seq({lit("\""), ir_.star(ir_.alt({plain, esc})), lit("\"")});
    });
  }
  // One JSON string character, inlined (not a rule): a rule would end after every character
  // and make most tokens depend on the caller.
  int32_t string_char() {
    int32_t plain = ir_.char_ranges(complement_ranges({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}, 0x10FFFF));
    int32_t hex = ir_.byte_ranges({{'0', '9'}, {'a', 'f'}, {'A', 'F'}});
    int32_t esc = ir_.seq({lit("\\"), ir_.alt({ir_.byte_ranges({{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', 'b'},
                                                                {'f', 'f'}, {'n', 'n'}, {'r', 'r'}, {'t', 't'}}),
                                               ir_.seq({lit("u"), ir_.repeat(hex, 4, 4)})})});
    return ir_.alt({plain, esc});
  }
  int32_t digits() { return ir_.plus(ir_.byte_ranges({{'0', '9'}})); }
  int32_t int_body() {
    return ir_.alt({lit("0"), ir_.seq({ir_.byte_ranges({{'1', '9'}}), ir_.star(ir_.byte_ranges({{'0', '9'}}))})});
  }
  int32_t frac_exp() {
    return ir_.seq({ir_.opt(ir_.seq({lit("."), digits()})),
                    ir_.opt(ir_.seq({ir_.byte_ranges({{'e', 'e'}, {'E', 'E'}}), ir_.opt(ir_.byte_ranges({{'+', '+'}, {'-', '-'}})), digits()}))});
  }
  int32_t number_rule() {
    return shared("number", &number_rule_, [&] { return ir_.seq({ir_.opt(lit("-")), int_body(), frac_exp()}); });
  }
  int32_t integer_rule() {
    return shared("integer", &integer_rule_, [&] { return ir_.seq({ir_.opt(lit("-")), int_body()}); });
  }
  int32_t value_rule() {
    if (value_rule_ < 0) {
      value_rule_ = ir_.add_rule("value");
      ir_.set_body(value_rule_, ir_.alt({ir_.ref(object_rule()), ir_.ref(array_rule()), ir_.ref(string_rule()),
                                         ir_.ref(number_rule()), lit("true"), lit("false"), lit("null")}));
    }
    return value_rule_;
  }
  int32_t object_rule() {
    if (object_rule_ < 0) {
      object_rule_ = ir_.add_rule("object");
      int32_t member = ir_.seq({ir_.ref(string_rule()), ws(), lit(":"), ws(), ir_.ref(value_rule())});
      int32_t more = ir_.star(ir_.seq({ws(), lit(","), ws(), member}));
      ir_.set_body(object_rule_, ir_.seq({lit("{"), ws(), ir_.opt(ir_.seq({member, more})), ws(), lit("}")}));
    }
    return object_rule_;
  }
  int32_t array_rule() {
    if (array_rule_ < 0) {
      array_rule_ = ir_.add_rule("array");
      int32_t v = ir_.ref(value_rule());
      int32_t more = ir_.star(ir_.seq({ws(), lit(","), ws(), ir_.ref(value_rule())}));
      ir_.set_body(array_rule_, ir_.seq({lit("["), ws(), ir_.opt(ir_.seq({v, more})), ws(), lit("]")}));
    }
    return array_rule_;
  }

  // An exact JSON value (enum/const), whitespace allowed between its tokens. Adds the bytes
  // of its literals to *spelled. Recursion depth is the value's, bounded by the JSON reader.
  int32_t literal_value(const json& v, int64_t* spelled) {
    auto text = [&](const std::string& t) {
      *spelled += static_cast<int64_t>(t.size());
      return lit(t);
    };
    if (v.is_object()) {
      std::vector<int32_t> parts{text("{"), ws()};
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) parts.insert(parts.end(), {ws(), text(","), ws()});
        first = false;
        parts.insert(parts.end(), {text(json(it.key()).dump()), ws(), lit(":"), ws(), literal_value(it.value(), spelled)});
      }
      parts.insert(parts.end(), {ws(), text("}")});
      return ir_.seq(std::move(parts));
    }
    if (v.is_array()) {
      std::vector<int32_t> parts{text("["), ws()};
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) parts.insert(parts.end(), {ws(), text(","), ws()});
        parts.push_back(literal_value(v[i], spelled));
      }
      parts.insert(parts.end(), {ws(), text("]")});
      return ir_.seq(std::move(parts));
    }
    if (v.is_number_integer())  // 2 and 2.0 are the same JSON number
      return ir_.seq({text(v.dump()), ir_.opt(ir_.seq({lit("."), ir_.plus(lit("0"))}))});
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e15) {
        // 2.0 and 2 are the same JSON number.
        std::string i = json(static_cast<int64_t>(d)).dump();
        return ir_.seq({text(i), ir_.opt(ir_.seq({lit("."), ir_.plus(lit("0"))}))});
      }
    }
    return text(v.dump());
  }

  const json& resolve(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#') refuse(path, "only local $ref ('#...') is supported, got '" + text_snippet(ref) + "'");
    std::string ptr = ref.substr(1);
    try {
      return ptr.empty() ? root_ : root_.at(json::json_pointer(ptr));
    } catch (const std::exception&) {
      refuse(path, "$ref '" + text_snippet(ref) + "' does not resolve");
    }
  }

  // Merges two schemas for allOf (and sibling keywords of anyOf/oneOf/$ref).
  json merge(const json& a, const json& b, const std::string& path, int depth) {
    if (depth > 32) refuse(path, "allOf/$ref merge nested too deeply");
    if (a.is_boolean()) return a.get<bool>() ? b : a;
    if (b.is_boolean()) return b.get<bool>() ? a : b;
    json out = a;
    if (out.contains("$ref")) {
      json r = resolve(out["$ref"].get<std::string>(), path);
      out.erase("$ref");
      out = merge(r, out, path, depth + 1);
    }
    json bb = b;
    if (bb.contains("$ref")) {
      json r = resolve(bb["$ref"].get<std::string>(), path);
      bb.erase("$ref");
      bb = merge(r, bb, path, depth + 1);
    }
    if (bb.contains("allOf")) {
      json acc = json::object();
      for (const auto& s : bb["allOf"]) acc = merge(acc, s, path, depth + 1);
      bb.erase("allOf");
      bb = merge(bb, acc, path, depth + 1);
    }
    for (auto it = bb.begin(); it != bb.end(); ++it) {
      const std::string& k = it.key();
      if (!out.contains(k)) {
        out[k] = it.value();
      } else if (k == "properties") {
        for (auto p = it.value().begin(); p != it.value().end(); ++p)
          out[k][p.key()] = out[k].contains(p.key()) ? merge(out[k][p.key()], p.value(), path, depth + 1) : p.value();
      } else if (k == "required") {
        std::set<std::string> have;
        for (const auto& r : out[k]) have.insert(r.get<std::string>());
        for (const auto& r : it.value())
          if (!have.count(r.get<std::string>())) out[k].push_back(r);
      } else if (k == "type") {
        auto as_set = [](const json& t) {
          std::set<std::string> s;
          if (t.is_string()) s.insert(t.get<std::string>());
          else
            for (const auto& x : t) s.insert(x.get<std::string>());
          if (s.count("number")) s.insert("integer");
          return s;
        };
        std::set<std::string> x = as_set(out[k]), y = as_set(it.value()), both;
        for (const auto& t : x)
          if (y.count(t)) both.insert(t);
        if (both.count("number") && !(as_set(out[k]).count("number") && as_set(it.value()).count("number")))
          both.erase("number");
        if (both.empty()) refuse(path, "allOf with disjoint types");
        out[k] = json(std::vector<std::string>(both.begin(), both.end()));
      } else if (k == "minimum" || k == "minLength" || k == "minItems" || k == "exclusiveMinimum") {
        out[k] = std::max(out[k], it.value());
      } else if (k == "maximum" || k == "maxLength" || k == "maxItems" || k == "exclusiveMaximum") {
        out[k] = std::min(out[k], it.value());
      } else if (k == "enum" && out[k].is_array() && it.value().is_array()) {
        json both = json::array();  // both lists must hold: their intersection (JSON equality)
        for (const auto& v : out[k])
          if (std::find(it.value().begin(), it.value().end(), v) != it.value().end()) both.push_back(v);
        if (both.empty()) refuse(path, "allOf with enums that share no value");
        out[k] = both;
      } else if (k == "title" || k == "description" || k == "default" || k == "examples" || k == "$comment") {
      } else if (out[k] != it.value()) {
        refuse(path, "allOf with conflicting '" + k + "'");
      }
    }
    return out;
  }

  static bool is_annotation_only(const json& s) {
    static const std::set<std::string> kAnnot = {"title", "description", "default", "examples", "$comment",
                                                  "$schema", "$id", "id", "deprecated", "readOnly", "writeOnly"};
    for (auto it = s.begin(); it != s.end(); ++it)
      if (!kAnnot.count(it.key()) && it.key() != "$ref" && it.key() != "$defs" && it.key() != "definitions")
        return false;
    return true;
  }

  // compile_schema, remembering where it is for budget errors (left at the innermost schema
  // when one propagates).
  int32_t compile(const json& s, const std::string& path, int depth) {
    where_ = path;
    budget_.check_time("compiling the JSON Schema");
    const int32_t e = compile_schema(s, path, depth);
    where_ = path;
    return e;
  }

  int32_t compile_schema(const json& s, const std::string& path, int depth) {
    const int32_t max_depth = budget_.limits().max_schema_depth;
    if (depth > max_depth)
      refuse(path, "schema nested too deeply (more than " + std::to_string(max_depth) +
                       " levels without $ref, CompileLimits::max_schema_depth)");
    if (s.is_boolean()) return s.get<bool>() ? ir_.ref(value_rule()) : ir_.nothing();
    if (!s.is_object()) refuse(path, "a schema must be an object or a boolean");
    if (const json* values = finite_values(s, path)) {
      // enum/const: the listed values the whole schema accepts (exact for every keyword
      // beside them: not, oneOf, bounds, ...).
      // The list's own membership test is skipped (quadratic in long enums).
      const json rest = s.contains("const") ? without_key(s, "const") : s.contains("enum") ? without_key(s, "enum") : s;
      const size_t num_values = values != &s ? values->size() : s.contains("const") ? 1 : s["enum"].size();
      const std::string where = path + (s.contains("const") ? "/const" : "/enum");
      std::vector<int32_t> alts;
      // Each byte the values spell is an automaton node: refuse an enum past the node limit
      // here, naming it, before it is built.
      int64_t spelled = 0;
      auto add = [&](const json& v) {
        budget_.check_time("compiling the values of an enum/const");
        if (!schema_accepts(root_, rest, v, path, &budget_)) return;
        alts.push_back(literal_value(v, &spelled));
        if (spelled > budget_.limits().max_nfa_nodes)
          refuse(where, "enum/const values too large: the " + std::to_string(alts.size()) + " kept of " +
                            std::to_string(num_values) + " spell more than " +
                            std::to_string(budget_.limits().max_nfa_nodes) +
                            " bytes, one automaton node each (CompileLimits::max_nfa_nodes)");
      };
      if (values == &s) {  // const, or enum at this level
        if (s.contains("const")) add(s["const"]);
        else
          for (const auto& v : s["enum"]) add(v);
      } else {
        for (const auto& v : *values) add(v);
      }
      if (s.value("nullable", false)) add(json(nullptr));
      return alts.empty() ? ir_.nothing() : ir_.alt(std::move(alts));  // none: no value matches
    }
    if (s.contains("not") || (s.contains("oneOf") && presence_only(s["oneOf"])))
      return compile(lower_not(s, path), path, depth + 1);
    static const char* kRefused[] = {"if", "then", "else", "propertyNames", "contains",
                                     "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"};
    for (const char* k : kRefused)
      if (s.contains(k)) refuse(path, std::string("keyword '") + k + "' is not supported");
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) refuse(path, "$ref must be a string");
      std::string ref = s["$ref"].get<std::string>();
      if (is_annotation_only(s)) {
        auto it = ref_rules_.find(ref);
        if (it != ref_rules_.end()) return ir_.ref(it->second);
        resolve(ref, path);  // refused here, at the referring path, when it does not resolve
        int32_t rule = ir_.add_rule(ref);
        ref_rules_[ref] = rule;
        pending_refs_.push_back({rule, ref});
        return ir_.ref(rule);
      }
      json rest = s;
      rest.erase("$ref");
      return compile(merge(resolve(ref, path), rest, path, 0), path, depth + 1);
    }
    if (s.contains("allOf")) {
      if (!s["allOf"].is_array()) refuse(path + "/allOf", "allOf must be an array");
      json rest = s;
      rest.erase("allOf");
      json acc = rest;
      for (const auto& sub : s["allOf"]) acc = merge(acc, sub, path + "/allOf", 0);
      return compile(acc, path, depth + 1);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      if (!s[key].is_array() || s[key].empty()) refuse(path + "/" + key, std::string(key) + " must be a non-empty array");
      json rest = s;
      rest.erase(key);
      std::vector<int32_t> alts;
      for (size_t i = 0; i < s[key].size(); ++i) {
        std::string p = path + "/" + key + "/" + std::to_string(i);
        alts.push_back(rest.empty() || is_annotation_only(rest) ? compile(s[key][i], p, depth + 1)
                                                                : compile(merge(rest, s[key][i], p, 0), p, depth + 1));
      }
      return ir_.alt(std::move(alts));
    }
    int32_t nullable = s.value("nullable", false) ? lit("null") : -1;
    auto with_null = [&](int32_t e) { return nullable >= 0 ? ir_.alt({e, nullable}) : e; };
    std::vector<std::string> types;
    if (s.contains("type")) {
      if (s["type"].is_string()) types.push_back(s["type"].get<std::string>());
      else if (s["type"].is_array())
        for (const auto& t : s["type"]) types.push_back(t.is_string() ? t.get<std::string>() : "");
      else
        refuse(path + "/type", "type must be a string or an array of strings");
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required") ||
               s.contains("patternProperties")) {
      types = {"object"};
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) {
      types = {"array"};
    } else if (s.contains("pattern") || s.contains("format") || s.contains("minLength") || s.contains("maxLength")) {
      types = {"string"};
    } else if (s.contains("$presence") || s.contains("minProperties") || s.contains("maxProperties") ||
               s.contains("dependencies") || s.contains("dependentRequired") || s.contains("dependentSchemas")) {
      types = {"object"};
    } else if (s.contains("$not_types") || s.contains("$not_strings") || s.contains("multipleOf") || s.contains("minimum") ||
               s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum")) {
      // Numeric keywords constrain numbers only; other values pass.
      types = {"null", "boolean", "object", "array", "string", "number"};
    } else {
      return ir_.ref(value_rule());
    }
    if (s.contains("$presence")) {  // not/oneOf over `required`: only objects (lower_not)
      bool has_object = std::find(types.begin(), types.end(), "object") != types.end();
      types.assign(has_object ? 1 : 0, "object");
    }
    if (s.contains("$not_types")) types = remove_types(types, s["$not_types"], path);
    if (types.empty()) refuse(path, "no type is left after 'not': no value matches");
    std::vector<int32_t> alts;
    for (const auto& t : types) alts.push_back(compile_type(s, t, path, depth));
    return with_null(ir_.alt(std::move(alts)));
  }

  // Where the values of `const` / `enum` are: `&s` when at this level (s["const"] or the
  // array s["enum"]), else the enum array or const value of a direct allOf member, or null.
  // (OpenAPI `nullable` adds null: the caller adds it.) No copy: enums may be long.
  const json* finite_values(const json& s, const std::string& path) {
    const json* found = &s;
    if (!s.contains("const") && !s.contains("enum")) {
      found = nullptr;
      if (s.contains("allOf") && s["allOf"].is_array())
        for (const auto& sub : s["allOf"])
          if (sub.is_object() && (sub.contains("const") || sub.contains("enum"))) found = &sub;
      if (!found) return nullptr;
    }
    if (!found->contains("const") && (!(*found)["enum"].is_array() || (*found)["enum"].empty()))
      refuse(path + "/enum", "enum must be a non-empty array");
    if (found == &s) return &s;
    if (found->contains("const")) {
      allof_const_ = json::array({(*found)["const"]});
      return &allof_const_;
    }
    return &(*found)["enum"];
  }

  // A list of schemas that only constrain which properties are present (presence_formula).
  static bool presence_only(const json& list) {
    if (!list.is_array() || list.empty()) return false;
    std::vector<std::string> names;
    PresenceFormula f;
    for (const auto& sub : list)
      if (!presence_formula(sub, &names, &f)) return false;
    return true;
  }

  // Rewrites `not` (and oneOf over `required` only) into internal keys compile() reads:
  // "$presence" (schemas over property presence that must hold; objects only) and
  // "$not_types" (types excluded). Other forms of `not` are refused.
  json lower_not(const json& s, const std::string& path) {
    json t = s;
    json presence = t.contains("$presence") ? t["$presence"] : json::array();
    auto add_presence = [&](json sub, const char* what) {
      std::vector<std::string> names;
      PresenceFormula f;
      presence_formula(sub, &names, &f);
      if (holds_for_non_objects(f))
        refuse(path, std::string(what) + " over 'required' that non-objects satisfy is not supported");
      presence.push_back(std::move(sub));
    };
    if (t.contains("oneOf") && presence_only(t["oneOf"])) {
      add_presence(json{{"oneOf", t["oneOf"]}}, "oneOf");
      t.erase("oneOf");
    }
    if (t.contains("not")) {
      const json n = t["not"];
      t.erase("not");
      std::vector<std::string> names;
      PresenceFormula f;
      if (n.is_boolean()) {
        if (n.get<bool>()) refuse(path + "/not", "'not: true': no value matches");
      } else if (presence_formula(n, &names, &f)) {
        add_presence(json{{"not", n}}, "not");
      } else if (n.is_object() && (n.contains("enum") || n.contains("const")) &&
                 only_annotations(without(without(n, "enum"), "const")) && all_strings(n)) {
        json excluded = t.contains("$not_strings") ? t["$not_strings"] : json::array();
        for (const auto& x : n.contains("const") ? json::array({n["const"]}) : n["enum"]) excluded.push_back(x);
        t["$not_strings"] = excluded;
      } else if (n.is_object() && n.contains("type") && only_annotations(without(n, "type"))) {
        json excluded = t.contains("$not_types") ? t["$not_types"] : json::array();
        for (const auto& x : n["type"].is_array() ? n["type"] : json::array({n["type"]})) excluded.push_back(x);
        t["$not_types"] = excluded;
      } else {
        refuse(path + "/not", "'not' is supported only over 'type', over an enum/const of strings, over 'required' "
                              "(with allOf/anyOf/oneOf/not), or beside enum/const");
      }
    }
    if (!presence.empty()) t["$presence"] = presence;
    return t;
  }
  static bool all_strings(const json& n) {
    if (n.contains("const")) return n["const"].is_string() && !n.contains("enum");
    if (!n["enum"].is_array() || n["enum"].empty()) return false;
    for (const auto& x : n["enum"])
      if (!x.is_string()) return false;
    return true;
  }
  static bool only_annotations(const json& s) {
    for (auto it = s.begin(); it != s.end(); ++it)
      if (it.key() != "title" && it.key() != "description" && it.key() != "$comment") return false;
    return true;
  }
  static json without(json s, const char* key) {
    s.erase(key);
    return s;
  }
  // s less one key, without copying that key's value (an enum may be long) and in time linear
  // in s (ordered_json's own insert searches every key).
  static json without_key(const json& s, const char* key) {
    json out = json::object();
    auto& members = static_cast<json::object_t::Container&>(out.get_ref<json::object_t&>());
    for (auto it = s.begin(); it != s.end(); ++it)
      if (it.key() != key) members.emplace_back(it.key(), it.value());
    return out;
  }
  // types minus the excluded ones; "number" excluded removes "integer" too; excluding only
  // "integer" from "number" (non-integral numbers) is refused.
  std::vector<std::string> remove_types(const std::vector<std::string>& types, const json& excluded,
                                        const std::string& path) {
    std::set<std::string> out_of;
    for (const auto& x : excluded) {
      if (!x.is_string()) refuse(path + "/not/type", "type must be a string or an array of strings");
      out_of.insert(x.get<std::string>());
    }
    if (out_of.count("number")) out_of.insert("integer");
    std::vector<std::string> kept;
    for (const auto& t : types) {
      if (t == "number" && out_of.count("integer") && !out_of.count("number"))
        refuse(path + "/not", "'not: {type: integer}' beside type number (non-integral numbers) is not supported");
      if (!out_of.count(t)) kept.push_back(t);
    }
    return kept;
  }

  int32_t compile_type(const json& s, const std::string& t, const std::string& path, int depth) {
    if (t == "null") return lit("null");
    if (t == "boolean") return ir_.alt({lit("true"), lit("false")});
    if (t == "string") return compile_string(s, path);
    if (t == "integer" || t == "number") return compile_number(s, t == "integer", path);
    if (t == "object") return compile_object(s, path, depth);
    if (t == "array") return compile_array(s, path, depth);
    refuse(path + "/type", "unknown type '" + t + "'");
  }

  // A JSON string containing a match of `pattern` (anchored where it says so). With length
  // bounds (code points) they must be implied by the pattern's own length range, or the
  // anchored pattern restricted to them exactly by parse_regex (a grammar cannot intersect
  // the two in general); otherwise refused.
  int32_t pattern_string(const std::string& pattern, const std::string& path, int64_t min_chars = 0,
                         int64_t max_chars = -1) {
    RegexResult r = parse_regex(ir_, pattern, true, "json schema: pattern at " + path, min_chars, max_chars);
    const bool bounded = r.anchored_start && r.anchored_end && r.max_chars >= 0;
    if (r.min_chars < min_chars || (max_chars >= 0 && !(bounded && r.max_chars <= max_chars)))
      refuse(path, "minLength/maxLength (" + std::to_string(min_chars) + ".." +
                       (max_chars < 0 ? std::string("") : std::to_string(max_chars)) +
                       ") beside a pattern whose lengths they do not contain is not supported");
    int32_t any = ir_.star(string_char());
    return ir_.seq({lit("\""), r.anchored_start ? ir_.empty() : any, r.expr, r.anchored_end ? ir_.empty() : any,
                    lit("\"")});
  }

  // Regexes of the supported `format`s: RFC 3339 full-date/full-time (days per month and leap
  // years exact; year 0000 and the leap second :60 left out, as most validators reject them),
  // RFC 5321 dot-atom email with RFC 1123 domain labels, RFC 4122 uuid, RFC 3986 URI (no
  // IP-literal hosts), RFC 791 ipv4, RFC 1123 hostname. Not enforced (documented): the
  // 253-byte total length of hostnames and email domains.
  static std::map<std::string, std::string> format_regexes() {
    const std::string year = "([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])";
    const std::string leap_year = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)";
    const std::string date = "(" + year + "-(0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|" + year +
                             "-(0[469]|11)-(0[1-9]|[12][0-9]|30)|" + year + "-02-(0[1-9]|1[0-9]|2[0-8])|" + leap_year +
                             "-02-29)";
    const std::string time = R"(([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))";
    const std::string label = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
    const std::string pct = "%[0-9A-Fa-f]{2}";
    const std::string pchar = "([A-Za-z0-9._~!$&'()*+,;=:@-]|" + pct + ")";
    const std::string authority =
        "(([A-Za-z0-9._~!$&'()*+,;=:-]|" + pct + ")*@)?([A-Za-z0-9._~!$&'()*+,;=-]|" + pct + ")*(:[0-9]*)?";
    const std::string segments = "(/" + pchar + "*)*";
    const std::string octet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
    return {
        {"date", "^" + date + "$"},
        {"time", "^" + time + "$"},
        {"date-time", "^" + date + "[Tt]" + time + "$"},
        {"email", "^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@" + label + "(\\." + label + ")+$"},
        {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
        {"uri", "^[A-Za-z][A-Za-z0-9+.-]*:(//" + authority + segments + "|/(" + pchar + "+" + segments + ")?|" + pchar +
                    "+" + segments + ")?(\\?(" + pchar + "|[/?])*)?(#(" + pchar + "|[/?])*)?$"},
        {"ipv4", "^(" + octet + "\\.){3}" + octet + "$"},
        {"hostname", "^" + label + "(\\." + label + ")*$"},
    };
  }

  int32_t compile_string(const json& s, const std::string& path) {
    static const std::map<std::string, std::string> kFormats = format_regexes();
    bool has_len = s.contains("minLength") || s.contains("maxLength");
    if (s.contains("$not_strings")) {
      if (s.contains("pattern") || (s.contains("format") && s["format"].is_string() && kFormats.count(s["format"].get<std::string>())))
        refuse(path + "/not", "'not' over strings beside pattern/format is not supported");
      int64_t lo = s.value("minLength", int64_t{0}), hi = s.contains("maxLength") ? s["maxLength"].get<int64_t>() : -1;
      if (lo < 0 || (hi >= 0 && hi < lo) || lo > 4096) refuse(path, "invalid or too large minLength/maxLength");
      if (hi > 2048) hi = std::max<int64_t>(lo, 2048);  // as below
      std::vector<std::u32string> excluded;
      for (const auto& x : s["$not_strings"]) {
        const std::string& bytes = x.get_ref<const std::string&>();
        std::u32string cps;
        for (size_t i = 0, n = 0; i < bytes.size(); i += n) cps.push_back(tokenizer_detail::decode_code_point(bytes, i, n));
        excluded.push_back(std::move(cps));
      }
      return excluded_strings(excluded, lo, hi);
    }
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) refuse(path + "/pattern", "pattern must be a string");
      return pattern_string(s["pattern"].get<std::string>(), path + "/pattern", s.value("minLength", int64_t{0}),
                            s.contains("maxLength") ? s["maxLength"].get<int64_t>() : -1);
    }
    if (s.contains("format") && s["format"].is_string()) {
      auto it = kFormats.find(s["format"].get<std::string>());
      if (it != kFormats.end()) {
        return pattern_string(it->second, path + "/format", s.value("minLength", int64_t{0}),
                              s.contains("maxLength") ? s["maxLength"].get<int64_t>() : -1);
      }
    }
    if (!has_len) return ir_.ref(string_rule());
    int64_t lo = s.value("minLength", int64_t{0}), hi = s.contains("maxLength") ? s["maxLength"].get<int64_t>() : -1;
    if (lo < 0 || (hi >= 0 && hi < lo)) refuse(path, "invalid minLength/maxLength");
    if (lo > 4096) refuse(path, "minLength above 4096 is not supported (grammar size)");
    // maxLength above 2048 is capped at 2048 (grammar size: ~20 automaton states per
    // character, CompileLimits' 60000): longer valid strings are not generated (documented
    // under-approximation), never invalid ones.
    if (hi > 2048) hi = std::max<int64_t>(lo, 2048);
    return ir_.seq({lit("\""), ir_.repeat(string_char(), static_cast<int32_t>(lo),
                                          hi < 0 ? GrammarIR::kUnbounded : static_cast<int32_t>(hi)),
                    lit("\"")});
  }

  int32_t compile_number(const json& s, bool integer, const std::string& path) {
    // multipleOf k (integral k): only integers are generated, for `number` too (documented
    // under-approximation: "4.0", "1e2" are left out), so bounds round as for integers.
    int64_t step = 0;
    if (s.contains("multipleOf")) {
      const json& m = s["multipleOf"];
      if (!m.is_number() || m.get<double>() <= 0) refuse(path + "/multipleOf", "must be a positive number");
      double k = m.get<double>();
      if (k != std::floor(k) || k > 1e6)
        refuse(path + "/multipleOf", "a fractional step is not supported (validators divide in binary floating "
                                     "point: jsonschema rejects 0.07 for multipleOf 0.01)");
      step = static_cast<int64_t>(k);
      integer = true;
    }
    bool has_lo = false, has_hi = false;
    double lo = 0, hi = 0;
    auto bound = [&](const char* key, bool is_lo, bool exclusive) {
      if (!s.contains(key)) return;
      const json& v = s[key];
      if (v.is_boolean()) return;  // draft-4 exclusiveMinimum: true (handled with minimum)
      if (!v.is_number()) refuse(path + "/" + key, "must be a number");
      double x = v.get<double>();
      bool excl = exclusive || (s.value(is_lo ? "exclusiveMinimum" : "exclusiveMaximum", json(false)) == json(true));
      if (integer) x = is_lo ? (excl ? std::floor(x) + 1 : std::ceil(x)) : (excl ? std::ceil(x) - 1 : std::floor(x));
      if (is_lo) {
        lo = has_lo ? std::max(lo, x) : x;
        has_lo = true;
      } else {
        hi = has_hi ? std::min(hi, x) : x;
        has_hi = true;
      }
    };
    bound("minimum", true, false);
    bound("exclusiveMinimum", true, true);
    bound("maximum", false, false);
    bound("exclusiveMaximum", false, true);
    if (std::fabs(lo) > 1e18 || std::fabs(hi) > 1e18) refuse(path, "numeric bound beyond 1e18 is not supported");
    if (step > 1)
      return integer_multiples(ir_, step, has_lo ? std::optional<int64_t>(static_cast<int64_t>(lo)) : std::nullopt,
                               has_hi ? std::optional<int64_t>(static_cast<int64_t>(hi)) : std::nullopt, path);
    if (!has_lo && !has_hi) return ir_.ref(integer ? integer_rule() : number_rule());
    if (!integer) return bounded_decimal(ir_, s, path);
    if (has_lo && has_hi && lo > hi) refuse(path, "minimum above maximum: no number matches");
    return bounded_integer(ir_, has_lo ? std::optional<int64_t>(static_cast<int64_t>(lo)) : std::nullopt,
                           has_hi ? std::optional<int64_t>(static_cast<int64_t>(hi)) : std::nullopt);
  }


  // patternProperties, one pattern P with schema S. Matching every key (".*", "^.*$", ""):
  // declared properties get allOf(their schema, S), every other key S (additionalProperties
  // never applies). Otherwise no declared or required name may match P (checked with
  // std::regex, ECMAScript like JSON Schema), extra keys are the JSON strings matching P with
  // value S; with additionalProperties false that is exact, otherwise keys matching no pattern
  // are not generated (documented under-approximation). Several patterns are refused.
  struct PatternProps {
    const json* schema = nullptr;
    std::string pattern;
    bool match_all = false;
  };
  PatternProps pattern_properties(const json& s, const std::string& path, const std::set<std::string>& required) {
    PatternProps out;
    if (!s.contains("patternProperties")) return out;
    const json& pp = s["patternProperties"];
    if (!pp.is_object()) refuse(path + "/patternProperties", "patternProperties must be an object");
    if (pp.empty()) return out;
    if (pp.size() > 1) refuse(path + "/patternProperties", "patternProperties with more than one pattern is not supported");
    out.pattern = pp.begin().key();
    out.schema = &pp.begin().value();
    out.match_all = out.pattern == ".*" || out.pattern == "^.*$" || out.pattern == "^.*" || out.pattern.empty();
    if (out.match_all) return out;
    const std::regex re = ecma_regex(out.pattern, path + "/patternProperties");
    std::vector<std::string> names(required.begin(), required.end());
    if (s.contains("properties") && s["properties"].is_object())
      for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) names.push_back(it.key());
    for (const auto& n : names)
      if (ecma_regex_search(re, n, path + "/patternProperties"))
        refuse(path + "/patternProperties", "property '" + text_snippet(n) + "' matches patternProperties pattern '" +
                                                text_snippet(out.pattern) + "' (both schemas would apply): not supported");
    return out;
  }

  // Presence constraints of an object schema: `dependencies` / `dependentRequired` (and
  // dependentSchemas whose schemas only list `required`), "$presence" (lower_not),
  // min/maxProperties. Formulas' leaves index `names`.
  PresenceRules presence_rules(const json& s, const std::string& path, std::vector<std::string>* names) {
    PresenceRules rules;
    for (const char* k : {"minProperties", "maxProperties"}) {
      if (!s.contains(k)) continue;
      if (!s[k].is_number_integer() || s[k].get<int64_t>() < 0) refuse(path + "/" + k, "must be a non-negative integer");
      (k[1] == 'i' ? rules.min_members : rules.max_members) = s[k].get<int64_t>();
    }
    auto name_leaf = [&](const json& n, const std::string& where) {
      if (!n.is_string()) refuse(where, "property names must be strings");
      std::vector<std::string> one{n.get<std::string>()};
      PresenceFormula f;
      presence_formula(json{{"required", one}}, names, &f);
      return f.children.at(0).children.at(0);
    };
    for (const char* k : {"dependencies", "dependentRequired", "dependentSchemas"}) {
      if (!s.contains(k)) continue;
      if (!s[k].is_object()) refuse(path + "/" + k, std::string(k) + " must be an object");
      for (auto it = s[k].begin(); it != s[k].end(); ++it) {
        const std::string where = path + "/" + k + "/" + it.key();
        // key present => the dependency holds: Any(Not(Has key), dependency).
        PresenceFormula implied{PresenceFormula::Kind::Any, -1, {}};
        PresenceFormula absent{PresenceFormula::Kind::Not, -1, {name_leaf(json(it.key()), where)}};
        PresenceFormula then;
        if (it.value().is_array() && std::string(k) != "dependentSchemas") {
          for (const auto& r : it.value()) then.children.push_back(name_leaf(r, where));
        } else if (it.value().is_boolean()) {
          if (it.value().get<bool>()) continue;
          then.kind = PresenceFormula::Kind::Any;  // false: the key may not be present
        } else if (std::string(k) == "dependentRequired" || !presence_formula(it.value(), names, &then)) {
          refuse(where, "a dependency schema is supported only when it lists 'required' properties");
        }
        implied.children = {absent, then};
        rules.constraints.push_back(implied);
      }
    }
    if (s.contains("$presence"))
      for (const auto& sub : s["$presence"]) {
        rules.constraints.emplace_back();
        presence_formula(sub, names, &rules.constraints.back());
      }
    return rules;
  }

  int32_t compile_object(const json& s, const std::string& path, int depth) {
    std::vector<std::pair<std::string, int32_t>> props;  // key literal, value expr
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) refuse(path + "/required", "required must be an array");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) refuse(path + "/required", "required entries must be strings");
        required.insert(r.get<std::string>());
      }
    }
    std::vector<std::string> names;  // properties named by presence constraints
    PresenceRules rules = presence_rules(s, path, &names);
    std::set<std::string> mentioned(required.begin(), required.end());
    mentioned.insert(names.begin(), names.end());
    std::vector<ObjectMembers::Presence> presence;
    const PatternProps pat = pattern_properties(s, path, mentioned);
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) refuse(path + "/properties", "properties must be an object");
      for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
        // With a match-all pattern a declared property must satisfy both schemas.
        int32_t v = pat.match_all ? compile(merge(it.value(), *pat.schema, path + "/properties/" + it.key(), 0),
                                            path + "/properties/" + it.key(), depth + 1)
                                  : compile(it.value(), path + "/properties/" + it.key(), depth + 1);
        props.push_back({json(it.key()).dump(), v});
        presence.push_back(required.count(it.key()) ? ObjectMembers::Presence::Required
                                                    : ObjectMembers::Presence::Optional);
        required.erase(it.key());
        mentioned.erase(it.key());
      }
    }
    // Additional properties: false, a schema, or anything (absent / true).
    int32_t extra_value = -1;
    const json ap = s.contains("additionalProperties") ? s["additionalProperties"] : json(true);
    if (pat.schema) {
      // Extra keys are the pattern's (see pattern_properties); additionalProperties then
      // applies to no generated key.
      extra_value = compile(*pat.schema, path + "/patternProperties", depth + 1);
    } else if (!(ap.is_boolean() && !ap.get<bool>())) {
      extra_value = compile(ap, path + "/additionalProperties", depth + 1);
    }
    if (!mentioned.empty()) {
      // Required or constrained but undeclared: declared with the additionalProperties schema
      // (the pattern's when it matches every key; a name matching another pattern was refused
      // above), so extra keys cannot repeat them.
      int32_t undeclared_value = extra_value;
      if (pat.schema && !pat.match_all)
        undeclared_value = ap.is_boolean() && !ap.get<bool>() ? -1 : compile(ap, path + "/additionalProperties", depth + 1);
      for (const auto& r : mentioned) {
        if (undeclared_value < 0 && required.count(r))
          refuse(path + "/required", "required property '" + r + "' is not allowed");
        props.push_back({json(r).dump(), undeclared_value < 0 ? ir_.nothing() : undeclared_value});
        presence.push_back(required.count(r) ? ObjectMembers::Presence::Required
                           : undeclared_value < 0 ? ObjectMembers::Presence::Absent
                                                  : ObjectMembers::Presence::Optional);
      }
    }
    std::vector<int32_t> member_of_name(names.size());
    for (size_t k = 0; k < names.size(); ++k)
      for (size_t i = 0; i < props.size(); ++i)
        if (props[i].first == json(names[k]).dump()) member_of_name[k] = static_cast<int32_t>(i);
    for (auto& f : rules.constraints) remap_members(&f, member_of_name);
    std::vector<std::string> declared;
    for (const auto& p : props) declared.push_back(p.first.substr(1, p.first.size() - 2));
    ObjectMembers members;
    members.sep = ir_.seq({ws(), lit(","), ws()});
    for (const auto& [key, value] : props) members.member.push_back(ir_.seq({lit(key), ws(), lit(":"), ws(), value}));
    members.presence = std::move(presence);
    if (extra_value >= 0) {
      int32_t rule = ir_.add_rule("extra_member");
      int32_t key = pat.schema && !pat.match_all ? pattern_string(pat.pattern, path + "/patternProperties")
                    : declared.empty()                ? ir_.ref(string_rule())
                                                      : other_key(declared);
      if (!(declared.empty() && !pat.schema)) {
        // The key in a rule of its own: from its states no call is reachable, so their mask
        // entries and subtrees are shared through the vocabulary's caches (mask_cache.h)
        // instead of each state walking the whole vocabulary once per grammar.
        int32_t key_rule = ir_.add_rule("extra_key");
        ir_.set_body(key_rule, key);
        key = ir_.ref(key_rule);
      }
      ir_.set_body(rule, ir_.seq({key, ws(), lit(":"), ws(), extra_value}));
      members.extra_member = ir_.ref(rule);
    }
    return ir_.seq({lit("{"), ws(), object_content(ir_, members, rules, path), ws(), lit("}")});
  }

  // A JSON string key other than the declared ones (their escaped contents, `names`): a trie
  // over the names where leaving the trie, or ending off a name, is allowed.
  int32_t other_key(const std::vector<std::string>& names) {
    if (string_rest_rule_ < 0) {
      string_rest_rule_ = ir_.add_rule("string_rest");
      ir_.set_body(string_rest_rule_, ir_.seq({ir_.star(string_char()), lit("\"")}));
    }
    const int32_t rest_rule = string_rest_rule_;
    auto rest_ref = [&] { return ir_.ref(rest_rule); };
    std::function<int32_t(const std::vector<const std::string*>&, size_t)> node =
        [&](const std::vector<const std::string*>& group, size_t depth) -> int32_t {
      std::map<uint8_t, std::vector<const std::string*>> children;
      bool terminal = false;
      for (const std::string* n : group) {
        if (n->size() == depth) terminal = true;
        else children[static_cast<uint8_t>((*n)[depth])].push_back(n);
      }
      std::vector<int32_t> alts;
      if (!terminal) alts.push_back(lit("\""));
      // Leave the trie: a character whose first byte starts no child.
      std::vector<std::pair<uint32_t, uint32_t>> excluded = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
      for (const auto& [b, _] : children) {
        if (b < 0x80) excluded.push_back({b, b});
        else if (b >= 0xC0) {
          uint32_t lo = b < 0xE0 ? (b & 0x1F) << 6 : b < 0xF0 ? (b & 0x0F) << 12 : (b & 0x07) << 18;
          uint32_t span = b < 0xE0 ? 0x3F : b < 0xF0 ? 0xFFF : 0x3FFFF;
          excluded.push_back({lo, lo + span});
        }
      }
      int32_t leave = ir_.char_ranges(complement_ranges(excluded, 0x10FFFF));
      alts.push_back(ir_.seq({leave, rest_ref()}));
      if (!children.count('\\')) alts.push_back(ir_.seq({string_char_escape(), rest_ref()}));
      for (const auto& [b, group2] : children) alts.push_back(ir_.seq({ir_.byte(b), node(group2, depth + 1)}));
      return ir_.alt(std::move(alts));
    };
    std::vector<const std::string*> all;
    for (const auto& n : names) all.push_back(&n);
    return ir_.seq({lit("\""), node(all, 0)});
  }
  // JSON strings of lo..hi code points (hi -1: unbounded) whose value is none of `excluded`:
  // a trie over the excluded values. Inside it characters are written in canonical form
  // (json_string_char), so no other spelling of an excluded value (a backslash-u escape of a
  // letter) gets through; other strings spelled so inside the trie are not generated
  // (under-approximation).
  // Leaving the trie (a character no excluded value has there) allows any rest.
  int32_t excluded_strings(const std::vector<std::u32string>& excluded, int64_t lo, int64_t hi) {
    std::function<int32_t(const std::vector<const std::u32string*>&, int64_t)> node =
        [&](const std::vector<const std::u32string*>& group, int64_t depth) -> int32_t {
      std::map<uint32_t, std::vector<const std::u32string*>> children;
      bool terminal = false;
      for (const std::u32string* n : group) {
        if (static_cast<int64_t>(n->size()) == depth) terminal = true;
        else children[(*n)[depth]].push_back(n);
      }
      std::vector<int32_t> alts;
      if (!terminal && depth >= lo) alts.push_back(lit("\""));
      if (hi < 0 || depth < hi) {
        std::vector<std::pair<uint32_t, uint32_t>> taken;
        for (const auto& [cp, _] : children) taken.push_back({cp, cp});
        auto leave = complement_ranges(taken, 0x10FFFF);
        if (!leave.empty()) {
          int64_t rest_lo = std::max<int64_t>(0, lo - depth - 1), rest_hi = hi < 0 ? -1 : hi - depth - 1;
          alts.push_back(ir_.seq({json_string_char(ir_, leave),
                                  ir_.repeat(string_char(), static_cast<int32_t>(rest_lo),
                                             rest_hi < 0 ? GrammarIR::kUnbounded : static_cast<int32_t>(rest_hi)),
                                  lit("\"")}));
        }
        for (const auto& [cp, group2] : children)
          alts.push_back(ir_.seq({json_string_char(ir_, {{cp, cp}}), node(group2, depth + 1)}));
      }
      return alts.empty() ? ir_.nothing() : ir_.alt(std::move(alts));
    };
    std::vector<const std::u32string*> all;
    for (const auto& e : excluded) all.push_back(&e);
    return ir_.seq({lit("\""), node(all, 0)});
  }
  int32_t string_char_escape() {
    int32_t hex = ir_.byte_ranges({{'0', '9'}, {'a', 'f'}, {'A', 'F'}});
    return ir_.seq({lit("\\"), ir_.alt({ir_.byte_ranges({{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', 'b'},
                                                         {'f', 'f'}, {'n', 'n'}, {'r', 'r'}, {'t', 't'}}),
                                        ir_.seq({lit("u"), ir_.repeat(hex, 4, 4)})})});
  }

  int32_t compile_array(const json& s, const std::string& path, int depth) {
    std::vector<int32_t> prefix;
    int32_t item = -1;  // schema for items after the prefix; -1: none allowed
    const json* prefix_items = nullptr;
    if (s.contains("prefixItems")) prefix_items = &s["prefixItems"];
    if (s.contains("items") && s["items"].is_array()) prefix_items = &s["items"];  // draft 4 tuple form
    if (prefix_items) {
      for (size_t i = 0; i < prefix_items->size(); ++i)
        prefix.push_back(compile((*prefix_items)[i], path + "/prefixItems/" + std::to_string(i), depth + 1));
    }
    json any = true;
    const json* rest_schema = &any;
    if (s.contains("prefixItems")) {
      if (s.contains("items")) rest_schema = &s["items"];
    } else if (s.contains("items") && s["items"].is_array()) {
      if (s.contains("additionalItems")) rest_schema = &s["additionalItems"];
    } else if (s.contains("items")) {
      rest_schema = &s["items"];
    }
    if (!(rest_schema->is_boolean() && !rest_schema->get<bool>()))
      item = compile(*rest_schema, path + "/items", depth + 1);
    int64_t lo = s.value("minItems", int64_t{0});
    int64_t hi = s.contains("maxItems") ? s["maxItems"].get<int64_t>() : -1;
    if (lo < 0 || (hi >= 0 && hi < lo)) refuse(path, "invalid minItems/maxItems");
    if (lo > 1024 || hi > 1024) refuse(path, "minItems/maxItems above 1024 is not supported (grammar size)");
    const int64_t np = static_cast<int64_t>(prefix.size());
    int32_t sep = ir_.seq({ws(), lit(","), ws()});
    // Element k (0-based) is prefix[k] or item; elements 0..lo-1 are required.
    std::vector<int32_t> elems;
    int64_t limit = hi >= 0 ? hi : (item >= 0 ? -1 : np);
    if (limit >= 0 && limit < lo) refuse(path, "minItems larger than the number of items allowed");
    // Build from the back: tail(k) = elements k.. given k elements were emitted (k >= 1).
    // Fixed part up to max(np, lo), then a repeated tail of `item`.
    int64_t fixed = std::max(np, lo);
    if (limit >= 0) fixed = std::min(fixed, limit);
    auto elem = [&](int64_t k) { return k < np ? prefix[k] : item; };
    int32_t tail;  // after `fixed` elements
    if (limit < 0) tail = ir_.star(ir_.seq({sep, item}));
    else if (limit > fixed) tail = ir_.repeat(ir_.seq({sep, item}), 0, static_cast<int32_t>(limit - fixed));
    else tail = ir_.empty();
    int32_t body = tail;
    for (int64_t k = fixed - 1; k >= 1; --k) {
      int32_t e = ir_.seq({sep, elem(k), body});
      body = k < lo ? e : ir_.opt(e);
    }
    int32_t content;
    if (fixed >= 1) {
      int32_t e = ir_.seq({elem(0), body});
      content = lo >= 1 ? e : ir_.opt(e);
    } else if (item >= 0 && limit != 0) {
      int32_t more = limit < 0 ? ir_.star(ir_.seq({sep, item}))
                               : ir_.repeat(ir_.seq({sep, item}), 0, static_cast<int32_t>(limit - 1));
      content = ir_.opt(ir_.seq({item, more}));
    } else {
      content = ir_.empty();
    }
    return ir_.seq({lit("["), ws(), content, ws(), lit("]")});
  }

  const json& root_;
  bool any_ws_;
  CompileBudget& budget_;
  std::string where_;  // the schema being compiled (for budget errors)
  json allof_const_;   // finite_values' list of an allOf member's const
  std::vector<std::pair<int32_t, std::string>> pending_refs_;  // $ref rules whose body is to compile
  GrammarIR ir_;
  int32_t string_rule_ = -1, string_rest_rule_ = -1, number_rule_ = -1, integer_rule_ = -1, value_rule_ = -1,
          object_rule_ = -1, array_rule_ = -1;
  std::map<std::string, int32_t> ref_rules_;
};

}  // namespace

GrammarIR json_schema_to_ir(const std::string& schema_text, bool any_whitespace, CompileBudget* budget) {
  CompileBudget local_budget;
  CompileBudget& b = budget ? *budget : local_budget;
  // The one JSON policy (core/json.h): UTF-8, depth <= 256 (so no value below recurses
  // deeper), duplicate keys refused, the source size limit.
  JsonLimits limits;
  limits.max_bytes = static_cast<size_t>(std::max<int64_t>(0, b.limits().max_source_bytes));
  const json schema = parse_ordered_json(schema_text, "json schema", limits);
  try {
    return SchemaCompiler(schema, any_whitespace, b).run();
  } catch (const json::exception& e) {
    // A keyword whose value has the wrong JSON type (e.g. "maxLength": "ten") reaches nlohmann's
    // typed getters: that is the schema's error, not an internal one (found by fuzz_json_schema).
    fail("json schema: a keyword's value has the wrong type: ", text_snippet(e.what(), 160));
  }
}

GrammarIR json_object_ir(bool any_whitespace) {
  json empty = json::object();
  CompileBudget budget;
  return SchemaCompiler(empty, any_whitespace, budget).any_object();
}

}  // namespace deepinfer::grammar
