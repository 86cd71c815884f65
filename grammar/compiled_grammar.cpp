// CompiledGrammar and GrammarCache: front-end dispatch, automaton build, shared mask cache.
#include "core/error.h"
#include "grammar/grammar.h"
#include "grammar/lift.h"

namespace deepinfer::grammar {

std::shared_ptr<const CompiledGrammar> CompiledGrammar::from_ir(const GrammarIR& ir,
                                                                std::shared_ptr<const Vocabulary> vocab,
                                                                CompileBudget& budget) {
  DI_CHECK(vocab != nullptr, "grammar: no vocabulary");
  std::shared_ptr<CompiledGrammar> g(new CompiledGrammar());
  budget.check_time("lifting loops out of rules");
  g->automaton_ = build_automaton(lift_call_free_loops(ir, &budget), budget.limits(), &budget);
  g->vocab_ = std::move(vocab);
  g->cache_ = std::make_unique<MaskCache>(g->automaton_, *g->vocab_);
  return g;
}

std::shared_ptr<const CompiledGrammar> CompiledGrammar::from_ir(const GrammarIR& ir,
                                                                std::shared_ptr<const Vocabulary> vocab,
                                                                const CompileLimits& limits) {
  CompileBudget budget(limits);
  return from_ir(ir, std::move(vocab), budget);
}

std::shared_ptr<const CompiledGrammar> CompiledGrammar::compile(const GrammarSpec& spec,
                                                                std::shared_ptr<const Vocabulary> vocab,
                                                                const CompileLimits& limits) {
  static const char* const kKinds[] = {"regex", "json schema", "ebnf", "json object", "tool calls"};
  const auto kind = static_cast<size_t>(spec.kind);
  DI_CHECK(kind < 5, "grammar: unknown spec kind");
  DI_CHECK(static_cast<int64_t>(spec.source.size()) <= limits.max_source_bytes, kKinds[kind], ": the source is ",
           spec.source.size(), " bytes, over the limit of ", limits.max_source_bytes,
           " bytes (CompileLimits::max_source_bytes)");
  CompileBudget budget(limits);
  switch (spec.kind) {
    case GrammarSpec::Kind::Regex:
      return from_ir(parse_regex_grammar(spec.source, &budget), std::move(vocab), budget);
    case GrammarSpec::Kind::JsonSchema:
      return from_ir(json_schema_to_ir(spec.source, spec.json_any_whitespace, &budget), std::move(vocab), budget);
    case GrammarSpec::Kind::Ebnf:
      return from_ir(parse_ebnf(spec.source, &budget), std::move(vocab), budget);
    case GrammarSpec::Kind::JsonObject:
      return from_ir(json_object_ir(spec.json_any_whitespace), std::move(vocab), budget);
    case GrammarSpec::Kind::ToolCalls:
      return from_ir(tool_calls_ir(spec.source, spec.json_any_whitespace, &budget), std::move(vocab), budget);
  }
  fail("grammar: unknown spec kind");
}

std::shared_ptr<const CompiledGrammar> GrammarCache::get(const GrammarSpec& spec) {
  std::string key = std::to_string(static_cast<int>(spec.kind)) + (spec.json_any_whitespace ? "w" : "c") + spec.source;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = grammars_.find(key);
    if (it != grammars_.end()) return it->second;
  }
  auto g = CompiledGrammar::compile(spec, vocab_);
  std::lock_guard<std::mutex> lock(mu_);
  return grammars_.try_emplace(key, g).first->second;
}

}  // namespace deepinfer::grammar
