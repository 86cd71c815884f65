// A JSON Schema validator for single values, used where a schema's language is a finite list
// (enum/const): each listed value is kept only if the whole schema accepts it, so `not`,
// oneOf and every other keyword beside enum/const is exact there.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace deepinfer::grammar {

// Whether `value` is valid against `schema` ($ref resolved in `root`). Decides type, enum,
// const, not, allOf/anyOf/oneOf, $ref (local), numeric bounds (draft 4 and later),
// multipleOf (as Python's jsonschema: integer remainder, or float division for fractional
// steps), minLength/maxLength, pattern (ECMAScript search), properties, required,
// additionalProperties, patternProperties, min/maxProperties, dependencies /
// dependentRequired / dependentSchemas, propertyNames, items/prefixItems/additionalItems,
// min/maxItems, uniqueItems, contains, if/then/else, nullable; `format` and unknown keywords
// are annotations. Throws deepinfer::Error naming `path` for what it cannot decide (remote
// $ref, unevaluated*, $dynamicRef, a bad regex).
bool schema_accepts(const nlohmann::ordered_json& root, const nlohmann::ordered_json& schema,
                    const nlohmann::ordered_json& value, const std::string& path);

}  // namespace deepinfer::grammar
