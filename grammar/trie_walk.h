// Token classification by one walk of the vocabulary trie from a fixed stack top.
//
// The stack is k automaton states s1..sk (s1 = the element's state, s2 its return point, ...)
// over a bottom: the real root (`rooted`: the k states are the whole stack) or the sentinel
// (whatever lies below is unknown). Every token whose first byte s1 consumes is
//   accepted:  valid whatever lies below the k frames;
//   uncertain: valid only if the frames below accept the rest (the sentinel popped inside it);
//   rejected:  otherwise.
// Prefixes are shared: a trie node is stepped once for all tokens below it, and a subtree is
// skipped as soon as no stack survives its prefix. A run of states without calls is stepped as
// a plain DFA (no stack hashing) until its rule ends inside a token.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/stack.h"
#include "grammar/vocab.h"

namespace deepinfer::grammar {

struct MaskEntry {
  // Accepted token ids: a dense bitmask (num_mask_words words) when they touch many words, else
  // (mask word, bits) pairs in ascending word order. Most entries past level 1 hold a handful of
  // ids: as 16 KB bitmasks they were zeroed, stored and ORed into every mask in full.
  std::vector<uint32_t> dense;
  std::vector<std::pair<int32_t, uint32_t>> sparse;
  // Uncertain tokens as positions in the trie's sorted_tokens (ascending): a deeper walk
  // restricted to them shares their common prefixes.
  std::vector<int32_t> uncertain;

  void or_into(uint32_t* mask) const;
  // Takes the set bits of `bits` (a bitmask of num_mask_words words) into dense or sparse form,
  // whichever is smaller, and leaves `bits` all zero.
  void take_bits(std::vector<uint32_t>& bits);
  // As take_bits, when every set bit is the id of one of `positions` (trie positions): visits
  // their words instead of all of them (a restricted walk sets a handful of bits).
  void take_bits_at(std::vector<uint32_t>& bits, const std::vector<int32_t>& positions, const TokenTrie& t);
};

// The classification of the tokens below one first byte (not the one-byte token itself) from
// one situation after that byte: the stack element(s) reached and whether the sentinel popped.
// Different states often reach the same situation (every state of a key trie that leaves into
// plain string content), so a level-1 walk reuses the subtree instead of walking it again.
struct SubtreeResult {
  // Accepted token ids as (mask word, bits) with ascending words: applying a hit is one OR
  // per word touched, in memory order (was one bit per id in trie order: 0.6 s of MaskBench).
  std::vector<std::pair<int32_t, uint32_t>> accepted_words;
  std::vector<int32_t> uncertain;  // trie positions, ascending
};

// The union of the subtrees of many first bytes that lead to one vocabulary-wide form F: a
// state of an extra-property key trie leads to the same "rest of the string" form after ~100
// first bytes, and applying ~100 cached subtrees ((word, bits) pairs: 55k per walk) was a third
// of all mask time. With the union, such a walk ORs one dense mask once, minus the subtrees of
// the covered bytes that do not lead to F there.
struct FormUnion {
  std::vector<uint32_t> dense;  // OR of by_byte[b]->accepted_words over the covered bytes
  // Covered first bytes: their subtree under F (null: not covered).
  std::array<std::shared_ptr<const SubtreeResult>, 256> by_byte;
};

// Per compiled grammar (situations name its states); thread-safe; bounded by max_bytes.
class SubtreeCache {
 public:
  explicit SubtreeCache(size_t max_bytes) : max_bytes_(max_bytes) {}
  std::shared_ptr<const SubtreeResult> find(const std::string& key) const;
  void insert(const std::string& key, std::shared_ptr<const SubtreeResult> r);
  // A small id per distinct canonical form (mask_cache.h: canonical_dfa_key), so subtree keys
  // are 8 bytes instead of the form's text. Ids are never reused; no byte bound (forms are few).
  int32_t form_id(const std::string& form);
  // Per compiled grammar: state -> its form id in the vocabulary's cache (-1: none, keyed by
  // the state itself). Computing a form costs up to ~64 states of hashing, once per state
  // instead of once per walk that meets it (0.8 s of MaskBench).
  bool find_state_form(int32_t state, int32_t& form) const;
  void insert_state_form(int32_t state, int32_t form);
  // Unions by form id (vocabulary-wide forms only). A form whose union did not fit is kept
  // without one (union_decided, find_union null).
  std::shared_ptr<const FormUnion> find_union(int32_t form) const;
  bool union_decided(int32_t form) const;
  void insert_union(int32_t form, std::shared_ptr<const FormUnion> u);
  size_t num_unions() const;

 private:
  const size_t max_bytes_;
  mutable std::mutex mu_;
  size_t num_bytes_ = 0;
  std::unordered_map<std::string, std::shared_ptr<const SubtreeResult>> results_;
  std::unordered_map<std::string, int32_t> form_ids_;
  std::unordered_map<int32_t, int32_t> state_forms_;
  std::unordered_map<int32_t, std::shared_ptr<const FormUnion>> unions_;
};

// Per-walk working memory, reused across the walks of one matcher (a walk allocated its stack
// arena, per-depth sets and a 16 KB bitmask each time: thousands of walks per grammar).
struct WalkScratch {
  StackArena arena;
  StepScratch step;
  std::vector<int32_t> fast, fast_parent;
  std::vector<char> popped;
  std::vector<std::vector<int32_t>> sets;
  std::vector<uint32_t> bits;         // an entry being built; all zero between walks
  std::vector<uint32_t> record_bits;  // the subtree being recorded; all zero between walks
};

// Classifies the tokens for the stack top `states` (s1 first): accepted ids are ORed into
// `accepted` (num_mask_words words), uncertain trie positions replace `uncertain` (ascending).
// candidates: when not null, only these trie positions (ascending) are classified (the others
// are left rejected), and subtrees holding none are skipped. subtrees (optional, full walks
// only): reused and filled.
void walk_trie(const Automaton& a, const Vocabulary& v, const std::vector<int32_t>& states, bool rooted,
               const std::vector<int32_t>* candidates, SubtreeCache* subtrees, WalkScratch& ws, uint32_t* accepted,
               std::vector<int32_t>& uncertain);

}  // namespace deepinfer::grammar
