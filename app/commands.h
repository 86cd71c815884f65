// Subcommand entry points; argv[0] is the subcommand name. Each returns the exit code.
#pragma once
#include "core/error.h"

namespace deepinfer::app {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;  // a request or input failed
inline constexpr int kExitUsage = 2;  // unknown, contradictory or impossible flags

// Thrown for flags that contradict each other or cannot work; main exits kExitUsage.
class UsageError : public Error {
 public:
  using Error::Error;
};

// DI_USAGE_CHECK(cond, "message", ...): throws UsageError when cond is false.
#define DI_USAGE_CHECK(cond, ...) \
  do {                            \
    if (!(cond)) throw ::deepinfer::app::UsageError(::deepinfer::detail::concat(__VA_ARGS__)); \
  } while (0)

int cmd_generate(int argc, char** argv);
int cmd_info(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_grammar(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_eval(int argc, char** argv);
}  // namespace deepinfer::app
