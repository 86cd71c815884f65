// Helpers for grammar tests: small vocabularies and byte-level full-match checks.
#pragma once
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace deepinfer::grammar::testing {

// Every single byte (so any text can be spelled) plus the given multi-byte tokens; EOS last.
inline std::shared_ptr<const Vocabulary> small_vocab(const std::vector<std::string>& extra) {
  std::vector<std::string> toks;
  for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, static_cast<char>(b)));
  for (const auto& t : extra) toks.push_back(t);
  toks.push_back("</s>");
  std::vector<char> special;
  for (size_t i = 0; i < toks.size(); ++i) special.push_back(i + 1 == toks.size() ? 1 : 0);
  return std::make_shared<Vocabulary>(toks, static_cast<int32_t>(toks.size() - 1), special);
}

// Full match of `text` by walking bytes (independent of the mask cache).
inline bool matches(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.can_terminate();
}

inline bool bit(const std::vector<uint32_t>& mask, int32_t id) { return (mask[id >> 5] >> (id & 31)) & 1; }

}  // namespace deepinfer::grammar::testing
