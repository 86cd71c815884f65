// Small helpers shared by the standalone CUDA benches of bench/cuda/.
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace deepinfer::bench {

// "1,8,32" -> {1, 8, 32}.
inline std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::atoi(item.c_str()));
  return out;
}

// An I32 device tensor of `dims` holding `v` (the buffer goes to `keep`).
inline Tensor upload_i32(Backend& b, std::vector<DeviceBuffer>& keep, const std::vector<int32_t>& v,
                         std::vector<int64_t> dims) {
  HostBuffer host(DType::I32, dims);
  std::copy(v.begin(), v.end(), host.ptr<int32_t>());
  keep.push_back(b.alloc(DType::I32, dims));
  b.copy(host.tensor(), keep.back().tensor());
  b.synchronize();
  return keep.back().tensor();
}

// main(): runs `run`, printing an exception as "name: message" with exit status 1.
inline int main_guarded(const char* name, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace deepinfer::bench
