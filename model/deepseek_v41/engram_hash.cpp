#include "model/deepseek_v41/engram_hash.h"

#include <limits>
#include <set>

#include "core/error.h"

namespace deepinfer {

namespace {

using u128 = unsigned __int128;

// numpy's SeedSequence (pool of 4 uint32 words, no spawn key) and generate_state(4, uint64).
struct SeedSequence {
  static constexpr uint32_t kInitA = 0x43b0d7e5u, kMultA = 0x931e8875u, kInitB = 0x8b51f9ddu,
                            kMultB = 0x58f38dedu, kMixL = 0xca01f9ddu, kMixR = 0x4973f715u;
  uint32_t pool[4] = {};

  static uint32_t hashmix(uint32_t v, uint32_t& hc) {
    v ^= hc;
    hc *= kMultA;
    v *= hc;
    v ^= v >> 16;
    return v;
  }
  static uint32_t mix(uint32_t x, uint32_t y) {
    uint32_t r = kMixL * x - kMixR * y;
    r ^= r >> 16;
    return r;
  }
  explicit SeedSequence(uint64_t seed) {
    std::vector<uint32_t> entropy;  // the seed's little-endian 32-bit words (0: one word)
    do {
      entropy.push_back(static_cast<uint32_t>(seed & 0xffffffffu));
      seed >>= 32;
    } while (seed != 0);
    uint32_t hc = kInitA;
    for (size_t i = 0; i < 4; ++i) pool[i] = hashmix(i < entropy.size() ? entropy[i] : 0u, hc);
    for (size_t s = 0; s < 4; ++s)
      for (size_t d = 0; d < 4; ++d)
        if (s != d) pool[d] = mix(pool[d], hashmix(pool[s], hc));
    for (size_t s = 4; s < entropy.size(); ++s)
      for (size_t d = 0; d < 4; ++d) pool[d] = mix(pool[d], hashmix(entropy[s], hc));
  }
  void generate64(uint64_t out[4]) const {
    uint32_t hc = kInitB, w[8];
    for (int i = 0; i < 8; ++i) {
      uint32_t v = pool[i % 4];
      v ^= hc;
      hc *= kMultB;
      v *= hc;
      v ^= v >> 16;
      w[i] = v;
    }
    for (int i = 0; i < 4; ++i) out[i] = w[2 * i] | (static_cast<uint64_t>(w[2 * i + 1]) << 32);
  }
};

// PCG64 as numpy seeds it: state and increment from the seed sequence's four words
// (high word first), the 128-bit LCG stepped before each XSL-RR output.
struct Pcg64 {
  static constexpr u128 kMult =
      (static_cast<u128>(2549297995355413924ull) << 64) | 4865540595714422341ull;
  u128 state = 0, inc = 0;
  explicit Pcg64(uint64_t seed) {
    uint64_t w[4];
    SeedSequence(seed).generate64(w);
    const u128 s = (static_cast<u128>(w[0]) << 64) | w[1];
    const u128 i = (static_cast<u128>(w[2]) << 64) | w[3];
    inc = (i << 1) | 1u;
    step();
    state += s;
    step();
  }
  void step() { state = state * kMult + inc; }
  uint64_t next() {
    step();
    const uint64_t v = static_cast<uint64_t>(state >> 64) ^ static_cast<uint64_t>(state);
    const unsigned rot = static_cast<unsigned>(state >> 122);
    return (v >> rot) | (v << ((64u - rot) & 63u));
  }
};

}  // namespace

std::vector<uint64_t> numpy_pcg64_raw(uint64_t seed, int n) {
  Pcg64 g(seed);
  std::vector<uint64_t> out;
  for (int i = 0; i < n; ++i) out.push_back(g.next());
  return out;
}

std::vector<int64_t> numpy_default_rng_integers(uint64_t seed, int64_t high, int n) {
  DI_CHECK(high > (int64_t{1} << 32),
           "numpy_default_rng_integers: only the 64-bit bounded path (high > 2^32) is implemented, "
           "got high ",
           high);
  Pcg64 g(seed);
  const uint64_t range = static_cast<uint64_t>(high - 1), excl = range + 1;  // values [0, high)
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) {  // Lemire: the high word of next * excl, rejecting the biased low
    u128 m = static_cast<u128>(g.next()) * excl;
    uint64_t left = static_cast<uint64_t>(m);
    if (left < excl) {
      const uint64_t threshold = (0 - excl) % excl;
      while (left < threshold) {
        m = static_cast<u128>(g.next()) * excl;
        left = static_cast<uint64_t>(m);
      }
    }
    out.push_back(static_cast<int64_t>(m >> 64));
  }
  return out;
}

bool is_prime_u64(uint64_t n) {
  if (n < 2) return false;
  for (uint64_t p : {2ull, 3ull, 5ull, 7ull, 11ull, 13ull, 17ull, 19ull, 23ull, 29ull, 31ull, 37ull})
    if (n % p == 0) return n == p;
  uint64_t d = n - 1;
  int r = 0;
  while ((d & 1u) == 0) {
    d >>= 1;
    ++r;
  }
  auto mulmod = [n](uint64_t a, uint64_t b) {
    return static_cast<uint64_t>(static_cast<u128>(a) * b % n);
  };
  for (uint64_t a : {2ull, 3ull, 5ull, 7ull, 11ull, 13ull, 17ull, 19ull, 23ull, 29ull, 31ull, 37ull}) {
    uint64_t x = 1, b = a % n, e = d;
    while (e > 0) {
      if (e & 1u) x = mulmod(x, b);
      b = mulmod(b, b);
      e >>= 1;
    }
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int i = 1; i < r && composite; ++i) {
      x = mulmod(x, x);
      if (x == n - 1) composite = false;
    }
    if (composite) return false;
  }
  return true;
}

EngramHashing make_engram_hashing(const DeepseekV41Config& c, int64_t compressed_pad) {
  EngramHashing h;
  h.max_ngram = c.engram_max_ngram_size;
  h.heads = c.engram_n_heads;
  h.pad = compressed_pad;
  std::set<int64_t> seen;
  const int64_t bound =
      std::max<int64_t>(1, (std::numeric_limits<int64_t>::max() / c.engram_compressed_vocab_size) / 2);
  for (int layer : c.engram_layers) {
    std::vector<int64_t> primes, offsets;
    int64_t total = 0;
    for (int n = 0; n < h.max_ngram - 1; ++n) {
      int64_t cur = c.engram_vocab_size - 1;
      for (int k = 0; k < h.heads; ++k) {
        do ++cur;
        while (!is_prime_u64(static_cast<uint64_t>(cur)) || seen.count(cur) != 0);
        seen.insert(cur);
        primes.push_back(cur);
        offsets.push_back(total);
        total += cur;
      }
    }
    std::vector<int64_t> mult =
        numpy_default_rng_integers(10007ull * static_cast<uint64_t>(layer), bound, h.max_ngram);
    for (int64_t& m : mult) m = 2 * m + 1;
    h.primes.push_back(std::move(primes));
    h.offsets.push_back(std::move(offsets));
    h.multipliers.push_back(std::move(mult));
    h.rows.push_back(total);
  }
  return h;
}

void EngramHashing::hash(int e, const int64_t* ids, int have, int32_t* out) const {
  const std::vector<int64_t>& m = multipliers[static_cast<size_t>(e)];
  const std::vector<int64_t>& p = primes[static_cast<size_t>(e)];
  const std::vector<int64_t>& o = offsets[static_cast<size_t>(e)];
  // int64 products wrap like torch's (the multiplier bound keeps them from overflowing).
  auto product = [&](int i) {
    const int64_t id = i < have ? ids[i] : pad;
    return static_cast<uint64_t>(id) * static_cast<uint64_t>(m[static_cast<size_t>(i)]);
  };
  uint64_t rolling = product(0);
  for (int i = 1; i < max_ngram; ++i) {
    rolling ^= product(i);
    const int64_t v = static_cast<int64_t>(rolling);
    for (int k = 0; k < heads; ++k) {
      const size_t col = static_cast<size_t>((i - 1) * heads + k);
      int64_t r = v % p[col];
      if (r < 0) r += p[col];  // torch's % takes the divisor's sign
      out[col] = static_cast<int32_t>(r + o[col]);
    }
  }
}

}  // namespace deepinfer
