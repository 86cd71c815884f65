// deepinfer: one binary, subcommands. Each subcommand lives in app/cmd_<name>.cpp.
// Exit codes: 0 success, 1 a request or input error, 2 usage (app/commands.h), 3 an
// internal error; a batch stopped by SIGINT/SIGTERM exits 128 + the signal.
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
    {"eval", "evals in two stages (generate raw records, score them) and exact perplexity baselines",
     deepinfer::app::cmd_eval},
};

void usage(std::FILE* to) {
  std::fprintf(to, "usage: deepinfer <command> [flags]\n       deepinfer --version\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(to, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(to, "\nRun `deepinfer <command> --help` for a command's flags.\n"
                   "Exit codes: 0 success, 1 a request or input error, 2 usage, 128 + signal when stopped.\n");
}
}  // namespace

int main(int argc, char** argv) {
  using deepinfer::app::kExitUsage;
  if (argc < 2) {
    usage(stderr);
    return kExitUsage;
  }
  if (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    usage(stdout);
    return 0;
  }
  if (std::strcmp(argv[1], "--version") == 0 || std::strcmp(argv[1], "-V") == 0) {
    std::printf("deepinfer %s\n", DEEPINFER_VERSION);
    return 0;
  }
  for (const auto& c : kCommands) {
    if (std::strcmp(argv[1], c.name) == 0) {
      try {
        return c.run(argc - 1, argv + 1);
      } catch (const deepinfer::app::UsageError& e) {
        std::fprintf(stderr, "deepinfer %s: usage: %s\n", c.name, e.what());
        return kExitUsage;
      } catch (const deepinfer::Error& e) {
        std::fprintf(stderr, "deepinfer %s: error: %s\n", c.name, e.what());
        return deepinfer::app::kExitError;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "deepinfer %s: internal error: %s\n", c.name, e.what());
        return 3;
      }
    }
  }
  std::fprintf(stderr, "deepinfer: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return kExitUsage;
}
