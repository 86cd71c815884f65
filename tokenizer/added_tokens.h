// AddedTokenMatcher: finds added/special tokens in text before pre-tokenization, as HF's
// AddedVocabulary: leftmost-longest matches over a byte trie, then the token's flags
// (single_word: discard unless at word boundaries; lstrip/rstrip: absorb adjacent whitespace).
// HF runs one matcher over the raw text for tokens with normalized=false, then another over
// the (normalized) remaining text for tokens with normalized=true.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/regex.h"

namespace deepinfer::tokenizer_detail {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

struct Segment {
  size_t begin, end;  // byte range in the text
  int32_t id;         // the added token's id, or -1 for plain text
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);  // empty contents are skipped

  bool empty() const { return tokens_.empty(); }
  // Appends the segments of text[begin, end) to `out`: tokens and the text between them.
  void split(std::string_view text, size_t begin, size_t end, std::vector<Segment>& out) const;

 private:
  // Longest token starting at text[pos], or -1 (index into tokens_); sets match_end.
  int32_t longest_at(std::string_view text, size_t pos, size_t& match_end) const;
  bool is_word_char_before(std::string_view text) const;  // \w at the end of text
  bool is_word_char_after(std::string_view text) const;   // \w at the start of text

  std::vector<AddedToken> tokens_;
  std::vector<uint8_t> first_byte_;                      // 256 flags
  std::unordered_map<uint64_t, int32_t> edges_;          // (node << 8 | byte) -> child node
  std::vector<int32_t> terminal_;                        // node -> token index or -1
  std::unique_ptr<Regex> word_at_end_, word_at_start_;   // only when a token is single_word
};

}  // namespace deepinfer::tokenizer_detail
