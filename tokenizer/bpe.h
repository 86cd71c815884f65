// BpeModel: byte-level BPE over raw bytes. A word's bytes start as one symbol each
// (byte_to_id), then merges apply lowest rank first, leftmost among equal ranks, exactly as HF
// `tokenizers` (its Word::merge_all with a priority queue). Results are cached per word.
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace deepinfer::tokenizer_detail {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// Thread-safe word -> ids cache, sharded by hash so threads rarely contend. Inserts stop when
// full (as HF's cache), so memory stays bounded.
class WordCache {
 public:
  bool lookup(std::string_view word, std::vector<int32_t>& out) const;
  void insert(std::string_view word, std::span<const int32_t> ids) const;

 private:
  static constexpr size_t kNumShards = 16;
  static constexpr size_t kMaxEntriesPerShard = 8192;
  struct Shard {
    std::mutex mutex;
    StringMap<std::vector<int32_t>> words;
  };
  mutable std::array<Shard, kNumShards> shards_;
};

struct Merge {
  uint32_t rank;
  int32_t new_id;
};

class BpeModel {
 public:
  std::array<int32_t, 256> byte_to_id{};  // -1: the byte's character is not in the vocab
  std::unordered_map<uint64_t, Merge> merges;  // key: (left id << 32) | right id
  StringMap<int32_t> bytes_to_id;              // vocab tokens by their raw bytes (ignore_merges)
  bool ignore_merges = false;
  std::optional<int32_t> unk_id;
  bool fuse_unk = false;

  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

  // Appends the ids of one pre-tokenized piece.
  void encode_word(std::string_view bytes, std::vector<int32_t>& out) const;

 private:
  void merge_word(std::string_view bytes, std::vector<int32_t>& out) const;
  static constexpr size_t kMaxCachedWordBytes = 256;
  WordCache cache_;
};

}  // namespace deepinfer::tokenizer_detail
