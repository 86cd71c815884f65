// deepinfer bench (placeholder until its module lands).
#include <cstdio>

#include "app/commands.h"

namespace deepinfer::app {
int cmd_bench(int, char**) {
  std::fprintf(stderr, "deepinfer bench: not implemented yet\n");
  return 2;
}
}  // namespace deepinfer::app
