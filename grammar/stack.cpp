// Pushdown closure and byte steps over hash-consed stacks.
#include "grammar/stack.h"

#include <algorithm>

namespace deepinfer::grammar {

namespace {
inline uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return k;
}
}  // namespace

int32_t IdIndex::find_or_insert(uint64_t key, int32_t next, bool& inserted) {
  if (2 * (size_ + 1) > slots_.size()) grow();
  const size_t m = slots_.size() - 1;
  for (size_t i = mix(key) & m;; i = (i + 1) & m) {
    Slot& s = slots_[i];
    if (s.generation != generation_) {
      s = {key, next, generation_};
      ++size_;
      inserted = true;
      return next;
    }
    if (s.key == key) {
      inserted = false;
      return s.id;
    }
  }
}

void IdIndex::grow() {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(std::max<size_t>(64, old.size() * 2), Slot{0, 0, 0});
  const size_t m = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.generation != generation_) continue;
    size_t i = mix(s.key) & m;
    while (slots_[i].generation == generation_) i = (i + 1) & m;
    slots_[i] = s;
  }
}

int32_t StackArena::make(int32_t state, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | static_cast<uint32_t>(parent + 2);
  bool inserted;
  const int32_t id = index_.find_or_insert(key, static_cast<int32_t>(nodes_.size()), inserted);
  if (inserted) nodes_.push_back({state, parent});
  return id;
}

namespace {
bool contains(const std::vector<int32_t>& v, int32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }
}  // namespace

void close_element(const Automaton& a, StackArena& arena, int32_t e, std::vector<int32_t>& out, StepFlags& flags,
                   StepScratch& scratch) {
  // `visited` holds every element seen in this step (kept across calls of one step).
  if (contains(scratch.visited, e)) return;
  scratch.visited.push_back(e);
  scratch.work.push_back(e);
  while (!scratch.work.empty()) {
    int32_t x = scratch.work.back();
    scratch.work.pop_back();
    const StackNode node = arena[x];
    const AutomatonState& st = a.states[node.state];
    if (!st.bytes.empty()) out.push_back(x);
    auto visit = [&](int32_t y) {
      if (!contains(scratch.visited, y)) {
        scratch.visited.push_back(y);
        scratch.work.push_back(y);
      }
    };
    for (const auto& c : st.calls) {
      int32_t ret = arena.make(c.to, node.parent);
      visit(arena.make(a.rule_start[c.rule], ret));
    }
    if (st.final) {
      if (node.parent == kRoot)
        flags.root_pop = true;
      else if (node.parent == kSentinel)
        flags.sentinel_pop = true;
      else
        visit(node.parent);
    }
  }
}

void step_byte(const Automaton& a, StackArena& arena, const std::vector<int32_t>& in, uint8_t b,
               std::vector<int32_t>& out, StepFlags& flags, StepScratch& scratch) {
  out.clear();
  scratch.visited.clear();
  for (int32_t e : in) {
    const StackNode node = arena[e];
    int32_t to = a.next(node.state, b);
    if (to >= 0) close_element(a, arena, arena.make(to, node.parent), out, flags, scratch);
  }
}

}  // namespace deepinfer::grammar
