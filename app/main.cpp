// deepinfer: one binary, subcommands. Each subcommand lives in app/cmd_<name>.cpp.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "app/commands.h"
#include "core/error.h"

namespace {
struct Command {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);
};
constexpr Command kCommands[] = {
    {"generate", "generate text from a prompt or a JSONL batch", deepinfer::app::cmd_generate},
    {"info", "print a checkpoint's config summary, parameter count and bytes by dtype",
     deepinfer::app::cmd_info},
    {"tokenize", "tokenize JSON strings from stdin (or --decode id arrays)", deepinfer::app::cmd_tokenize},
    {"bench", "benchmark prefill and decode; JSONL records", deepinfer::app::cmd_bench},
    {"grammar", "grammar tools: `grammar check` walks texts through a constraint",
     deepinfer::app::cmd_grammar},
    {"serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, ...)", deepinfer::app::cmd_serve},
};

void usage() {
  std::fprintf(stderr, "usage: deepinfer <command> [flags]\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(stderr, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(stderr, "\nRun `deepinfer <command> --help` for a command's flags.\n");
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  for (const auto& c : kCommands) {
    if (std::strcmp(argv[1], c.name) == 0) {
      try {
        return c.run(argc - 1, argv + 1);
      } catch (const deepinfer::Error& e) {
        std::fprintf(stderr, "deepinfer %s: error: %s\n", c.name, e.what());
        return 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "deepinfer %s: internal error: %s\n", c.name, e.what());
        return 3;
      }
    }
  }
  std::fprintf(stderr, "deepinfer: unknown command '%s'\n\n", argv[1]);
  usage();
  return 2;
}
