// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11): a counter-based generator. The output is a pure function of (key,
// counter), so a sampled token depends only on (seed, stream, position) and
// never on which other requests share the batch or on how many draws came before.
#pragma once
#include <array>
#include <cstdint>

namespace deepinfer {

inline std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr,
                                              std::array<uint32_t, 2> key) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kMul0) * ctr[0];
    uint64_t p1 = static_cast<uint64_t>(kMul1) * ctr[2];
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
    key[0] += kWeyl0;
    key[1] += kWeyl1;
  }
  return ctr;
}

// A uniform double in [0, 1) for draw `position` of stream `stream` under `seed`.
inline double philox_uniform(uint64_t seed, uint64_t stream, uint64_t position) {
  auto out = philox4x32_10({static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32),
                            static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)},
                           {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  uint64_t bits53 = (static_cast<uint64_t>(out[0]) << 21) ^ (out[1] >> 11);
  return static_cast<double>(bits53 & ((1ull << 53) - 1)) * 0x1.0p-53;
}

}  // namespace deepinfer
