// deepinfer tokenize: JSON lines in, JSON lines out, for scripts and for checking our tokenizer
// against others. Encode: one JSON string per line -> one JSON array of ids (no special tokens
// added unless --add-special-tokens). Decode (--decode): one JSON array of ids -> one JSON string.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "app/cli.h"
#include "app/commands.h"
#include "core/error.h"
#include "core/json.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::app {

int cmd_tokenize(int argc, char** argv) {
  CLI::App app{
      "Tokenize JSON strings read from stdin, one per line, printing one JSON array of ids per "
      "line; with --decode, read id arrays and print JSON strings.\n"
      "A malformed line (not JSON, wrong type, text that is not UTF-8, an id outside the "
      "vocabulary) stops the command: the lines before it are printed, the error names the line "
      "number on stderr, and the exit code is 1, so output lines always pair with input lines.",
      "deepinfer tokenize"};
  show_defaults(app);
  std::string dir;
  bool decode = false, add_special_tokens = false, skip_special_tokens = false;
  app.add_option("--tokenizer", dir, "directory with tokenizer.json (and tokenizer_config.json)")->required();
  app.add_flag("--decode", decode, "decode id arrays to strings instead of encoding");
  app.add_flag("--add-special-tokens", add_special_tokens, "encode: add BOS/EOS as tokenizer_config says");
  app.add_flag("--skip-special-tokens", skip_special_tokens, "decode: drop special tokens");
  if (auto code = parse_flags(app, argc, argv)) return *code;

  const Tokenizer tokenizer = Tokenizer::from_dir(dir);
  std::ios::sync_with_stdio(false);
  std::string line, out;
  for (size_t line_number = 1; std::getline(std::cin, line); ++line_number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    nlohmann::json input;
    try {
      input = parse_json(line, "stdin line " + std::to_string(line_number));
    } catch (const Error&) {
      std::cout.flush();
      throw;
    }
    try {
      if (decode) {
        if (!input.is_array()) fail("expected a JSON array of token ids, got ", input.type_name());
        std::vector<int32_t> ids;
        ids.reserve(input.size());
        for (const auto& id : input) {
          if (!id.is_number_integer()) fail("expected integer token ids, got ", id.type_name());
          const auto value = id.get<int64_t>();
          if (value < 0 || value >= tokenizer.vocab_size() || !tokenizer.has_token(static_cast<int32_t>(value))) {
            fail("token id ", value, " is not in the vocabulary (size ", tokenizer.vocab_size(), ")");
          }
          ids.push_back(static_cast<int32_t>(value));
        }
        out = nlohmann::json(tokenizer.decode(ids, skip_special_tokens)).dump();
      } else {
        if (!input.is_string()) fail("expected a JSON string, got ", input.type_name());
        out = nlohmann::json(tokenizer.encode(input.get_ref<const std::string&>(), add_special_tokens)).dump();
      }
    } catch (const nlohmann::json::exception& e) {
      std::cout.flush();
      fail("stdin line ", line_number, ": not valid JSON: ", e.what());
    } catch (const Error& e) {
      std::cout.flush();
      fail("stdin line ", line_number, ": ", e.what());
    }
    std::cout << out << '\n';
  }
  std::cout.flush();
  return 0;
}

}  // namespace deepinfer::app
