// JSON Schema `multipleOf` with an integer step k: canonical decimal integers divisible by k.
// Divisibility of a decimal numeral is a regular language (a DFA whose state is the residue
// of the digits read so far mod k, k states); bounded ranges are enumerated.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "grammar/ir.h"

namespace deepinfer::grammar {

// Integers n (JSON text: optional "-", no leading zeros) with n % k == 0 and lo <= n <= hi
// where given. Exact. Throws deepinfer::Error naming `path` when k is outside [1, 1000], or a
// side of the range that must be enumerated holds more than 4096 multiples.
int32_t integer_multiples(GrammarIR& ir, int64_t k, std::optional<int64_t> lo, std::optional<int64_t> hi,
                          const std::string& path);

}  // namespace deepinfer::grammar
