// A JSON Schema validator for single values, used where a schema's language is a finite list
// (enum/const): each listed value is kept only if the whole schema accepts it, so `not`,
// oneOf and every other keyword beside enum/const is exact there.
#pragma once
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "grammar/ir.h"

namespace deepinfer::grammar {

// Whether `value` is valid against `schema` ($ref resolved in `root`). Decides type, enum,
// const, not, allOf/anyOf/oneOf, $ref (local), numeric bounds (draft 4 and later),
// multipleOf (as Python's jsonschema: integer remainder, or float division for fractional
// steps), minLength/maxLength, pattern (ECMAScript search), properties, required,
// additionalProperties, patternProperties, min/maxProperties, dependencies /
// dependentRequired / dependentSchemas, propertyNames, items/prefixItems/additionalItems,
// min/maxItems, uniqueItems, contains, if/then/else, nullable; `format` and unknown keywords
// are annotations. Throws deepinfer::Error naming `path` for what it cannot decide (remote
// $ref, unevaluated*, $dynamicRef, a bad regex). With a budget, every schema visited ticks
// its clock (nested anyOf over $refs can take exponential time).
// ECMAScript regexes (std::regex) for checking names and enum values against `pattern`s, with
// what std::regex would recurse on bounded: group nesting (<= 200) and the input's length.
constexpr size_t kMaxEcmaRegexInput = 4096;
std::regex ecma_regex(const std::string& pattern, const std::string& path);
bool ecma_regex_search(const std::regex& re, const std::string& text, const std::string& path);

bool schema_accepts(const nlohmann::ordered_json& root, const nlohmann::ordered_json& schema,
                    const nlohmann::ordered_json& value, const std::string& path, CompileBudget* budget = nullptr);

}  // namespace deepinfer::grammar
