// deepinfer grammar (placeholder until its module lands).
#include <cstdio>

#include "app/commands.h"

namespace deepinfer::app {
int cmd_grammar(int, char**) {
  std::fprintf(stderr, "deepinfer grammar: not implemented yet\n");
  return 2;
}
}  // namespace deepinfer::app
