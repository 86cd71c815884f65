// Fuzzes the three grammar front-ends (regex, JSON Schema, EBNF) and the matcher: the first
// byte picks the front-end, the rest is the source. Anything may be refused with
// deepinfer::Error; nothing may crash, hang or blow up (compile limits are small here).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "grammar/grammar.h"

namespace {
std::shared_ptr<const deepinfer::grammar::Vocabulary> make_vocab() {
  std::vector<std::string> toks;
  for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t : {"{\"", "\":", "\",", "ab", "12", "true", "\xc3\xa9", "\"}"}) toks.push_back(t);
  toks.push_back("<eos>");
  return std::make_shared<deepinfer::grammar::Vocabulary>(toks, static_cast<int32_t>(toks.size() - 1));
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer::grammar;
  static const auto vocab = make_vocab();
  if (size < 1) return 0;
  GrammarSpec spec;
  spec.kind = static_cast<GrammarSpec::Kind>(data[0] % 3);
  spec.source.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  CompileLimits limits;
  limits.max_nfa_nodes = 20000;
  limits.max_dfa_states = 4000;
  limits.max_repeat = 256;
  try {
    auto g = CompiledGrammar::compile(spec, vocab, limits);
    GrammarMatcher m(g);
    std::vector<uint32_t> mask(vocab->num_mask_words());
    for (int step = 0; step < 8; ++step) {
      m.fill_mask(mask.data());
      int32_t pick = -1;
      for (int32_t id = 0; id < vocab->size() && pick < 0; ++id)
        if ((mask[id >> 5] >> (id & 31)) & 1) pick = id;
      if (pick < 0 || pick == vocab->eos_id()) break;
      if (!m.accept_token(pick)) __builtin_trap();  // the mask allowed it
    }
  } catch (const deepinfer::Error&) {
  }
  return 0;
}
