// JSON Schema numeric bounds as grammars: integers in a range (digit-range automata, one
// alternative per decimal length) and decimals within bounds read exactly as written.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/ir.h"

namespace deepinfer::grammar {

// Integers n (JSON text: optional "-", no leading zeros) with lo <= n <= hi where given; the
// caller has checked lo <= hi. Exact.
int32_t bounded_integer(GrammarIR& ir, std::optional<int64_t> lo, std::optional<int64_t> hi);

// Numbers within the bounds of schema `s` (minimum, exclusiveMinimum, maximum,
// exclusiveMaximum, draft-4 boolean exclusives), exact for decimals: bounds are read as
// written, no exponent is generated. Throws deepinfer::Error naming `path` when no number
// matches.
int32_t bounded_decimal(GrammarIR& ir, const nlohmann::ordered_json& s, const std::string& path);

}  // namespace deepinfer::grammar
