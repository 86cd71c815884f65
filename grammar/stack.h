// StackArena: hash-consed, persistent return stacks for the pushdown matcher. An element is
// a stack node id: (state, parent), where parent is the return point (itself a node) or one
// of the two bottoms: kRoot (the real bottom: popping it completes the grammar) and kSentinel
// (used when classifying tokens out of context: popping it means "depends on the caller").
#pragma once
#include <cstdint>
#include <vector>

#include "grammar/automaton.h"

namespace deepinfer::grammar {

constexpr int32_t kRoot = -1;
constexpr int32_t kSentinel = -2;

struct StackNode {
  int32_t state;
  int32_t parent;
};

struct StepFlags {
  bool root_pop = false;      // the grammar completed (root rule ended)
  bool sentinel_pop = false;  // the bottom rule of an out-of-context stack ended
};

// Open-addressing map from 64-bit keys to ids (linear probing, load <= 1/2), cleared in O(1):
// a slot is live only when its generation is the map's, so a map reused for thousands of trie
// walks does not pay for its largest size on every clear (was std::unordered_map: one
// allocation per key). Used by the stack arena and by canonical DFA numbering (mask_cache.cpp).
class IdIndex {
 public:
  // The id stored for `key`, or `next`, stored now (inserted = true).
  int32_t find_or_insert(uint64_t key, int32_t next, bool& inserted);
  void clear() {
    size_ = 0;
    if (++generation_ == 0) {  // wrapped: slots of generation 0 would read as live
      slots_.assign(slots_.size(), Slot{0, 0, 0});
      generation_ = 1;
    }
  }

 private:
  void grow();
  struct Slot {
    uint64_t key;
    int32_t id;
    uint32_t generation;
  };
  std::vector<Slot> slots_;
  size_t size_ = 0;
  uint32_t generation_ = 1;
};

class StackArena {
 public:
  int32_t make(int32_t state, int32_t parent);
  const StackNode& operator[](int32_t id) const { return nodes_[id]; }
  int32_t size() const { return static_cast<int32_t>(nodes_.size()); }
  // O(1) (IdIndex::clear).
  void clear() {
    nodes_.clear();
    index_.clear();
  }

 private:
  std::vector<StackNode> nodes_;
  IdIndex index_;  // (state, parent) -> node id
};

// Scratch space for closures (reused to avoid allocation per byte).
struct StepScratch {
  std::vector<int32_t> visited;
  std::vector<int32_t> work;
};

// Adds element e and everything reachable from it by calls (push) and rule ends (pop) to
// `out`, keeping only elements whose state has byte edges (the others cannot consume).
void close_element(const Automaton& a, StackArena& arena, int32_t e, std::vector<int32_t>& out, StepFlags& flags,
                   StepScratch& scratch);

// out = closure of the byte-b transitions of the elements of `in`.
void step_byte(const Automaton& a, StackArena& arena, const std::vector<int32_t>& in, uint8_t b,
               std::vector<int32_t>& out, StepFlags& flags, StepScratch& scratch);

}  // namespace deepinfer::grammar
