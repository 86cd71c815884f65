// Split / Sequence / ByteLevel pre-tokenization, mirroring HF tokenizers' split semantics.
#include "tokenizer/pre_tokenizer.h"

#include <algorithm>

namespace deepinfer::tokenizer_detail {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

struct Span {
  size_t begin, end;
  bool is_match;
};

// Pieces of `text` for one Split step, as HF's NormalizedString::split (empty ones dropped).
void split_spans(const PreTokenizerStep& step, std::string_view text, MatchScratch& match,
                 std::vector<std::pair<size_t, size_t>>& out) {
  std::vector<Span> spans;
  size_t prev = 0;
  step.regex->find_all(text, match, [&](size_t begin, size_t end) {
    if (prev != begin) spans.push_back({prev, begin, step.invert});
    spans.push_back({begin, end, !step.invert});
    prev = end;
  });
  if (prev != text.size()) spans.push_back({prev, text.size(), step.invert});

  out.clear();
  bool previous_match = false;
  switch (step.behavior) {
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) out.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kRemoved:
      for (const Span& s : spans)
        if (!s.is_match) out.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kContiguous:
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !out.empty()) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().first = it->begin;
        } else {
          out.emplace_back(it->begin, it->end);
        }
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
}

}  // namespace

PreTokenizer::Scratch::Scratch(const PreTokenizer& pre_tokenizer) {
  for (const auto& step : pre_tokenizer.steps) {
    match.push_back(step.regex ? std::make_unique<MatchScratch>(*step.regex) : nullptr);
  }
  pieces.resize(pre_tokenizer.steps.size());
}

void PreTokenizer::split(std::string_view text, Scratch& scratch,
                         const std::function<void(std::string_view)>& on_piece) const {
  scratch.arena.clear();
  if (!text.empty()) split_from(0, text, scratch, on_piece);
}

// Depth-first: each piece of step k goes through steps k+1.. before the next piece, which
// yields HF's order without materialising every level.
void PreTokenizer::split_from(size_t step_index, std::string_view text, Scratch& scratch,
                              const std::function<void(std::string_view)>& on_piece) const {
  if (step_index == steps.size()) {
    on_piece(text);
    return;
  }
  const PreTokenizerStep& step = steps[step_index];
  if (step.kind == PreTokenizerStep::kByteLevel) {
    if (step.add_prefix_space && text.front() != ' ') {
      std::string& prefixed = scratch.arena.emplace_back(1, ' ');
      prefixed.append(text);
      text = prefixed;
    }
    if (!step.regex) {
      split_from(step_index + 1, text, scratch, on_piece);
      return;
    }
  }
  // Pieces of this level live in a per-depth buffer; deeper levels use their own.
  auto& pieces = scratch.pieces[step_index];
  split_spans(step, text, *scratch.match[step_index], pieces);
  // Recursion reuses deeper buffers only, so iterating over a copy of the bounds is not needed;
  // index-based iteration keeps it valid even so.
  for (size_t i = 0; i < pieces.size(); ++i) {
    const auto [begin, end] = scratch.pieces[step_index][i];
    if (begin < end) split_from(step_index + 1, text.substr(begin, end - begin), scratch, on_piece);
  }
}

}  // namespace deepinfer::tokenizer_detail
