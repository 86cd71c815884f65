// Tool-call front-end: a list of calls wrapped in fixed marker text, each call's arguments
// matching its function's JSON Schema. The format (markers, separator) comes with the source, so
// the grammar module knows no model's format; the server writes DeepSeek's.
//
//   {"begin": "<calls>", "end": "</calls>", "separator": "\n", "min_calls": 1, "max_calls": -1,
//    "calls": [{"prefix": "<call>f\n", "schema": {...}, "suffix": "</call>"}, ...]}
//
// matches  begin CALL (separator CALL){min_calls-1, max_calls-1} end, CALL = any one of calls'
// prefix ARGS suffix. max_calls -1: unbounded.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "grammar/grammar.h"

namespace deepinfer::grammar {

GrammarIR tool_calls_ir(const std::string& source, bool any_whitespace, CompileBudget* budget) {
  CompileBudget local_budget;
  CompileBudget& b = budget ? *budget : local_budget;
  JsonLimits limits;
  limits.max_bytes = static_cast<size_t>(std::max<int64_t>(0, b.limits().max_source_bytes));
  const nlohmann::ordered_json spec = parse_ordered_json(source, "tool calls", limits);
  auto text = [&](const nlohmann::ordered_json& obj, const char* key, const std::string& where) {
    if (!obj.is_object() || !obj.contains(key) || !obj[key].is_string())
      fail("tool calls: ", where, key, ": expected a string");
    return obj[key].get<std::string>();
  };
  auto integer = [&](const char* key, int64_t def) -> int64_t {
    if (!spec.contains(key)) return def;
    if (!spec[key].is_number_integer()) fail("tool calls: ", key, ": expected an integer");
    return spec[key].get<int64_t>();
  };
  if (!spec.is_object()) fail("tool calls: expected a JSON object");
  const std::string begin = text(spec, "begin", ""), end = text(spec, "end", "");
  const std::string separator = spec.contains("separator") ? text(spec, "separator", "") : std::string();
  const int64_t min_calls = integer("min_calls", 1), max_calls = integer("max_calls", -1);
  if (min_calls < 1 || (max_calls != -1 && max_calls < min_calls) || min_calls > 64 || max_calls > 64)
    fail("tool calls: min_calls ", min_calls, " / max_calls ", max_calls,
         ": expected 1 <= min_calls <= max_calls <= 64 (max_calls -1: unbounded)");
  if (!spec.contains("calls") || !spec["calls"].is_array() || spec["calls"].empty())
    fail("tool calls: calls: expected a non-empty list");

  GrammarIR ir;
  ir.set_budget(&b);
  const int32_t root = ir.add_rule("root");
  ir.set_root(root);
  std::vector<int32_t> alternatives;
  for (size_t i = 0; i < spec["calls"].size(); ++i) {
    const auto& c = spec["calls"][i];
    const std::string where = "calls[" + std::to_string(i) + "].";
    if (!c.is_object() || !c.contains("schema")) fail("tool calls: ", where, "schema: required");
    GrammarIR args;
    try {
      args = json_schema_to_ir(c["schema"].dump(), any_whitespace, &b);
    } catch (const GrammarBudgetError&) {
      throw;
    } catch (const Error& e) {
      fail("tool calls: ", where, "schema: ", e.what());
    }
    const int32_t args_rule = ir.import_rules(args);
    alternatives.push_back(ir.seq({ir.literal(text(c, "prefix", where)), ir.ref(args_rule),
                                   ir.literal(text(c, "suffix", where))}));
  }
  const int32_t call_rule = ir.add_rule("call");
  ir.set_body(call_rule, ir.alt(alternatives));
  const int32_t more = ir.repeat(ir.seq({ir.literal(separator), ir.ref(call_rule)}), static_cast<int32_t>(min_calls - 1),
                                 max_calls == -1 ? GrammarIR::kUnbounded : static_cast<int32_t>(max_calls - 1));
  ir.set_body(root, ir.seq({ir.literal(begin), ir.ref(call_rule), more, ir.literal(end)}));
  return ir;
}

}  // namespace deepinfer::grammar
