// Vocabulary: token byte strings plus a byte trie over them, built once per tokenizer and
// shared by every grammar compiled for it. Special tokens (and EOS) are kept out of the trie:
// a grammar never produces them; EOS is allowed separately when the grammar can terminate.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace deepinfer {
class Tokenizer;
}

namespace deepinfer::grammar {

class SharedMaskCache;

constexpr int32_t kShortTokenBytes = 16;

// Trie in preorder: node i has byte[i] at depth[i] (1-based); its subtree is nodes
// [i, end[i]); the tokens ending at node i are sorted_tokens[tok_begin[i] .. tok_begin[i+1]),
// so a subtree's tokens are sorted_tokens[tok_begin[i] .. tok_begin[end[i]]).
struct TokenTrie {
  std::vector<uint8_t> byte;
  std::vector<uint16_t> depth;
  std::vector<int32_t> end;
  std::vector<int32_t> tok_begin;  // num_nodes + 1
  std::vector<int32_t> sorted_tokens;
  std::vector<int32_t> parent;            // per node; -1 at depth 1
  std::vector<int32_t> node_of_position;  // per position k: the node where sorted_tokens[k] ends
  int32_t max_depth = 0;
  // Positions k (ascending) of tokens longer than kShortTokenBytes: shared level-1 entries are
  // keyed by the DFA up to that depth and hold only the shorter tokens; these few (914 of
  // DeepSeek-V3's 128,815, up to 128 bytes) are re-walked per state (mask_cache.cpp).
  std::vector<int32_t> long_positions;
  int32_t num_nodes() const { return static_cast<int32_t>(byte.size()); }
};

class Vocabulary {
 public:
  // token_bytes[id]: raw bytes of token id; is_special (optional, same size): tokens never
  // produced by a grammar. eos_id may be -1 (no EOS).
  Vocabulary(std::vector<std::string> token_bytes, int32_t eos_id, std::vector<char> is_special = {});
  ~Vocabulary();
  Vocabulary(const Vocabulary&) = delete;
  Vocabulary& operator=(const Vocabulary&) = delete;

  int32_t size() const { return static_cast<int32_t>(token_bytes_.size()); }
  int32_t eos_id() const { return eos_id_; }
  int32_t num_mask_words() const { return (size() + 31) / 32; }
  const std::string& token_bytes(int32_t id) const { return token_bytes_[id]; }
  bool is_special(int32_t id) const { return !is_special_.empty() && is_special_[id]; }
  const TokenTrie& trie() const { return trie_; }
  // Grammar-independent mask entries for this vocabulary (mask_cache.h), shared by every
  // grammar compiled for it; thread-safe.
  SharedMaskCache& shared_masks() const { return *shared_masks_; }

 private:
  std::vector<std::string> token_bytes_;
  std::vector<char> is_special_;
  int32_t eos_id_;
  TokenTrie trie_;
  std::unique_ptr<SharedMaskCache> shared_masks_;
};

// The grammar's view of a tokenizer: raw bytes per id; ids the tokenizer lacks and
// special tokens are never produced by a grammar. vocab_size (default: the
// tokenizer's) may be larger, e.g. a model's padded embedding rows.
std::shared_ptr<const Vocabulary> vocabulary_from_tokenizer(const Tokenizer& tokenizer,
                                                            int32_t vocab_size = -1);

}  // namespace deepinfer::grammar
