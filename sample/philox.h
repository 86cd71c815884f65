// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11): a counter-based generator. The output is a pure function of (key,
// counter), so a sampled token depends only on (seed, stream, position) and
// never on which other requests share the batch or on how many draws came before.
// The generator itself lives in backend/sample_rule.h (host and device share it).
#pragma once
#include <array>
#include <cstdint>

#include "backend/sample_rule.h"

namespace deepinfer {

inline std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr,
                                              std::array<uint32_t, 2> key) {
  sample_rule::philox4x32_10(ctr.data(), key[0], key[1]);
  return ctr;
}

// A uniform double in [0, 1) for draw `position` of stream `stream` under `seed`.
inline double philox_uniform(uint64_t seed, uint64_t stream, uint64_t position) {
  return static_cast<double>(sample_rule::philox_bits53(seed, stream, position)) * 0x1.0p-53;
}

}  // namespace deepinfer
