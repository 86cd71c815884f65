// Mask entries per grammar, and the per-vocabulary store of grammar-independent ones.
#include "grammar/mask_cache.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace deepinfer::grammar {
namespace {

template <typename T>
void append_raw(std::string& out, T x) {
  char buf[sizeof(T)];
  std::memcpy(buf, &x, sizeof(T));
  out.append(buf, sizeof(T));
}

size_t entry_bytes(const MaskEntry& e) {
  return e.dense.size() * sizeof(uint32_t) + e.sparse.size() * sizeof(e.sparse[0]) + e.uncertain.size() * sizeof(int32_t) +
         sizeof(MaskEntry);
}

}  // namespace

std::shared_ptr<const MaskEntry> SharedMaskCache::find(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : it->second;
}

std::shared_ptr<const MaskEntry> SharedMaskCache::insert(const std::string& key, std::shared_ptr<const MaskEntry> e) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end()) return it->second;
  const size_t num_bytes = entry_bytes(*e) + key.size();
  if (num_bytes_ + num_bytes > max_bytes_) return e;
  num_bytes_ += num_bytes;
  entries_.emplace(key, e);
  return e;
}

size_t SharedMaskCache::num_entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

size_t SharedMaskCache::num_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return num_bytes_;
}

bool canonical_dfa_key(const Automaton& a, int32_t state, bool rooted, int32_t max_states, int32_t max_depth,
                       std::string& key, bool with_calls, bool* complete) {
  if (complete) *complete = true;
  // Call edges are not bytes, so a depth reached through them would not be a least depth.
  if (with_calls) max_depth = std::numeric_limits<int32_t>::max();
  key.clear();
  // No key when a state with calls lies within max_depth bytes (the search would meet it).
  if (!with_calls && !a.call_distance.empty() && a.call_distance[state] <= max_depth) return false;
  key.push_back(rooted ? 'r' : 's');
  IdIndex index;  // state -> index in the canonical numbering
  bool inserted;
  index.find_or_insert(static_cast<uint32_t>(state), 0, inserted);
  // Breadth-first, so depth[i] (bytes from `state`) is the least depth of order[i] and is
  // non-decreasing along `order`.
  std::vector<int32_t> order{state}, depth{0};
  auto number = [&](int32_t to, int32_t to_depth, int32_t& id) {
    id = index.find_or_insert(static_cast<uint32_t>(to), static_cast<int32_t>(order.size()), inserted);
    if (!inserted) return true;
    if (static_cast<int32_t>(order.size()) >= max_states) return false;
    order.push_back(to);
    depth.push_back(to_depth);
    return true;
  };
  for (size_t i = 0; i < order.size(); ++i) {
    const AutomatonState& st = a.states[order[i]];
    if (!st.calls.empty() && !with_calls) return false;
    key.push_back(st.final ? 'F' : 'N');
    if (depth[i] >= max_depth) {
      if (complete) *complete = false;
      // Cut: no token reaches past this node, so only what the walk tests at a token's last
      // byte (final, has bytes) is part of the key, not where the edges lead.
      key.push_back(st.bytes.empty() ? 'x' : 'C');
      continue;
    }
    append_raw(key, static_cast<uint16_t>(st.bytes.size()));
    for (const ByteEdge& e : st.bytes) {
      int32_t id;
      if (!number(e.to, depth[i] + 1, id)) return false;
      key.push_back(static_cast<char>(e.lo));
      key.push_back(static_cast<char>(e.hi));
      append_raw(key, id);
    }
    if (!with_calls) continue;
    // A call: the callee's start and the return point, numbered like byte targets.
    append_raw(key, static_cast<uint16_t>(st.calls.size()));
    for (const CallEdge& c : st.calls) {
      for (int32_t to : {a.rule_start[c.rule], c.to}) {
        int32_t id;
        if (!number(to, depth[i], id)) return false;
        append_raw(key, id);
      }
    }
  }
  return true;
}

size_t MaskCache::num_entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

size_t MaskCache::num_shared_hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return num_shared_hits_;
}

const MaskEntry& MaskCache::get(const std::vector<int32_t>& states, bool rooted, const MaskEntry* prev,
                                WalkScratch& ws) {
  std::string key(reinterpret_cast<const char*>(states.data()), states.size() * sizeof(int32_t));
  key.push_back(rooted ? 'r' : 's');
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) return *it->second;
  }
  // Computed outside the lock; a concurrent duplicate computation is harmless.
  const TokenTrie& t = v_.trie();
  std::vector<uint32_t>& bits = ws.bits;  // all zero between walks
  bits.resize(v_.num_mask_words(), 0);
  auto e = std::make_shared<MaskEntry>();
  bool hit = false;
  if (states.size() > 1) {
    walk_trie(a_, v_, states, rooted, &prev->uncertain, nullptr, ws, bits.data(), e->uncertain);
  } else {
    // The vocabulary-wide key: the DFA reachable from the state within kShortTokenBytes. When
    // that is the whole reachable DFA (no state cut: string content, numbers, literals), the
    // entry decides every token ('A'); else only the short ones ('S': a count position of a
    // string with maxLength far from its bounds; the long tokens are walked per state).
    std::string shared_key;
    bool all_tokens = false;
    const bool shareable = canonical_dfa_key(a_, states[0], rooted, kMaxSharedDfaStates, kShortTokenBytes, shared_key,
                                             false, &all_tokens);
    if (shareable) shared_key.push_back(all_tokens ? 'A' : 'S');
    if (auto found = shareable ? v_.shared_masks().find(shared_key) : nullptr) {
      hit = true;
      found->or_into(bits.data());
      e->uncertain = found->uncertain;
      if (!all_tokens) {
        std::vector<int32_t> long_uncertain;
        walk_trie(a_, v_, states, rooted, &t.long_positions, nullptr, ws, bits.data(), long_uncertain);
        std::vector<int32_t> merged(e->uncertain.size() + long_uncertain.size());
        std::merge(e->uncertain.begin(), e->uncertain.end(), long_uncertain.begin(), long_uncertain.end(),
                   merged.begin());
        e->uncertain = std::move(merged);
      }
    } else {
      walk_trie(a_, v_, states, rooted, nullptr, &subtrees_, ws, bits.data(), e->uncertain);
      if (shareable) {
        // An 'S' entry is shared without the long tokens: another state with this key may
        // differ on them.
        auto shared = std::make_shared<MaskEntry>();
        std::vector<uint32_t> shared_bits = bits;
        shared->uncertain = e->uncertain;
        if (!all_tokens) {
          for (int32_t k : t.long_positions) {
            const int32_t id = t.sorted_tokens[k];
            shared_bits[id >> 5] &= ~(1u << (id & 31));
          }
          std::erase_if(shared->uncertain, [&](int32_t k) {
            return v_.token_bytes(t.sorted_tokens[k]).size() > static_cast<size_t>(kShortTokenBytes);
          });
        }
        shared->take_bits(shared_bits);
        v_.shared_masks().insert(shared_key, std::move(shared));
      }
    }
  }
  if (states.size() > 1)
    e->take_bits_at(bits, prev->uncertain, t);
  else
    e->take_bits(bits);
  std::lock_guard<std::mutex> lock(mu_);
  num_shared_hits_ += hit;
  auto [it, inserted] = entries_.try_emplace(std::move(key), std::move(e));
  return *it->second;
}

}  // namespace deepinfer::grammar
