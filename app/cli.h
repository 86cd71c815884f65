// CLI conventions shared by every subcommand: exit codes (0 success, 1 a request or
// input error, 2 usage: unknown, contradictory or impossible flags), --help on stdout
// with defaults shown.
#pragma once
#include <CLI/CLI.hpp>
#include <optional>

#include "app/commands.h"

namespace deepinfer::app {

// Call before adding options so --help shows every option's default.
inline void show_defaults(CLI::App& app) { app.option_defaults()->always_capture_default(); }

// Parses argv; returns the exit code when the command should end now (--help: 0 after
// printing to stdout; a parse error: kExitUsage after printing it to stderr).
inline std::optional<int> parse_flags(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  return std::nullopt;
}

}  // namespace deepinfer::app
