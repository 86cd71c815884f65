// The trie walk behind every mask entry (see trie_walk.h).
#include "grammar/trie_walk.h"

#include <algorithm>
#include <cstring>

#include "grammar/mask_cache.h"
#include "grammar/stack.h"

namespace deepinfer::grammar {
namespace {

inline void set_bit(uint32_t* mask, int32_t id) { mask[id >> 5] |= 1u << (id & 31); }

// Subtrees with fewer tokens are walked again rather than cached.
constexpr int32_t kMinCachedSubtreeTokens = 64;
// X's DFA must be small to key the vocabulary-wide subtree cache: a counting state (a string
// with maxLength) is rarely met again, and its subtrees (up to 4 bytes per token of the
// vocabulary) would fill the cache before the common forms (string content, numbers) arrive.
constexpr int32_t kMaxSubtreeDfaStates = 64;
// A walk whose cacheable subtrees under one form hold at least this many tokens per mask word
// (so their (word, bits) pairs outnumber a dense mask's words), after at least 2 first bytes,
// builds the form's union (FormUnion) for the walks after it.
constexpr int32_t kMinUnionTokensPerWord = 4;

void append_i32(std::string& out, int32_t x) {
  char buf[sizeof(x)];
  std::memcpy(buf, &x, sizeof(x));
  out.append(buf, sizeof(x));
}

std::string subtree_key(int32_t node, int32_t form_or_state) {
  std::string key;
  append_i32(key, node);
  append_i32(key, form_or_state);
  return key;
}

// The union of the cached subtrees under `form` of every first byte (depth-1 node) that has one.
std::shared_ptr<FormUnion> build_union(const TokenTrie& t, const SubtreeCache& shared, int32_t form,
                                       int32_t num_words) {
  auto u = std::make_shared<FormUnion>();
  u->dense.assign(num_words, 0);
  for (int32_t i = 0; i < t.num_nodes(); i = t.end[i]) {
    auto r = shared.find(subtree_key(i, form));
    if (!r) continue;
    for (auto [w, bits] : r->accepted_words) u->dense[w] |= bits;
    u->by_byte[t.byte[i]] = std::move(r);
  }
  return u;
}

// Candidate positions, or all positions when kRestricted is false: `cursor` only moves forward
// because the preorder walk visits token positions in ascending order.
template <bool kRestricted>
class Candidates {
 public:
  explicit Candidates(const std::vector<int32_t>* c) : c_(c) {}
  // The subtree's positions [begin, end) hold a candidate (skipping those before begin).
  bool any_in(int32_t begin, int32_t end) {
    const std::vector<int32_t>& c = *c_;
    while (cursor_ < c.size() && c[cursor_] < begin) ++cursor_;
    return cursor_ < c.size() && c[cursor_] < end;
  }
  // The first candidate not before the last any_in's range; only when not exhausted().
  int32_t next() const { return (*c_)[cursor_]; }
  bool exhausted() const {
    if constexpr (!kRestricted) return false;
    return cursor_ >= c_->size();
  }
  // Calls f(position) for every candidate in [begin, end), which must follow earlier ranges.
  template <typename F>
  void for_each(int32_t begin, int32_t end, F&& f) {
    if constexpr (!kRestricted) {
      for (int32_t k = begin; k < end; ++k) f(k);
    } else {
      const std::vector<int32_t>& c = *c_;
      while (cursor_ < c.size() && c[cursor_] < begin) ++cursor_;
      for (; cursor_ < c.size() && c[cursor_] < end; ++cursor_) f(c[cursor_]);
    }
  }

 private:
  const std::vector<int32_t>* c_;
  size_t cursor_ = 0;
};

template <bool kRestricted>
void walk(const Automaton& a, const TokenTrie& t, const std::vector<int32_t>& states, bool rooted,
          const std::vector<int32_t>* candidates, SubtreeCache* subtrees, SubtreeCache* shared, WalkScratch& ws,
          uint32_t* accepted, std::vector<int32_t>& uncertain, int32_t num_words) {
  Candidates<kRestricted> cand(candidates);
  StackArena& arena = ws.arena;
  StepScratch& scratch = ws.step;
  arena.clear();
  int32_t top = rooted ? kRoot : kSentinel;
  for (size_t k = states.size(); k-- > 0;) top = arena.make(states[k], top);
  // Per depth: either a fast element (state, parent) stepped as a plain DFA while it meets no
  // call and no rule end above the bottom, or a general element set (fast[d] == -1).
  const int32_t max_depth = t.max_depth + 1;
  std::vector<int32_t>& fast = ws.fast;
  std::vector<int32_t>& fast_parent = ws.fast_parent;
  std::vector<std::vector<int32_t>>& sets = ws.sets;
  std::vector<char>& popped = ws.popped;  // the sentinel popped at depth 1..d
  fast.assign(max_depth, -1);
  fast_parent.assign(max_depth, -1);
  popped.assign(max_depth, 0);
  if (static_cast<int32_t>(sets.size()) < max_depth) sets.resize(max_depth);
  uncertain.clear();
  // Depth 0: only s1's own byte edges (its calls were expanded into other elements).
  fast[0] = states[0];
  fast_parent[0] = arena[top].parent;
  // Depth-1 subtrees of a single element (X, P) are walked as X over the sentinel: the result
  // depends on X alone (cached); tokens in which X's rule ends before their end depend on P and
  // are `deferred`, then classified by one restricted walk from the real stack at the end.
  std::vector<int32_t> deferred, deferred_in_record;
  std::unordered_map<int32_t, int32_t> forms;  // X -> form id in `shared` (-1 when none)
  std::string form;
  // Per vocabulary-wide form met after a first byte: its union (FormUnion, null if none yet)
  // and which of the union's bytes it covered here; how many first bytes and tokens below
  // them led to the form.
  struct FormUse {
    std::shared_ptr<const FormUnion> u;
    std::array<bool, 256> covered{};
    int32_t num_bytes = 0;
    int64_t num_tokens = 0;
  };
  std::unordered_map<int32_t, FormUse> form_uses;
  // Accepted ids of the subtree being recorded, as a bitmask (ws.record_bits): read out in word
  // order at the end (sorting the ids was 10% of all walk time).
  std::vector<uint32_t>& record_bits = ws.record_bits;
  if (!kRestricted) record_bits.resize(num_words, 0);
  std::vector<int32_t>* uncertain_out = &uncertain;
  std::shared_ptr<SubtreeResult> record;
  SubtreeCache* record_cache = nullptr;
  std::string record_key;
  int32_t record_end = -1;
  auto finish_record = [&] {
    for (int32_t w = 0; w < num_words; ++w) {
      if (record_bits[w] == 0) continue;
      record->accepted_words.push_back({w, record_bits[w]});
      record_bits[w] = 0;
    }
    record->uncertain = std::move(deferred_in_record);
    record_cache->insert(record_key, std::move(record));
    record = nullptr;
  };
  const int32_t n = t.num_nodes();
  for (int32_t i = 0; i < n;) {
    if constexpr (kRestricted) {
      if (!cand.any_in(t.tok_begin[i], t.tok_begin[t.end[i]])) {
        if (cand.exhausted()) break;
        // Jump to the next node whose subtree holds the next candidate: the shallowest ancestor
        // of the node where it ends that comes after i (its parent is on the current path).
        // Stepping over the siblings in between (up to ~250 at depth 1, each two cache misses)
        // was most of the time of a restricted walk, which visits ~100 nodes.
        int32_t j = t.node_of_position[cand.next()];
        while (t.parent[j] > i) j = t.parent[j];
        i = j;
        continue;
      }
    } else {
      if (uncertain_out != &uncertain && i >= record_end) {
        // Leaving a deferred subtree.
        deferred.insert(deferred.end(), deferred_in_record.begin(), deferred_in_record.end());
        if (record) finish_record();
        deferred_in_record.clear();
        uncertain_out = &uncertain;
      }
    }
    const int32_t d = t.depth[i];
    const uint8_t b = t.byte[i];
    bool alive = false, pop = false, general = false;
    fast[d] = -1;
    if (fast[d - 1] >= 0) {
      const int32_t ns = a.next(fast[d - 1], b);
      if (ns >= 0) {
        const uint8_t f = a.flags[ns];
        const int32_t parent = fast_parent[d - 1];
        if (!(f & Automaton::kHasCalls) && (!(f & Automaton::kFinal) || parent < 0)) {
          pop = f & Automaton::kFinal;  // parent < 0: the bottom (root when rooted)
          if (f & Automaton::kHasBytes) {
            alive = true;
            fast[d] = ns;
            fast_parent[d] = parent;
          }
        } else {
          // A call, or the rule ends inside the token: continue through the stack.
          StepFlags flags;
          sets[d].clear();
          scratch.visited.clear();
          close_element(a, arena, arena.make(ns, parent), sets[d], flags, scratch);
          general = true;
          pop = rooted ? flags.root_pop : flags.sentinel_pop;
          alive = !sets[d].empty();
        }
      }
    } else {
      StepFlags flags;
      step_byte(a, arena, sets[d - 1], b, sets[d], flags, scratch);
      general = true;
      pop = rooted ? flags.root_pop : flags.sentinel_pop;
      alive = !sets[d].empty();
    }
    if (general && sets[d].size() == 1) {
      fast[d] = arena[sets[d][0]].state;
      fast_parent[d] = arena[sets[d][0]].parent;
    }
    const bool popped_before = popped[d - 1];
    popped[d] = popped_before || (pop && !rooted);
    cand.for_each(t.tok_begin[i], t.tok_begin[i + 1], [&](int32_t k) {
      if (alive || pop) {
        set_bit(accepted, t.sorted_tokens[k]);
        if (!kRestricted && record) set_bit(record_bits.data(), t.sorted_tokens[k]);
      } else if (popped_before) {
        uncertain_out->push_back(k);
      }
    });
    if (!kRestricted && alive && d == 1 && fast[1] >= 0 && !rooted && !popped[1] &&
        t.tok_begin[t.end[i]] - t.tok_begin[i + 1] >= kMinCachedSubtreeTokens) {
      // Key: the first byte (node i) and X, by the canonical form of the (small) pushdown
      // automaton reachable from X, calls included (then the vocabulary's cache serves every
      // state and grammar with an equal form), else by its state number.
      SubtreeCache* cache = subtrees;
      auto [it, inserted] = forms.try_emplace(fast[1], -1);
      if (inserted && shared && !(subtrees && subtrees->find_state_form(fast[1], it->second))) {
        if (canonical_dfa_key(a, fast[1], false, kMaxSubtreeDfaStates, t.max_depth, form, true))
          it->second = shared->form_id(form);
        if (subtrees) subtrees->insert_state_form(fast[1], it->second);
      }
      const int32_t form_id = it->second;
      if (form_id >= 0) {
        cache = shared;
        auto [use, first_use] = form_uses.try_emplace(form_id);
        if (first_use) use->second.u = shared->find_union(form_id);
        FormUse& fu = use->second;
        ++fu.num_bytes;
        fu.num_tokens += t.tok_begin[t.end[i]] - t.tok_begin[i + 1];
        if (fu.u && fu.u->by_byte[b]) {
          // Covered by the union, applied once at the end.
          fu.covered[b] = true;
          i = t.end[i];
          continue;
        }
      }
      std::string key = subtree_key(i, form_id >= 0 ? form_id : fast[1]);
      fast_parent[1] = kSentinel;
      if (auto hit = cache ? cache->find(key) : nullptr) {
        for (auto [w, bits] : hit->accepted_words) accepted[w] |= bits;
        deferred.insert(deferred.end(), hit->uncertain.begin(), hit->uncertain.end());
        i = t.end[i];
        continue;
      }
      uncertain_out = &deferred_in_record;
      record_end = t.end[i];
      if (cache) {
        record = std::make_shared<SubtreeResult>();
        record_cache = cache;
        record_key = std::move(key);
      }
    }
    if (alive) {
      ++i;
    } else {
      if (popped[d]) cand.for_each(t.tok_begin[i + 1], t.tok_begin[t.end[i]], [&](int32_t k) { uncertain_out->push_back(k); });
      i = t.end[i];
    }
  }
  if (uncertain_out != &uncertain) {
    deferred.insert(deferred.end(), deferred_in_record.begin(), deferred_in_record.end());
    if (record) finish_record();
  }
  if constexpr (!kRestricted) {
    bool unions_used = false;
    for (auto& [f, fu] : form_uses) {
      if (!fu.u) {
        // Build the union of a form met after many first bytes, for the walks after this one.
        if (fu.num_bytes >= 2 && fu.num_tokens >= int64_t{kMinUnionTokensPerWord} * num_words &&
            !shared->union_decided(f))
          shared->insert_union(f, build_union(t, *shared, f, num_words));
        continue;
      }
      // The union minus its bytes that were not covered here (they were walked, hit, or are
      // dead from this state): subtrees of distinct first bytes hold disjoint tokens.
      unions_used = true;
      std::vector<uint32_t>& rest = ws.record_bits;  // all zero here
      rest = fu.u->dense;
      for (int32_t c = 0; c < 256; ++c) {
        const auto& r = fu.u->by_byte[c];
        if (!r) continue;
        if (fu.covered[c]) {
          deferred.insert(deferred.end(), r->uncertain.begin(), r->uncertain.end());
        } else {
          for (auto [w, bits] : r->accepted_words) rest[w] &= ~bits;
        }
      }
      for (int32_t w = 0; w < num_words; ++w) accepted[w] |= rest[w];
      std::fill(rest.begin(), rest.end(), 0u);
    }
    if (unions_used) std::sort(deferred.begin(), deferred.end());
  }
  if (deferred.empty()) return;
  // Deferred tokens, exactly, from the real stack (ascending: collected in preorder). This
  // walk reuses ws: the loop above is done with it.
  std::vector<int32_t> r;
  walk<true>(a, t, states, rooted, &deferred, nullptr, nullptr, ws, accepted, r, num_words);
  std::vector<int32_t> merged(uncertain.size() + r.size());
  std::merge(uncertain.begin(), uncertain.end(), r.begin(), r.end(), merged.begin());
  uncertain = std::move(merged);
}

}  // namespace

void walk_trie(const Automaton& a, const Vocabulary& v, const std::vector<int32_t>& states, bool rooted,
               const std::vector<int32_t>* candidates, SubtreeCache* subtrees, WalkScratch& ws, uint32_t* accepted,
               std::vector<int32_t>& uncertain) {
  if (candidates)
    walk<true>(a, v.trie(), states, rooted, candidates, nullptr, nullptr, ws, accepted, uncertain, v.num_mask_words());
  else
    walk<false>(a, v.trie(), states, rooted, nullptr, subtrees, &v.shared_masks().subtrees(), ws, accepted, uncertain,
                v.num_mask_words());
}

void MaskEntry::or_into(uint32_t* mask) const {
  for (size_t w = 0; w < dense.size(); ++w) mask[w] |= dense[w];
  for (auto [w, b] : sparse) mask[w] |= b;
}

void MaskEntry::take_bits_at(std::vector<uint32_t>& bits, const std::vector<int32_t>& positions, const TokenTrie& t) {
  if (positions.size() * 2 > bits.size()) {
    take_bits(bits);
    return;
  }
  dense.clear();
  sparse.clear();
  for (int32_t k : positions) {
    const int32_t w = t.sorted_tokens[k] >> 5;
    if (bits[w] == 0) continue;
    sparse.push_back({w, bits[w]});
    bits[w] = 0;
  }
  std::sort(sparse.begin(), sparse.end());
}

void MaskEntry::take_bits(std::vector<uint32_t>& bits) {
  const size_t num_words = bits.size();
  size_t num_set = 0;
  for (uint32_t b : bits) num_set += b != 0;
  dense.clear();
  sparse.clear();
  // A pair is two words: sparse while it is at most a quarter of the dense size.
  if (num_set * 8 > num_words) {
    dense = bits;
    std::fill(bits.begin(), bits.end(), 0u);
    return;
  }
  sparse.reserve(num_set);
  for (size_t w = 0; w < num_words; ++w) {
    if (bits[w] == 0) continue;
    sparse.push_back({static_cast<int32_t>(w), bits[w]});
    bits[w] = 0;
  }
}

std::shared_ptr<const SubtreeResult> SubtreeCache::find(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = results_.find(key);
  return it == results_.end() ? nullptr : it->second;
}

void SubtreeCache::insert(const std::string& key, std::shared_ptr<const SubtreeResult> r) {
  const size_t num_bytes = r->accepted_words.size() * sizeof(r->accepted_words[0]) +
                           r->uncertain.size() * sizeof(int32_t) + key.size();
  std::lock_guard<std::mutex> lock(mu_);
  if (num_bytes_ + num_bytes > max_bytes_) return;
  if (results_.try_emplace(key, std::move(r)).second) num_bytes_ += num_bytes;
}

}  // namespace deepinfer::grammar

namespace deepinfer::grammar {

int32_t SubtreeCache::form_id(const std::string& form) {
  std::lock_guard<std::mutex> lock(mu_);
  return form_ids_.try_emplace(form, static_cast<int32_t>(form_ids_.size())).first->second;
}

bool SubtreeCache::find_state_form(int32_t state, int32_t& form) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = state_forms_.find(state);
  if (it == state_forms_.end()) return false;
  form = it->second;
  return true;
}

void SubtreeCache::insert_state_form(int32_t state, int32_t form) {
  std::lock_guard<std::mutex> lock(mu_);
  state_forms_.try_emplace(state, form);
}

std::shared_ptr<const FormUnion> SubtreeCache::find_union(int32_t form) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = unions_.find(form);
  return it == unions_.end() ? nullptr : it->second;
}

size_t SubtreeCache::num_unions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::count_if(unions_.begin(), unions_.end(), [](const auto& kv) { return kv.second != nullptr; });
}

bool SubtreeCache::union_decided(int32_t form) const {
  std::lock_guard<std::mutex> lock(mu_);
  return unions_.count(form) > 0;
}

void SubtreeCache::insert_union(int32_t form, std::shared_ptr<const FormUnion> u) {
  const size_t num_bytes = u->dense.size() * sizeof(uint32_t);  // the subtrees are counted already
  std::lock_guard<std::mutex> lock(mu_);
  // Full: remember the form without a union, so later walks do not build it again each time.
  if (num_bytes_ + num_bytes > max_bytes_) {
    unions_.try_emplace(form, nullptr);
    return;
  }
  if (unions_.try_emplace(form, std::move(u)).second) num_bytes_ += num_bytes;
}

}  // namespace deepinfer::grammar
