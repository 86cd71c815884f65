// Subcommand entry points; argv[0] is the subcommand name. Each returns the exit code.
#pragma once

namespace deepinfer::app {
int cmd_generate(int argc, char** argv);
int cmd_info(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_grammar(int argc, char** argv);
int cmd_serve(int argc, char** argv);
}  // namespace deepinfer::app
