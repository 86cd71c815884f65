// grammar_walk: draws random strings from a grammar by walking the matcher with random choices
// among the tokens its mask allows, for the property test (tests/property/grammar_property.py),
// which validates every completed string with an independent validator (jsonschema, re).
//
//   grammar_walk [--vocab small|TOKENIZER_DIR] [--seed N] < cases.jsonl > walks.jsonl
//
// Input, one case per line: {"id": s, "kind": "json_schema"|"regex", "source": s,
//   "any_whitespace": b (default false), "samples": n, "max_tokens": n}.
// Output, one line per case: {"id": s, "refused": reason} or
//   {"id": s, "samples": [hex of the bytes, ...], "unfinished": n, "errors": [s, ...]}.
// errors are the matcher's own inconsistencies found on the way: a token the mask allows that
// accept_token refuses, a dead end (nothing allowed, EOS included, yet not complete), EOS
// allowed while can_terminate() is false, or a finished string that a fresh byte-level walk
// does not accept. The walk only uses the mask, so it cannot produce what the mask forbids.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

using namespace deepinfer;
using json = nlohmann::json;

namespace {

// Every single byte (any text can be spelled, invalid UTF-8 included, so the mask alone must
// keep the output valid), JSON-shaped multi-byte tokens that cross structure boundaries, and
// multi-byte UTF-8 characters; EOS last.
std::shared_ptr<const grammar::Vocabulary> small_vocab() {
  std::vector<std::string> toks;
  for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t : {"{\"", "\":", "\",", "\"}", "\"]", "},", "}]", "],", "[{", "[\"", "\":\"", "\",\"", "\"},{\"",
                        ": ", ", ", "\n  ", "  ", "true", "false", "null", "nul", "tr", "0.", ".5", "-1", "12", "e+",
                        "E-", "00", "\\\"", "\\\\", "\\u00", "\\n", "\\/", "ab", "abc", "-0", "1e", "é", "€", "😀",
                        "\xC3", "T1", ":00", "Z\"", "@", ".com", "http", "://", "-4"})
    toks.push_back(t);
  toks.push_back("</s>");
  std::vector<char> special(toks.size(), 0);
  special[toks.size() - 1] = 1;  // EOS
  return std::make_shared<grammar::Vocabulary>(toks, static_cast<int32_t>(toks.size() - 1), special);
}

std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}

bool has_byte(const std::string& s, const char* set) { return s.find_first_of(set) != std::string::npos; }

struct Walk {
  bool finished = false;
  std::string text;
};

// One random walk. Early on tokens are uniform among the allowed ones (EOS taken with
// probability 1/4 when allowed); past soft_tokens the walk heads for the end: EOS whenever
// allowed, else mostly tokens that close something (", }, ]) and open nothing ({, [).
Walk walk_once(const std::shared_ptr<const grammar::CompiledGrammar>& g, std::mt19937_64& rng, int max_tokens,
               int soft_tokens, std::vector<std::string>& errors) {
  const grammar::Vocabulary& v = g->vocab();
  grammar::GrammarMatcher m(g);
  std::vector<uint32_t> mask(v.num_mask_words());
  std::vector<int32_t> allowed, closing;
  Walk w;
  auto show = [&] { return json(w.text).dump(-1, ' ', true, json::error_handler_t::replace); };
  for (int step = 0; step < max_tokens; ++step) {
    std::fill(mask.begin(), mask.end(), 0u);
    m.fill_mask(mask.data());
    allowed.clear();
    closing.clear();
    bool eos = false;
    for (int32_t id = 0; id < v.size(); ++id) {
      if (!((mask[id >> 5] >> (id & 31)) & 1)) continue;
      if (id == v.eos_id()) {
        eos = true;
        continue;
      }
      allowed.push_back(id);
      const std::string& b = v.token_bytes(id);
      if (has_byte(b, "\"}]") && !has_byte(b, "{[")) closing.push_back(id);
    }
    if (eos != m.can_terminate()) {
      errors.push_back("mask EOS bit " + std::to_string(eos) + " but can_terminate() " +
                       std::to_string(m.can_terminate()) + " after " + show());
      return w;
    }
    if (allowed.empty() && !eos) {
      errors.push_back("dead end: no token allowed and not complete after " + show());
      return w;
    }
    bool late = step >= soft_tokens;
    bool take_eos = eos && (allowed.empty() || late || std::uniform_int_distribution<int>(0, 3)(rng) == 0);
    if (take_eos) {
      if (!m.accept_token(v.eos_id())) errors.push_back("EOS in the mask but refused after " + show());
      grammar::GrammarMatcher fresh(g);
      if (!fresh.accept_bytes(w.text) || !fresh.can_terminate())
        errors.push_back("finished walk not accepted by a fresh byte-level walk: " + show());
      w.finished = true;
      return w;
    }
    const std::vector<int32_t>& pool =
        late && !closing.empty() && std::uniform_int_distribution<int>(0, 4)(rng) != 0 ? closing : allowed;
    int32_t id = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
    if (!m.accept_token(id)) {
      errors.push_back("token " + std::to_string(id) + " " + json(v.token_bytes(id)).dump(-1, ' ', true, json::error_handler_t::replace) +
                       " in the mask but refused after " + show());
      return w;
    }
    w.text += v.token_bytes(id);
  }
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"grammar_walk: random strings from grammars, for the property test"};
  std::string vocab_arg = "small";
  uint64_t seed = 1;
  app.add_option("--vocab", vocab_arg, "'small' or a tokenizer directory (tokenizer.json)");
  app.add_option("--seed", seed);
  CLI11_PARSE(app, argc, argv);

  std::shared_ptr<const grammar::Vocabulary> vocab;
  try {
    vocab = vocab_arg == "small" ? small_vocab() : grammar::vocabulary_from_tokenizer(Tokenizer::from_dir(vocab_arg));
  } catch (const Error& e) {
    std::fprintf(stderr, "grammar_walk: %s\n", e.what());
    return 2;
  }
  std::string line;
  int line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    if (line.empty()) continue;
    json c;
    try {
      c = json::parse(line);
    } catch (const json::exception& e) {
      std::fprintf(stderr, "grammar_walk: stdin line %d: not JSON: %s\n", line_no, e.what());
      return 2;
    }
    json out = {{"id", c.value("id", std::to_string(line_no))}};
    const std::string kind = c.value("kind", "");
    grammar::GrammarSpec spec;
    if (kind == "json_schema") spec.kind = grammar::GrammarSpec::Kind::JsonSchema;
    else if (kind == "regex") spec.kind = grammar::GrammarSpec::Kind::Regex;
    else {
      std::fprintf(stderr, "grammar_walk: stdin line %d: kind must be json_schema or regex\n", line_no);
      return 2;
    }
    spec.source = c.value("source", "");
    spec.json_any_whitespace = c.value("any_whitespace", false);
    std::shared_ptr<const grammar::CompiledGrammar> g;
    try {
      g = grammar::CompiledGrammar::compile(spec, vocab);
    } catch (const Error& e) {
      out["refused"] = e.what();
      std::cout << out.dump() << "\n" << std::flush;
      continue;
    }
    // Seeded per case, so a case's walks do not depend on the cases before it.
    std::mt19937_64 rng(seed * 1000003u + std::hash<std::string>{}(out["id"].get<std::string>()));
    const int num_samples = c.value("samples", 20), max_tokens = c.value("max_tokens", 3000);
    std::vector<std::string> errors, samples;
    int unfinished = 0;
    for (int i = 0; i < num_samples && errors.size() < 5; ++i) {
      Walk w = walk_once(g, rng, max_tokens, c.value("soft_tokens", 40), errors);
      if (w.finished) samples.push_back(hex(w.text));
      else ++unfinished;
    }
    out["samples"] = samples;
    out["unfinished"] = unfinished;
    out["errors"] = errors;
    std::cout << out.dump() << "\n" << std::flush;
  }
  return 0;
}
