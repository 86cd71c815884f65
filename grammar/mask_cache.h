// MaskCache: context-independent token classification, computed lazily and shared by every
// matcher of one compiled grammar. An entry is keyed by the top k states of a stack
// (s1 = the element's state, s2 = its return point, ...), with the stack below replaced by a
// sentinel (or the real root when the k states are the whole stack). For that key every
// vocabulary token whose first byte is consumed by s1 is
//   accepted:  valid whatever lies below the k frames;
//   uncertain: valid only if the frames below accept the rest (popped the sentinel early);
//   rejected:  otherwise.
// Level 1 walks the whole token trie once; level k>1 re-checks only level k-1's uncertain
// tokens. A matcher's mask is the OR of the accepted sets along each element's chain.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/vocab.h"

namespace deepinfer::grammar {

struct MaskEntry {
  std::vector<uint32_t> accepted;  // bitmask over the vocabulary, num_mask_words words
  std::vector<int32_t> uncertain;  // token ids
};

class MaskCache {
 public:
  MaskCache(const Automaton& a, const Vocabulary& v) : a_(a), v_(v) {}
  // states: s1..sk (top first); rooted: the k frames are the whole stack.
  const MaskEntry& get(const std::vector<int32_t>& states, bool rooted, const MaskEntry* prev);
  size_t num_entries() const;

 private:
  std::unique_ptr<MaskEntry> walk_trie(int32_t state, bool rooted) const;
  std::unique_ptr<MaskEntry> recheck(const std::vector<int32_t>& states, bool rooted, const MaskEntry& prev) const;

  const Automaton& a_;
  const Vocabulary& v_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<MaskEntry>> entries_;
};

}  // namespace deepinfer::grammar
