// deepinfer tokenize (placeholder until its module lands).
#include <cstdio>

#include "app/commands.h"

namespace deepinfer::app {
int cmd_tokenize(int, char**) {
  std::fprintf(stderr, "deepinfer tokenize: not implemented yet\n");
  return 2;
}
}  // namespace deepinfer::app
