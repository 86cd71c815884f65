// Vocabulary trie construction: sort token ids by bytes; shared prefixes become shared nodes.
#include "grammar/vocab.h"

#include <algorithm>

#include "core/error.h"
#include "grammar/mask_cache.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::grammar {

// Budget of the shared mask entries: a 128k vocabulary's entry is 16 KiB of bitmask, so about
// 4,000 distinct grammar-independent forms.
constexpr size_t kSharedMaskBytes = size_t{64} << 20;

Vocabulary::~Vocabulary() = default;

Vocabulary::Vocabulary(std::vector<std::string> token_bytes, int32_t eos_id, std::vector<char> is_special)
    : token_bytes_(std::move(token_bytes)),
      is_special_(std::move(is_special)),
      eos_id_(eos_id),
      shared_masks_(std::make_unique<SharedMaskCache>(kSharedMaskBytes)) {
  DI_CHECK(is_special_.empty() || is_special_.size() == token_bytes_.size(), "grammar vocabulary: is_special has ",
           is_special_.size(), " entries, expected ", token_bytes_.size());
  DI_CHECK(eos_id_ >= -1 && eos_id_ < size(), "grammar vocabulary: eos id ", eos_id_, " outside [0, ", size(), ")");
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < size(); ++id)
    if (id != eos_id_ && !this->is_special(id) && !token_bytes_[id].empty() && token_bytes_[id].size() < 65535)
      ids.push_back(id);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return token_bytes_[a] < token_bytes_[b]; });
  TokenTrie& t = trie_;
  t.sorted_tokens = ids;
  std::vector<int32_t> path;  // node index per depth of the previous token
  const std::string* prev = nullptr;
  std::vector<int32_t> token_node(ids.size());
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::string& s = token_bytes_[ids[k]];
    if (s.size() > static_cast<size_t>(kShortTokenBytes)) t.long_positions.push_back(static_cast<int32_t>(k));
    size_t lcp = 0;
    if (prev)
      while (lcp < s.size() && lcp < prev->size() && s[lcp] == (*prev)[lcp]) ++lcp;
    path.resize(lcp);
    for (size_t d = lcp; d < s.size(); ++d) {
      t.parent.push_back(d == 0 ? -1 : path[d - 1]);
      path.push_back(t.num_nodes());
      t.byte.push_back(static_cast<uint8_t>(s[d]));
      t.depth.push_back(static_cast<uint16_t>(d + 1));
    }
    token_node[k] = path.back();
    t.max_depth = std::max<int32_t>(t.max_depth, static_cast<int32_t>(s.size()));
    prev = &s;
  }
  t.node_of_position = token_node;
  const int32_t n = t.num_nodes();
  t.end.assign(n, n);
  std::vector<int32_t> open;
  for (int32_t i = 0; i < n; ++i) {
    while (!open.empty() && t.depth[open.back()] >= t.depth[i]) {
      t.end[open.back()] = i;
      open.pop_back();
    }
    open.push_back(i);
  }
  t.tok_begin.assign(n + 1, static_cast<int32_t>(ids.size()));
  for (size_t k = ids.size(); k-- > 0;) t.tok_begin[token_node[k]] = static_cast<int32_t>(k);
  for (int32_t i = n - 1; i >= 0; --i) t.tok_begin[i] = std::min(t.tok_begin[i], t.tok_begin[i + 1]);
}

std::shared_ptr<const Vocabulary> vocabulary_from_tokenizer(const Tokenizer& tokenizer,
                                                            int32_t vocab_size) {
  const int32_t n = vocab_size < 0 ? tokenizer.vocab_size() : vocab_size;
  std::vector<std::string> bytes(static_cast<size_t>(n));
  std::vector<char> special(static_cast<size_t>(n), 1);
  for (int32_t id = 0; id < n && id < tokenizer.vocab_size(); ++id) {
    if (!tokenizer.has_token(id)) continue;
    bytes[id] = tokenizer.token_bytes(id);
    special[id] = tokenizer.is_special(id) ? 1 : 0;
  }
  return std::make_shared<Vocabulary>(std::move(bytes), tokenizer.eos_id(), std::move(special));
}

}  // namespace deepinfer::grammar
