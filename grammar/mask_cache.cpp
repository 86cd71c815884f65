// Token classification by trie walk (level 1) and per-token re-check (deeper levels).
#include "grammar/mask_cache.h"

#include "grammar/stack.h"

namespace deepinfer::grammar {
namespace {

void set_bit(std::vector<uint32_t>& mask, int32_t id) { mask[id >> 5] |= 1u << (id & 31); }

// Walks one token's bytes from element `top` (only top's own byte edges at depth 0).
// Returns 1 accepted, 2 uncertain, 0 rejected.
int classify(const Automaton& a, StackArena& arena, int32_t top, const std::string& bytes, bool rooted,
             StepScratch& scratch) {
  std::vector<int32_t> cur{top}, next;
  bool popped_early = false;
  for (size_t d = 0; d < bytes.size(); ++d) {
    StepFlags flags;
    step_byte(a, arena, cur, static_cast<uint8_t>(bytes[d]), next, flags, scratch);
    bool pop = rooted ? flags.root_pop : flags.sentinel_pop;
    if (d + 1 == bytes.size()) return (!next.empty() || pop) ? 1 : (popped_early ? 2 : 0);
    if (pop && !rooted) popped_early = true;
    if (next.empty()) return popped_early ? 2 : 0;
    cur.swap(next);
  }
  return 0;
}

}  // namespace

size_t MaskCache::num_entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

const MaskEntry& MaskCache::get(const std::vector<int32_t>& states, bool rooted, const MaskEntry* prev) {
  std::string key(reinterpret_cast<const char*>(states.data()), states.size() * sizeof(int32_t));
  key.push_back(rooted ? 'r' : 's');
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) return *it->second;
  }
  // Computed outside the lock; a concurrent duplicate computation is harmless.
  std::unique_ptr<MaskEntry> e = states.size() == 1 ? walk_trie(states[0], rooted) : recheck(states, rooted, *prev);
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = entries_.try_emplace(std::move(key), std::move(e));
  return *it->second;
}

std::unique_ptr<MaskEntry> MaskCache::recheck(const std::vector<int32_t>& states, bool rooted,
                                              const MaskEntry& prev) const {
  auto e = std::make_unique<MaskEntry>();
  e->accepted.assign(v_.num_mask_words(), 0);
  StackArena arena;
  StepScratch scratch;
  int32_t id = rooted ? kRoot : kSentinel;
  for (size_t k = states.size(); k-- > 0;) id = arena.make(states[k], id);
  for (int32_t tok : prev.uncertain) {
    int c = classify(a_, arena, id, v_.token_bytes(tok), rooted, scratch);
    if (c == 1) set_bit(e->accepted, tok);
    if (c == 2) e->uncertain.push_back(tok);
  }
  return e;
}

std::unique_ptr<MaskEntry> MaskCache::walk_trie(int32_t state, bool rooted) const {
  auto e = std::make_unique<MaskEntry>();
  e->accepted.assign(v_.num_mask_words(), 0);
  const TokenTrie& t = v_.trie();
  const int32_t bottom = rooted ? kRoot : kSentinel;
  StackArena arena;
  StepScratch scratch;
  // Per depth: either a fast element (one element of a call-free rule: plain DFA stepping
  // with no hashing until its rule ends) or a general element set.
  const int32_t max_depth = t.max_depth + 1;
  std::vector<int32_t> fast(max_depth, -1), fast_parent(max_depth, bottom);
  std::vector<std::vector<int32_t>> sets(max_depth);
  std::vector<char> popped(max_depth, 0);  // a pop of the sentinel happened at depth 1..d
  if (a_.dense_offset[state] >= 0)
    fast[0] = state;
  else
    sets[0] = {arena.make(state, bottom)};
  auto mark_range = [&](int32_t begin, int32_t end, bool uncertain) {
    if (uncertain)
      for (int32_t k = begin; k < end; ++k) e->uncertain.push_back(t.sorted_tokens[k]);
  };
  const int32_t n = t.num_nodes();
  for (int32_t i = 0; i < n;) {
    const int32_t d = t.depth[i];
    const uint8_t b = t.byte[i];
    bool alive = false, pop = false, general = false;
    fast[d] = -1;
    if (fast[d - 1] >= 0) {
      const int32_t ns = a_.next(fast[d - 1], b);
      if (ns >= 0) {
        const AutomatonState& st = a_.states[ns];
        const int32_t parent = fast_parent[d - 1];
        if (st.final && parent != bottom) {
          // The rule ends inside the token: continue in the caller (general path).
          StepFlags flags;
          sets[d].clear();
          scratch.visited.clear();
          close_element(a_, arena, arena.make(ns, parent), sets[d], flags, scratch);
          general = true;
          pop = rooted ? flags.root_pop : flags.sentinel_pop;
          alive = !sets[d].empty();
        } else {
          pop = st.final;
          if (!st.bytes.empty()) {
            alive = true;
            fast[d] = ns;
            fast_parent[d] = parent;
          }
        }
      }
    } else {
      StepFlags flags;
      step_byte(a_, arena, sets[d - 1], b, sets[d], flags, scratch);
      general = true;
      pop = rooted ? flags.root_pop : flags.sentinel_pop;
      alive = !sets[d].empty();
    }
    if (general && sets[d].size() == 1 && a_.dense_offset[arena[sets[d][0]].state] >= 0) {
      fast[d] = arena[sets[d][0]].state;
      fast_parent[d] = arena[sets[d][0]].parent;
    }
    const bool popped_before = popped[d - 1];
    popped[d] = popped_before || (pop && !rooted);
    for (int32_t k = t.tok_begin[i]; k < t.tok_begin[i + 1]; ++k) {
      int32_t tok = t.sorted_tokens[k];
      if (alive || pop)
        set_bit(e->accepted, tok);
      else if (popped_before)
        e->uncertain.push_back(tok);
    }
    if (alive) {
      ++i;
    } else {
      mark_range(t.tok_begin[i + 1], t.tok_begin[t.end[i]], popped[d]);
      i = t.end[i];
    }
  }
  return e;
}

}  // namespace deepinfer::grammar
