// Counter-based random numbers shared by every backend's fill_random: element i of a
// tensor filled with seed s is scale * random_uniform(s, i), computed identically on
// the host and the device (integer hash, exact int->float, one multiply), so weights
// made on a GPU from a seed equal those made on the CPU bit for bit.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define DI_HOST_DEVICE __host__ __device__
#else
#define DI_HOST_DEVICE
#endif

namespace deepinfer {

// splitmix64 finaliser over (seed, index): a full-avalanche 64-bit hash.
DI_HOST_DEVICE inline uint64_t random_hash(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [-1, 1) on a grid of 2^-23: the top 24 bits of the hash, centred.
DI_HOST_DEVICE inline float random_uniform(uint64_t seed, uint64_t index) {
  const int32_t v = static_cast<int32_t>(random_hash(seed, index) >> 40) - 8388608;
  return static_cast<float>(v) * (1.0f / 8388608.0f);
}

}  // namespace deepinfer
