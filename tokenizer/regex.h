// Regex: a compiled PCRE2 pattern (UTF + UCP, JIT when available) with the find-all loop of
// Oniguruma as HF `tokenizers` uses it, so Split pre-tokenizers cut text at the same places.
// The compiled code is read-only and shared by all threads; each call brings its own
// MatchScratch (PCRE2 match data).
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace deepinfer::tokenizer_detail {

class Regex;

class MatchScratch {
 public:
  explicit MatchScratch(const Regex& regex);
  ~MatchScratch();
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;

 private:
  friend class Regex;
  void* match_data_;  // pcre2_match_data_8*
};

class Regex {
 public:
  // Throws Error "<where>: invalid regex ...: <PCRE2 message> at offset N". `literal` matches
  // the pattern as plain text (HF's {"String": ...} patterns).
  Regex(const std::string& pattern, bool literal, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(begin, end) for each match in `subject` (valid UTF-8, not re-checked), in
  // order; empty matches right after the previous match are skipped, as Oniguruma's find_iter.
  void find_all(std::string_view subject, MatchScratch& scratch,
                const std::function<void(size_t, size_t)>& on_match) const;
  // True when the pattern matches somewhere in `subject`.
  bool search(std::string_view subject, MatchScratch& scratch) const;

 private:
  friend class MatchScratch;
  // Returns false when there is no match; fills [begin, end).
  bool match_at(std::string_view subject, size_t start, MatchScratch& scratch, size_t& begin,
                size_t& end) const;
  void* code_;           // pcre2_code_8*
  void* match_context_;  // pcre2_match_context_8* (bounded backtracking)
  std::string where_;
};

}  // namespace deepinfer::tokenizer_detail
