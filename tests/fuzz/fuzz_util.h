// Shared by the grammar fuzz targets: a small vocabulary (every byte plus a few multi-byte
// tokens, EOS last) and a bounded walk of a compiled grammar that checks the mask against
// accept_token at every step.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace deepinfer::fuzz {

inline std::shared_ptr<const grammar::Vocabulary> byte_vocab(const std::vector<std::string>& extra) {
  std::vector<std::string> toks;
  for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, static_cast<char>(b)));
  for (const auto& t : extra) toks.push_back(t);
  toks.push_back("<eos>");
  return std::make_shared<grammar::Vocabulary>(toks, static_cast<int32_t>(toks.size() - 1));
}

// Up to `steps` tokens: at step k the ((k * stride + salt) mod n)-th of the n allowed tokens
// (stride 0, salt 0: always the first).
inline void walk(const std::shared_ptr<const grammar::CompiledGrammar>& g, int steps, uint32_t stride, uint32_t salt) {
  grammar::GrammarMatcher m(g);
  const auto& vocab = g->vocab();
  std::vector<uint32_t> mask(vocab.num_mask_words());
  std::vector<int32_t> allowed;
  for (int step = 0; step < steps; ++step) {
    m.fill_mask(mask.data());
    allowed.clear();
    for (int32_t id = 0; id < vocab.size(); ++id)
      if ((mask[id >> 5] >> (id & 31)) & 1) allowed.push_back(id);
    if (allowed.empty()) break;
    const int32_t pick = allowed[(static_cast<uint32_t>(step) * stride + salt) % allowed.size()];
    if (pick == vocab.eos_id()) break;
    if (!m.accept_token(pick)) __builtin_trap();  // the mask allowed it
  }
}

}  // namespace deepinfer::fuzz
