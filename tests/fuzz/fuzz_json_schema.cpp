// libFuzzer target for the JSON Schema reader and compiler: the input is a schema (the first
// byte picks flexible or compact whitespace). Anything may be refused with deepinfer::Error;
// nothing may crash, hang or blow up: the compile budgets (CompileLimits) are small here, and
// a compiled grammar is walked a few tokens with the mask checked against accept_token.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "grammar/grammar.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer::grammar;
  static const auto vocab =
      deepinfer::fuzz::byte_vocab({"{\"", "\":", "\",", "\"}", "true", "null", "12", "-0.5", "[{", "}]", "\xc3\xa9"});
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
    deepinfer::fuzz::walk(CompiledGrammar::compile(spec, vocab, limits), 16, 7, data[0]);
  } catch (const deepinfer::Error&) {
  }
  return 0;
}
