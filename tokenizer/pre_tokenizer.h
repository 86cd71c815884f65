// PreTokenizer: HF pre-tokenizers that cut text into the pieces BPE sees. Supported: Split
// (Regex or String pattern; behaviors Isolated, Removed, MergedWithPrevious, MergedWithNext,
// Contiguous; invert), Sequence, and ByteLevel (add_prefix_space, use_regex) as the last step.
// We run BPE on raw bytes, so ByteLevel's byte->character mapping is implicit.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace deepinfer::tokenizer_detail {

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizerStep {
  enum Kind { kSplit, kByteLevel } kind = kSplit;
  std::unique_ptr<Regex> regex;  // Split pattern, or GPT-2's regex for ByteLevel use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel
};

class PreTokenizer {
 public:
  std::vector<PreTokenizerStep> steps;  // flattened Sequence, in order

  // Per-call state: match data per regex and span buffers per depth.
  struct Scratch {
    explicit Scratch(const PreTokenizer& pre_tokenizer);
    std::vector<std::unique_ptr<MatchScratch>> match;
    std::vector<std::vector<std::pair<size_t, size_t>>> pieces;
    std::deque<std::string> arena;  // texts with a prefix space added
  };

  // Calls on_piece(piece) for every non-empty piece of `text` (valid UTF-8), in order.
  void split(std::string_view text, Scratch& scratch,
             const std::function<void(std::string_view)>& on_piece) const;

 private:
  void split_from(size_t step, std::string_view text, Scratch& scratch,
                  const std::function<void(std::string_view)>& on_piece) const;
};

// GPT-2's pattern, which ByteLevel's use_regex applies.
extern const char* const kGpt2Pattern;

}  // namespace deepinfer::tokenizer_detail
