// deepinfer generate (placeholder until its module lands).
#include <cstdio>

#include "app/commands.h"

namespace deepinfer::app {
int cmd_generate(int, char**) {
  std::fprintf(stderr, "deepinfer generate: not implemented yet\n");
  return 2;
}
}  // namespace deepinfer::app
