// MaskCache: context-independent token classification (trie_walk.h), computed lazily and
// shared by every matcher of one compiled grammar. An entry is keyed by the top k states of a
// stack (s1 = the element's state, s2 = its return point, ...), with the stack below replaced
// by a sentinel (or the real root when the k states are the whole stack). Level 1 walks the
// whole token trie once (reusing first-byte subtrees already walked from the same situation);
// level k>1 walks it again restricted to level k-1's uncertain tokens.
// A matcher's mask is the OR of the accepted sets along each element's chain.
//
// Level-1 entries of a state from which no call is reachable (JSON string content, numbers,
// literals, regex tails) depend only on the DFA reachable from that state and on the
// vocabulary, not on the grammar: their tokens of at most kShortTokenBytes are also kept in the
// vocabulary's SharedMaskCache under a canonical form of that DFA up to that depth, so the first
// grammar that meets (say) string content, or a string with maxLength far from its bounds, pays
// the full trie walk and every later state with that key only walks the few long tokens.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/trie_walk.h"
#include "grammar/vocab.h"

namespace deepinfer::grammar {

// Per-vocabulary store of grammar-independent level-1 entries; thread-safe. Bounded by
// max_bytes: once full, new forms are no longer stored (the common ones come first).
class SharedMaskCache {
 public:
  explicit SharedMaskCache(size_t max_bytes) : max_bytes_(max_bytes), subtrees_(max_bytes / 4) {}
  std::shared_ptr<const MaskEntry> find(const std::string& key) const;
  // Stores e under key unless present or full; returns the stored entry (or e).
  std::shared_ptr<const MaskEntry> insert(const std::string& key, std::shared_ptr<const MaskEntry> e);
  size_t num_entries() const;
  size_t num_bytes() const;
  // Depth-1 subtrees below a call-free DFA state, keyed by first byte and canonical DFA.
  SubtreeCache& subtrees() { return subtrees_; }

 private:
  const size_t max_bytes_;
  SubtreeCache subtrees_;
  mutable std::mutex mu_;
  size_t num_bytes_ = 0;
  std::unordered_map<std::string, std::shared_ptr<const MaskEntry>> entries_;
};

// Canonical form of the DFA reachable from `state` by byte edges within max_depth bytes
// (breadth-first numbering; finality, edges; nodes at depth max_depth keep only finality and
// whether they have edges), prefixed by `rooted`. Two states with equal keys classify every
// token of at most max_depth bytes alike. MaskCache keys at kShortTokenBytes (vocab.h), so the
// count positions of a bounded repetition (a string with maxLength) more than 16 bytes from
// either bound share one key, in every grammar of the vocabulary. False (key unspecified) when
// a recorded state has a call or more than max_states states are recorded.
// with_calls: call edges are recorded too (callee start, return point) and the callees' states
// with them, so the key covers the pushdown automaton reachable from `state` (no depth bound):
// equal keys behave alike over any stack bottom, e.g. the equivalent mid-character states of
// every node of a key trie that leaves into a string rule.
// complete (optional): set to whether no state was cut at max_depth, i.e. the key is the whole
// reachable DFA and classifies tokens of any length alike.
bool canonical_dfa_key(const Automaton& a, int32_t state, bool rooted, int32_t max_states, int32_t max_depth,
                       std::string& key, bool with_calls = false, bool* complete = nullptr);
// Past this many recorded states a form is not shared: its key would cost more to build than it
// is likely to be met again. A JSON string with maxLength records ~10 states per character
// within 16 bytes (escapes, UTF-8 continuations), so this admits them.
constexpr int32_t kMaxSharedDfaStates = 1024;

class MaskCache {
 public:
  MaskCache(const Automaton& a, const Vocabulary& v) : a_(a), v_(v) {}
  // states: s1..sk (top first); rooted: the k frames are the whole stack; prev: the entry of
  // s1..s(k-1) (null for k == 1); ws: the calling matcher's walk memory.
  const MaskEntry& get(const std::vector<int32_t>& states, bool rooted, const MaskEntry* prev, WalkScratch& ws);
  size_t num_entries() const;
  // Level-1 entries taken from the vocabulary's shared cache rather than walked here.
  size_t num_shared_hits() const;

 private:
  const Automaton& a_;
  const Vocabulary& v_;
  mutable std::mutex mu_;
  size_t num_shared_hits_ = 0;
  std::unordered_map<std::string, std::shared_ptr<const MaskEntry>> entries_;
  SubtreeCache subtrees_{size_t{32} << 20};  // level-1 walks of this grammar (trie_walk.h)
};

}  // namespace deepinfer::grammar
