// deepinfer info (placeholder until its module lands).
#include <cstdio>

#include "app/commands.h"

namespace deepinfer::app {
int cmd_info(int, char**) {
  std::fprintf(stderr, "deepinfer info: not implemented yet\n");
  return 2;
}
}  // namespace deepinfer::app
