// Fuzzes the three grammar front-ends (regex, JSON Schema, EBNF) and the matcher: the first
// byte picks the front-end, the rest is the source. Anything may be refused with
// deepinfer::Error; nothing may crash, hang or blow up (compile limits are small here).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "grammar/grammar.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer::grammar;
  static const auto vocab = deepinfer::fuzz::byte_vocab({"{\"", "\":", "\",", "ab", "12", "true", "\xc3\xa9", "\"}"});
  if (size < 1) return 0;
  GrammarSpec spec;
  spec.kind = static_cast<GrammarSpec::Kind>(data[0] % 3);
  spec.source.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  CompileLimits limits;
  limits.max_nfa_nodes = 20000;
  limits.max_dfa_states = 4000;
  limits.max_repeat = 256;
  try {
    // The first allowed token at every step; the walk checks mask against accept_token.
    deepinfer::fuzz::walk(CompiledGrammar::compile(spec, vocab, limits), 8, 0, 0);
  } catch (const deepinfer::Error&) {
  }
  return 0;
}
