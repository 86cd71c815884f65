// BPE merge loop and word cache; see bpe.h.
#include "tokenizer/bpe.h"

#include <queue>

namespace deepinfer::tokenizer_detail {

bool WordCache::lookup(std::string_view word, std::vector<int32_t>& out) const {
  Shard& shard = shards_[StringHash{}(word) % kNumShards];
  std::lock_guard<std::mutex> lock(shard.mutex);
  auto it = shard.words.find(word);
  if (it == shard.words.end()) return false;
  out.insert(out.end(), it->second.begin(), it->second.end());
  return true;
}

void WordCache::insert(std::string_view word, std::span<const int32_t> ids) const {
  Shard& shard = shards_[StringHash{}(word) % kNumShards];
  std::lock_guard<std::mutex> lock(shard.mutex);
  if (shard.words.size() >= kMaxEntriesPerShard) return;
  shard.words.emplace(std::string(word), std::vector<int32_t>(ids.begin(), ids.end()));
}

void BpeModel::encode_word(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.size() == 1 && byte_to_id[static_cast<uint8_t>(bytes[0])] >= 0) {
    out.push_back(byte_to_id[static_cast<uint8_t>(bytes[0])]);
    return;
  }
  if (ignore_merges) {
    auto it = bytes_to_id.find(bytes);
    if (it != bytes_to_id.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = bytes.size() <= kMaxCachedWordBytes;
  if (cacheable && cache_.lookup(bytes, out)) return;
  const size_t first = out.size();
  merge_word(bytes, out);
  if (cacheable) cache_.insert(bytes, std::span<const int32_t>(out).subspan(first));
}

namespace {

// One symbol of the word being merged: a doubly linked list over a vector; a merged-away
// symbol has num_bytes == 0.
struct Symbol {
  int32_t id;
  int32_t prev, next;
  uint32_t num_bytes;
};

struct Candidate {
  uint32_t rank;
  uint32_t pos;  // index of the left symbol
  int32_t new_id;
  // std::priority_queue pops the largest: invert so the lowest rank, then lowest pos, wins.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

void BpeModel::merge_word(std::string_view bytes, std::vector<int32_t>& out) const {
  std::vector<Symbol> symbols;
  symbols.reserve(bytes.size());
  // Initial symbols; missing bytes become unk (fused if asked) or are dropped, as HF.
  uint32_t pending_unk_bytes = 0;  // > 0: an unk symbol waiting to be pushed
  auto push = [&](int32_t id, uint32_t num_bytes) {
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, num_bytes});
  };
  for (char c : bytes) {
    const int32_t id = byte_to_id[static_cast<uint8_t>(c)];
    if (id >= 0) {
      if (pending_unk_bytes > 0) push(*unk_id, pending_unk_bytes);
      pending_unk_bytes = 0;
      push(id, 1);
    } else if (unk_id) {
      if (pending_unk_bytes > 0 && !fuse_unk) {
        push(*unk_id, pending_unk_bytes);
        pending_unk_bytes = 0;
      }
      pending_unk_bytes += 1;
    }
  }
  if (pending_unk_bytes > 0) push(*unk_id, pending_unk_bytes);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  std::priority_queue<Candidate> queue;
  auto consider = [&](int32_t pos) {
    const Symbol& left = symbols[static_cast<size_t>(pos)];
    if (left.next < 0) return;
    auto it = merges.find(pair_key(left.id, symbols[static_cast<size_t>(left.next)].id));
    if (it != merges.end()) queue.push({it->second.rank, static_cast<uint32_t>(pos), it->second.new_id});
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) consider(static_cast<int32_t>(i));

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.num_bytes == 0 || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    // A stale entry: the pair at this position changed since it was queued.
    auto it = merges.find(pair_key(left.id, right.id));
    if (it == merges.end() || it->second.new_id != top.new_id) continue;
    left.id = top.new_id;
    left.num_bytes += right.num_bytes;
    right.num_bytes = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = static_cast<int32_t>(top.pos);
    if (left.prev >= 0) consider(left.prev);
    consider(static_cast<int32_t>(top.pos));
  }
  for (int32_t pos = 0; pos >= 0; pos = symbols[static_cast<size_t>(pos)].next) {
    out.push_back(symbols[static_cast<size_t>(pos)].id);
  }
}

}  // namespace deepinfer::tokenizer_detail
