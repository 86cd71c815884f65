// Added-token matching; see added_tokens.h.
#include "tokenizer/added_tokens.h"

#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer_detail {

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : first_byte_(256, 0) {
  terminal_.push_back(-1);  // the root
  bool any_single_word = false;
  for (auto& token : tokens) {
    if (token.content.empty()) continue;
    const auto index = static_cast<int32_t>(tokens_.size());
    int32_t node = 0;
    for (char c : token.content) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        const auto child = static_cast<int32_t>(terminal_.size());
        terminal_.push_back(-1);
        it = edges_.emplace(key, child).first;
      }
      node = it->second;
    }
    // A later token with the same content replaces the earlier one (same content, same match).
    terminal_[static_cast<size_t>(node)] = index;
    first_byte_[static_cast<uint8_t>(token.content[0])] = 1;
    any_single_word |= token.single_word;
    tokens_.push_back(std::move(token));
  }
  if (any_single_word) {
    word_at_end_ = std::make_unique<Regex>(R"(\w$)", false, "added token single_word");
    word_at_start_ = std::make_unique<Regex>(R"(^\w)", false, "added token single_word");
  }
}

int32_t AddedTokenMatcher::longest_at(std::string_view text, size_t pos, size_t& match_end) const {
  int32_t best = -1;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[i]));
    if (it == edges_.end()) break;
    node = it->second;
    if (terminal_[static_cast<size_t>(node)] >= 0) {
      best = terminal_[static_cast<size_t>(node)];
      match_end = i + 1;
    }
  }
  return best;
}

bool AddedTokenMatcher::is_word_char_before(std::string_view text) const {
  MatchScratch scratch(*word_at_end_);
  return word_at_end_->search(text, scratch);
}

bool AddedTokenMatcher::is_word_char_after(std::string_view text) const {
  MatchScratch scratch(*word_at_start_);
  return word_at_start_->search(text, scratch);
}

void AddedTokenMatcher::split(std::string_view full_text, size_t range_begin, size_t range_end,
                              std::vector<Segment>& out) const {
  // HF matches within each piece on its own: offsets below are relative to `sentence`.
  const std::string_view sentence = full_text.substr(range_begin, range_end - range_begin);
  auto emit = [&](size_t begin, size_t end, int32_t id) {
    out.push_back({range_begin + begin, range_begin + end, id});
  };
  size_t start_offset = 0;  // end of the previous token
  size_t pos = 0;
  while (pos < sentence.size() && !tokens_.empty()) {
    if (!first_byte_[static_cast<uint8_t>(sentence[pos])]) {
      ++pos;
      continue;
    }
    size_t stop = 0;
    const int32_t index = longest_at(sentence, pos, stop);
    if (index < 0) {
      ++pos;
      continue;
    }
    size_t start = pos;
    pos = stop;  // the match is consumed even when a flag discards it, as HF's iterator
    const AddedToken& token = tokens_[static_cast<size_t>(index)];
    if (token.single_word) {
      const bool start_space = start == 0 || !is_word_char_before(sentence.substr(0, start));
      const bool stop_space = stop == sentence.size() || !is_word_char_after(sentence.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) {
      // Leftmost start of the whitespace run that ends at `start`.
      size_t new_start = start;
      while (new_start > 0) {
        size_t char_begin = new_start - 1;
        while (char_begin > 0 && (static_cast<uint8_t>(sentence[char_begin]) & 0xC0) == 0x80) --char_begin;
        size_t num_bytes = 0;
        if (!is_unicode_white_space(decode_code_point(sentence, char_begin, num_bytes))) break;
        new_start = char_begin;
      }
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      while (stop < sentence.size()) {
        size_t num_bytes = 0;
        if (!is_unicode_white_space(decode_code_point(sentence, stop, num_bytes))) break;
        stop += num_bytes;
      }
      pos = stop;
    }
    if (start_offset < start) emit(start_offset, start, -1);
    emit(start, stop, token.id);
    start_offset = stop;
  }
  if (start_offset != sentence.size()) emit(start_offset, sentence.size(), -1);
}

}  // namespace deepinfer::tokenizer_detail
