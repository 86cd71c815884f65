// The load-time NaN/Inf scan (model/weight_check.h): seconds for a checkpoint directory's
// tensors (default: the embedded model) and GB/s over a large in-memory buffer of each dtype
// (a stand-in for a big checkpoint that is already in the page cache).
//   bench_weight_check [MODEL_DIR] [GIB]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "model/weight_check.h"

using namespace deepinfer;

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : DEEPINFER_DEFAULT_MODEL_DIR;
  const double gib = argc > 2 ? std::stod(argv[2]) : 2.0;
  ThreadPool& pool = default_thread_pool();
  CheckpointReader r = CheckpointReader::open(dir);
  std::vector<NamedTensor> ts;
  for (const std::string& n : r.names()) ts.push_back({n, r.info(n).file, r.tensor(n)});
  r.touch_all();  // page cache warm: the scan, not the disk, is timed
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    check_weights_finite(ts, pool);
    const double s = seconds_since(t0);
    std::printf("{\"what\":\"checkpoint\",\"dir\":\"%s\",\"tensors\":%zu,\"bytes\":%llu,\"seconds\":%.6f,\"gb_per_s\":%.2f,\"threads\":%d}\n",
                dir.c_str(), ts.size(), static_cast<unsigned long long>(r.total_bytes()), s,
                static_cast<double>(r.total_bytes()) / s / 1e9, pool.num_threads());
  }
  const size_t bytes = static_cast<size_t>(gib * (1u << 30));
  std::vector<unsigned char> buf(bytes, 0x3C);  // finite in every dtype
  for (DType dt : {DType::BF16, DType::F8_E4M3, DType::F32}) {
    const int64_t n = static_cast<int64_t>(bytes / dtype_size(dt));
    std::vector<NamedTensor> one = {{"big", "memory", Tensor(buf.data(), dt, {n})}};
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      check_weights_finite(one, pool);
      const double s = seconds_since(t0);
      std::printf("{\"what\":\"buffer\",\"dtype\":\"%s\",\"bytes\":%zu,\"seconds\":%.4f,\"gb_per_s\":%.2f,\"threads\":%d}\n",
                  std::string(dtype_name(dt)).c_str(), bytes, s, static_cast<double>(bytes) / s / 1e9,
                  pool.num_threads());
    }
  }
  return 0;
}
