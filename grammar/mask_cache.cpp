// Mask entries per grammar, and the per-vocabulary store of grammar-independent ones.
#include "grammar/mask_cache.h"

#include <cstring>

namespace deepinfer::grammar {
namespace {

template <typename T>
void append_raw(std::string& out, T x) {
  char buf[sizeof(T)];
  std::memcpy(buf, &x, sizeof(T));
  out.append(buf, sizeof(T));
}

size_t entry_bytes(const MaskEntry& e) {
  return e.accepted.size() * sizeof(uint32_t) + e.uncertain.size() * sizeof(int32_t) + sizeof(MaskEntry);
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

bool canonical_dfa_key(const Automaton& a, int32_t state, bool rooted, int32_t max_states, std::string& key) {
  key.clear();
  key.push_back(rooted ? 'r' : 's');
  std::unordered_map<int32_t, int32_t> index{{state, 0}};
  std::vector<int32_t> order{state};
  for (size_t i = 0; i < order.size(); ++i) {
    const AutomatonState& st = a.states[order[i]];
    if (!st.calls.empty()) return false;
    key.push_back(st.final ? 'F' : 'N');
    append_raw(key, static_cast<uint16_t>(st.bytes.size()));
    for (const ByteEdge& e : st.bytes) {
      auto [it, inserted] = index.try_emplace(e.to, static_cast<int32_t>(order.size()));
      if (inserted) {
        if (static_cast<int32_t>(order.size()) >= max_states) return false;
        order.push_back(e.to);
      }
      key.push_back(static_cast<char>(e.lo));
      key.push_back(static_cast<char>(e.hi));
      append_raw(key, it->second);
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

const MaskEntry& MaskCache::get(const std::vector<int32_t>& states, bool rooted, const MaskEntry* prev) {
  std::string key(reinterpret_cast<const char*>(states.data()), states.size() * sizeof(int32_t));
  key.push_back(rooted ? 'r' : 's');
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) return *it->second;
  }
  // Computed outside the lock; a concurrent duplicate computation is harmless.
  std::shared_ptr<const MaskEntry> e;
  std::string shared_key;
  bool shareable = states.size() == 1 && canonical_dfa_key(a_, states[0], rooted, kMaxSharedDfaStates, shared_key);
  bool hit = false;
  if (shareable) {
    e = v_.shared_masks().find(shared_key);
    hit = e != nullptr;
  }
  if (!e) {
    e = std::make_shared<const MaskEntry>(states.size() == 1 ? walk_trie(a_, v_, states, rooted, nullptr, &subtrees_)
                                                             : walk_trie(a_, v_, states, rooted, &prev->uncertain));
    if (shareable) e = v_.shared_masks().insert(shared_key, e);
  }
  std::lock_guard<std::mutex> lock(mu_);
  num_shared_hits_ += hit;
  auto [it, inserted] = entries_.try_emplace(std::move(key), std::move(e));
  return *it->second;
}

}  // namespace deepinfer::grammar
