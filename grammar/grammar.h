// Structured outputs: the public API of the grammar module.
//
//   auto vocab = std::make_shared<grammar::Vocabulary>(token_bytes, eos_id, is_special);
//   auto g = grammar::CompiledGrammar::compile({GrammarSpec::Kind::JsonSchema, schema_text}, vocab);
//   grammar::GrammarMatcher m(g);
//   std::vector<uint32_t> mask(vocab->num_mask_words());
//   m.fill_mask(mask.data());          // bit id set <=> token id allowed next
//   m.accept_token(sampled_id);        // false (state unchanged) if the token is not allowed
//   if (m.is_complete()) stop;
//
// Regex, JSON Schema and EBNF (W3C-style and llama.cpp GBNF) all lower to one GrammarIR,
// compiled to a pushdown automaton over bytes. Bad input throws deepinfer::Error naming the
// front-end, the position or JSON path, and what was expected.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/ir.h"
#include "grammar/mask_cache.h"
#include "grammar/stack.h"
#include "grammar/vocab.h"

namespace deepinfer::grammar {

struct GrammarSpec {
  // ToolCalls: a JSON description of marker-wrapped calls whose arguments follow JSON Schemas
  // (grammar/tool_calls.cpp).
  enum class Kind { Regex, JsonSchema, Ebnf, JsonObject, ToolCalls };
  Kind kind = Kind::JsonObject;
  std::string source;  // regex / schema JSON text / grammar text; unused for JsonObject
  // JSON whitespace policy: true allows any run of JSON whitespace between tokens; false
  // allows none (compact JSON).
  bool json_any_whitespace = true;
};

// Front-ends: text -> GrammarIR. Each throws deepinfer::Error with position info. With a
// budget (CompiledGrammar::compile passes one) the IR is charged to it and its limits apply
// (nesting, JSON Schema depth); without one, CompileLimits' defaults apply.
GrammarIR parse_regex_grammar(const std::string& regex, CompileBudget* budget = nullptr);
// The root is the rule named `root` (an error when there is none).
GrammarIR parse_ebnf(const std::string& text, CompileBudget* budget = nullptr);
GrammarIR json_schema_to_ir(const std::string& schema_text, bool any_whitespace, CompileBudget* budget = nullptr);
GrammarIR json_object_ir(bool any_whitespace);
GrammarIR tool_calls_ir(const std::string& source, bool any_whitespace, CompileBudget* budget = nullptr);

class CompiledGrammar {
 public:
  // Compiles spec for vocab; throws deepinfer::Error for invalid or oversized input: the
  // source over limits.max_source_bytes, or any budget of `limits` exceeded on the way
  // (memory, time, nesting; see CompileLimits), with a message naming the cause.
  static std::shared_ptr<const CompiledGrammar> compile(const GrammarSpec& spec,
                                                        std::shared_ptr<const Vocabulary> vocab,
                                                        const CompileLimits& limits = {});
  static std::shared_ptr<const CompiledGrammar> from_ir(const GrammarIR& ir, std::shared_ptr<const Vocabulary> vocab,
                                                        const CompileLimits& limits = {});
  // The same, continuing a compilation's budget (after its front-end charged it).
  static std::shared_ptr<const CompiledGrammar> from_ir(const GrammarIR& ir, std::shared_ptr<const Vocabulary> vocab,
                                                        CompileBudget& budget);

  const Automaton& automaton() const { return automaton_; }
  const Vocabulary& vocab() const { return *vocab_; }
  MaskCache& mask_cache() const { return *cache_; }

 private:
  CompiledGrammar() = default;
  Automaton automaton_;
  std::shared_ptr<const Vocabulary> vocab_;
  std::unique_ptr<MaskCache> cache_;
};

// Compiles each distinct (kind, source, whitespace) once per vocabulary; thread-safe.
class GrammarCache {
 public:
  explicit GrammarCache(std::shared_ptr<const Vocabulary> vocab) : vocab_(std::move(vocab)) {}
  std::shared_ptr<const CompiledGrammar> get(const GrammarSpec& spec);

 private:
  std::shared_ptr<const Vocabulary> vocab_;
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const CompiledGrammar>> grammars_;
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Advances by one token; returns false and leaves the state unchanged if not allowed.
  // EOS is allowed exactly when can_terminate().
  bool accept_token(int32_t id);
  // Advances by raw bytes (tests, the checker); false and unchanged if not a valid prefix.
  bool accept_bytes(const std::string& bytes);
  // bitmask: num_mask_words() words; bit id set <=> token id may come next.
  void fill_mask(uint32_t* bitmask);
  // The text so far is a complete match (EOS may come next).
  bool can_terminate() const { return history_.back().can_terminate; }
  // Nothing but EOS can follow, or EOS was accepted: generation should stop.
  bool is_complete() const;
  // Undoes the last n accepted tokens (speculative decoding); n <= num_accepted().
  void rollback(int n);
  void reset();
  int num_accepted() const { return static_cast<int>(history_.size()) - 1; }
  int32_t num_mask_words() const { return grammar_->vocab().num_mask_words(); }

 private:
  struct State {
    std::vector<int32_t> elements;  // stack node ids whose state has byte edges
    bool can_terminate = false;
    bool terminated = false;  // EOS accepted
  };
  bool advance(const std::string& bytes, State& out);
  const std::vector<const MaskEntry*>& entries_for(int32_t element);

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::unique_ptr<WalkScratch> walk_;  // working memory of the mask-cache misses it computes
  StackArena arena_;
  StepScratch scratch_;
  std::vector<State> history_;  // history_[0]: initial state
  std::unordered_map<int32_t, std::vector<const MaskEntry*>> memo_;  // element -> chain entries
};

}  // namespace deepinfer::grammar
