// DeepSeek-V4.1 Engram hashing (MODELS.md V4.1-Flash; the unmerged transformers PR's
// EngramLayout / compute_hash_multipliers / DeepseekV41NgramHashState define it):
//  - bucket primes: per Engram layer, per n-gram size 2..N, per head, the next prime above
//    engram_vocab_size - 1 (the count restarting there for every n-gram size) that no earlier
//    (layer, n-gram, head) took; a layer's columns (n-gram-major, head-minor) own consecutive
//    row ranges of its table starting at row 0, so the table has sum(primes) rows;
//  - multipliers: per Engram layer id, max_ngram_size values 2 * u + 1 with u uniform in
//    [0, (INT64_MAX / compressed_vocab) / 2), drawn by numpy's default_rng(10007 * layer_id):
//    SeedSequence -> PCG64 (XSL-RR 128/64) -> Lemire's bounded 64-bit integers. Implemented here
//    from those algorithms' definitions;
//  - per position: the compressed ids of the token and the N - 1 before it (the sequence start
//    cuts the look-back: missing ones are the compressed pad id), rolling XOR of id * multiplier;
//    after the (i+1)-th id the value is the (i+1)-gram's hash, taken modulo each head's prime,
//    plus the column's row offset.
// The compressed token map itself (NFKC/NFD/strip-accents/lowercase/whitespace normalisation of
// every token's text, first-seen order) depends on the tokenizer and Unicode tables: the checkpoint
// directory provides it (engram_token_map.safetensors, see weights.h), it is not computed here.
#pragma once
#include <cstdint>
#include <vector>

#include "model/deepseek_v41/config.h"

namespace deepinfer {

// numpy.random.default_rng(seed).integers(0, high, size=n, dtype=np.int64) for high > 2^32
// (the 64-bit Lemire path); throws for high <= 2^32 (numpy's 32-bit buffered path, not needed).
std::vector<int64_t> numpy_default_rng_integers(uint64_t seed, int64_t high, int n);
// Raw PCG64 outputs of numpy.random.PCG64(seed) (for tests).
std::vector<uint64_t> numpy_pcg64_raw(uint64_t seed, int n);
bool is_prime_u64(uint64_t n);

struct EngramHashing {
  int max_ngram = 0, heads = 0;
  int64_t pad = 0;                                // the compressed pad id
  std::vector<std::vector<int64_t>> primes;       // [engram layer][(n-1) * heads]
  std::vector<std::vector<int64_t>> offsets;      // the same: each column's first row
  std::vector<std::vector<int64_t>> multipliers;  // [engram layer][max_ngram]
  std::vector<int64_t> rows;                      // per Engram layer: sum of its primes
  int cols() const { return (max_ngram - 1) * heads; }
  // out[cols] = the rows of Engram layer `e` for one position; ids[i] = the compressed id i tokens
  // back (ids[0] the token itself), have = how many of ids are real (>= 1; the rest are the pad).
  void hash(int e, const int64_t* ids, int have, int32_t* out) const;
};

// The primes, offsets and multipliers of `c`'s Engram layers; pad = the compressed id of
// engram_pad_id.
EngramHashing make_engram_hashing(const DeepseekV41Config& c, int64_t compressed_pad);

}  // namespace deepinfer
