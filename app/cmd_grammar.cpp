// deepinfer grammar check: walks candidate texts through a constraint token by token.
//   deepinfer grammar check (--json-schema F | --regex R | --ebnf F | --json-object) --tokenizer DIR
// stdin: one JSON string per line (a candidate text). stdout: `accept` (the text is a complete
// match) or `reject` per line. With --check-mask every step also checks that the token's mask
// bit agrees with accept_token (a consistency check of the mask cache).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "app/cli.h"
#include "app/commands.h"
#include "core/error.h"
#include "core/json.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::app {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DI_CHECK(in, "grammar check: cannot open '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}


}  // namespace

int cmd_grammar(int argc, char** argv) {
  CLI::App app{"grammar tools"};
  show_defaults(app);
  app.require_subcommand(1);
  CLI::App* check = app.add_subcommand("check", "walk JSON-string lines from stdin through a constraint");
  std::string schema_file, regex, ebnf_file, tokenizer_dir;
  bool json_object = false, compact = false, check_mask = false;
  check->add_option("--json-schema", schema_file, "JSON Schema file");
  check->add_option("--regex", regex, "regular expression (full match)");
  check->add_option("--ebnf", ebnf_file, "EBNF / GBNF grammar file");
  check->add_flag("--json-object", json_object, "any JSON object");
  check->add_flag("--compact", compact, "JSON: no whitespace between tokens");
  check->add_flag("--check-mask", check_mask, "verify the mask agrees with accept_token at every step");
  check->add_option("--tokenizer", tokenizer_dir, "tokenizer directory (tokenizer.json)")->required();
  if (auto code = parse_flags(app, argc, argv)) return *code;
  int num_kinds = !schema_file.empty() + !regex.empty() + !ebnf_file.empty() + json_object;
  DI_CHECK(num_kinds == 1, "grammar check: give exactly one of --json-schema, --regex, --ebnf, --json-object");
  grammar::GrammarSpec spec;
  if (!schema_file.empty()) spec = {grammar::GrammarSpec::Kind::JsonSchema, read_file(schema_file), !compact};
  if (!regex.empty()) spec = {grammar::GrammarSpec::Kind::Regex, regex, true};
  if (!ebnf_file.empty()) spec = {grammar::GrammarSpec::Kind::Ebnf, read_file(ebnf_file), true};
  if (json_object) spec = {grammar::GrammarSpec::Kind::JsonObject, "", !compact};

  Tokenizer tok = Tokenizer::from_dir(tokenizer_dir);
  auto vocab = grammar::vocabulary_from_tokenizer(tok);
  auto compiled = grammar::CompiledGrammar::compile(spec, vocab);
  grammar::GrammarMatcher matcher(compiled);
  std::vector<uint32_t> mask(vocab->num_mask_words());
  std::string line;
  int line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    if (line.empty()) continue;
    const std::string where = "grammar check: stdin line " + std::to_string(line_no);
    const nlohmann::json input = parse_json(line, where);
    DI_CHECK(input.is_string(), where, ": expected a JSON string, got ", json_snippet(input));
    const std::string& text = input.get_ref<const std::string&>();
    matcher.reset();
    bool ok = true;
    for (int32_t id : tok.encode(text, false)) {
      if (check_mask) matcher.fill_mask(mask.data());
      bool accepted = matcher.accept_token(id);
      if (check_mask && accepted != (((mask[id >> 5] >> (id & 31)) & 1) != 0))
        fail("grammar check: line ", line_no, ": mask and accept_token disagree on token ", id, " (",
             nlohmann::json(tok.token_bytes(id)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), ")");
      if (!accepted) {
        ok = false;
        break;
      }
    }
    if (ok && check_mask) {
      matcher.fill_mask(mask.data());
      int32_t eos = vocab->eos_id();
      if (eos >= 0 && (((mask[eos >> 5] >> (eos & 31)) & 1) != 0) != matcher.can_terminate())
        fail("grammar check: line ", line_no, ": EOS mask bit disagrees with can_terminate");
    }
    std::printf("%s\n", ok && matcher.can_terminate() ? "accept" : "reject");
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace deepinfer::app
