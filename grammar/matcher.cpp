// GrammarMatcher: a set of pushdown stacks advanced byte by byte; masks from the shared cache.
#include <cstring>

#include "core/error.h"
#include "grammar/grammar.h"

namespace deepinfer::grammar {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), walk_(std::make_unique<WalkScratch>()) {
  DI_CHECK(grammar_ != nullptr, "grammar matcher: no compiled grammar");
  reset();
}

void GrammarMatcher::reset() {
  arena_.clear();
  memo_.clear();
  history_.clear();
  const Automaton& a = grammar_->automaton();
  State s;
  StepFlags flags;
  scratch_.visited.clear();
  close_element(a, arena_, arena_.make(a.root_start(), kRoot), s.elements, flags, scratch_);
  s.can_terminate = flags.root_pop;
  history_.push_back(std::move(s));
}

bool GrammarMatcher::advance(const std::string& bytes, State& out) {
  const Automaton& a = grammar_->automaton();
  const State& cur = history_.back();
  if (cur.terminated) return false;
  if (bytes.empty()) {
    out = cur;
    return true;
  }
  std::vector<int32_t> in = cur.elements, next;
  StepFlags flags;
  for (size_t d = 0; d < bytes.size(); ++d) {
    flags = StepFlags{};
    step_byte(a, arena_, in, static_cast<uint8_t>(bytes[d]), next, flags, scratch_);
    if (next.empty() && !(flags.root_pop && d + 1 == bytes.size())) return false;
    in.swap(next);
  }
  out.elements = std::move(in);
  out.can_terminate = flags.root_pop;
  out.terminated = false;
  return true;
}

bool GrammarMatcher::accept_token(int32_t id) {
  const Vocabulary& v = grammar_->vocab();
  DI_CHECK(id >= 0 && id < v.size(), "grammar matcher: token id ", id, " outside the vocabulary [0, ", v.size(), ")");
  if (id == v.eos_id()) {
    if (!can_terminate() || history_.back().terminated) return false;
    State s = history_.back();
    s.terminated = true;
    s.elements.clear();
    history_.push_back(std::move(s));
    return true;
  }
  if (v.is_special(id)) return false;
  State s;
  if (!advance(v.token_bytes(id), s)) return false;
  history_.push_back(std::move(s));
  return true;
}

bool GrammarMatcher::accept_bytes(const std::string& bytes) {
  State s;
  if (!advance(bytes, s)) return false;
  history_.push_back(std::move(s));
  return true;
}

bool GrammarMatcher::is_complete() const {
  const State& s = history_.back();
  return s.terminated || (s.can_terminate && s.elements.empty());
}

void GrammarMatcher::rollback(int n) {
  DI_CHECK(n >= 0 && n <= num_accepted(), "grammar matcher: cannot roll back ", n, " tokens, only ", num_accepted(),
           " accepted");
  history_.resize(history_.size() - n);
}

const std::vector<const MaskEntry*>& GrammarMatcher::entries_for(int32_t element) {
  auto it = memo_.find(element);
  if (it != memo_.end()) return it->second;
  std::vector<int32_t> chain;
  for (int32_t x = element; x >= 0; x = arena_[x].parent) chain.push_back(arena_[x].state);
  std::vector<const MaskEntry*> entries;
  std::vector<int32_t> prefix;
  MaskCache& cache = grammar_->mask_cache();
  const MaskEntry* prev = nullptr;
  for (size_t k = 0; k < chain.size(); ++k) {
    prefix.push_back(chain[k]);
    bool rooted = k + 1 == chain.size();
    const MaskEntry& e = cache.get(prefix, rooted, prev, *walk_);
    entries.push_back(&e);
    prev = &e;
    if (e.uncertain.empty()) break;
  }
  return memo_.emplace(element, std::move(entries)).first->second;
}

void GrammarMatcher::fill_mask(uint32_t* bitmask) {
  const Vocabulary& v = grammar_->vocab();
  const int32_t num_words = v.num_mask_words();
  std::memset(bitmask, 0, sizeof(uint32_t) * num_words);
  const State& s = history_.back();
  if (!s.terminated) {
    // Copy: entries_for may grow the arena but never touches history_.
    const std::vector<int32_t> elements = s.elements;
    for (int32_t e : elements) {
      for (const MaskEntry* entry : entries_for(e)) entry->or_into(bitmask);
    }
  }
  if (s.can_terminate && !s.terminated && v.eos_id() >= 0) bitmask[v.eos_id() >> 5] |= 1u << (v.eos_id() & 31);
}

}  // namespace deepinfer::grammar
