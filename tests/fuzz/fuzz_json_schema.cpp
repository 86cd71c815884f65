// libFuzzer target for the JSON Schema reader and compiler: the input is a schema (the first
// byte picks flexible or compact whitespace). Anything may be refused with deepinfer::Error;
// nothing may crash, hang or blow up: the compile budgets (CompileLimits) are small here, and
// a compiled grammar is walked a few tokens with the mask checked against accept_token.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "grammar/grammar.h"

namespace {
std::shared_ptr<const deepinfer::grammar::Vocabulary> make_vocab() {
  std::vector<std::string> toks;
  for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t : {"{\"", "\":", "\",", "\"}", "true", "null", "12", "-0.5", "[{", "}]", "\xc3\xa9"}) toks.push_back(t);
  toks.push_back("<eos>");
  return std::make_shared<deepinfer::grammar::Vocabulary>(toks, static_cast<int32_t>(toks.size() - 1));
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer::grammar;
  static const auto vocab = make_vocab();
  if (size < 1) return 0;
  GrammarSpec spec;
  spec.kind = GrammarSpec::Kind::JsonSchema;
  spec.json_any_whitespace = (data[0] & 1) != 0;
  spec.source.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  CompileLimits limits;
  limits.max_nfa_nodes = 20000;
  limits.max_dfa_states = 4000;
  limits.max_repeat = 256;
  limits.max_memory_bytes = 32 << 20;
  limits.max_seconds = 2.0;
  try {
    auto g = CompiledGrammar::compile(spec, vocab, limits);
    GrammarMatcher m(g);
    std::vector<uint32_t> mask(vocab->num_mask_words());
    for (int step = 0; step < 16; ++step) {
      m.fill_mask(mask.data());
      // The step-th allowed token (cycling), so different inputs take different paths.
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab->size(); ++id)
        if ((mask[id >> 5] >> (id & 31)) & 1) allowed.push_back(id);
      if (allowed.empty()) break;
      const int32_t pick = allowed[(static_cast<size_t>(step) * 7 + data[0]) % allowed.size()];
      if (pick == vocab->eos_id()) break;
      if (!m.accept_token(pick)) __builtin_trap();  // the mask allowed it
    }
  } catch (const deepinfer::Error&) {
  }
  return 0;
}
