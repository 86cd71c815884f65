// DeepSeek-V4.1's prefill truncation ("bounded replay", model/deepseek_v41/truncation.h): what it
// saves. Analytic prefill FLOPs per layer (v41_layer_prefill_flops: projections, indexer scoring,
// attention over the window and the chosen entries, hyper-connection mixes, routed + shared
// experts, Engram's projection; the head of the last row left out) of a one-shot prefill, full and
// truncated (layers from the first truncated one on over the prompt's last `keep` rows), and, with
// --time, the CPU wall time of a prefill through the engine on random weights of CONFIG, off vs
// compact.
//   bench_v41_truncation CONFIG [--prompts 4096,32768] [--keep 140] [--time REPS]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "deepinfer/engine.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/truncation.h"

using namespace deepinfer;

namespace {

std::vector<int64_t> int_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoll(item));
  return out;
}

double prefill_seconds(const std::string& config, const char* mode, int64_t keep, int64_t len) {
  EngineConfig c;
  c.random_weights_config = config;
  c.backend = "cpu";
  c.max_model_len = static_cast<int>(len) + 8;
  c.max_num_batched_tokens = static_cast<int>(len);  // the prompt in one step
  c.max_num_seqs = 1;
  c.enable_prefix_caching = false;
  c.prefill_truncation_mode = mode;
  c.prefill_keep_tokens = keep;
  Engine engine(c);
  std::mt19937 rng(5);
  std::vector<int32_t> ids(static_cast<size_t>(len));
  for (int32_t& t : ids) t = 2 + static_cast<int32_t>(rng() % 200);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 1;
  p.ignore_eos = true;
  const auto t0 = std::chrono::steady_clock::now();
  engine.generate({Prompt::from_tokens(ids)}, {p});
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CONFIG [--prompts 4096,32768] [--keep 140] [--time REPS]\n",
                 argv[0]);
    return 2;
  }
  const std::string config = argv[1];
  std::vector<int64_t> prompts = {4096, 32768};
  int64_t keep = 140;
  int reps = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--prompts")
      prompts = int_list(argv[i + 1]);
    else if (a == "--keep")
      keep = std::stoll(argv[i + 1]);
    else if (a == "--time")
      reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const DeepseekV41Config c = load_deepseek_v41_config(config);
  const V41PrefillTruncation t = v41_prefill_truncation(c, "compact", keep);
  std::printf(
      "config %s: %d layers, truncated from layer %d (keep %lld, floor %lld, exact from %lld)\n",
      config.c_str(), t.num_layers, t.first_layer, static_cast<long long>(keep),
      static_cast<long long>(t.floor), static_cast<long long>(t.exact_keep));
  for (int64_t n : prompts) {
    double full = 0, trunc = 0;
    std::printf("prompt %lld\n  layer  full_TFLOP  truncated_TFLOP\n", static_cast<long long>(n));
    for (int l = 0; l < t.num_layers; ++l) {
      const double f = v41_layer_prefill_flops(c, l, n, n);
      const double k = l < t.first_layer ? f : v41_layer_prefill_flops(c, l, std::min(n, keep), n);
      full += f;
      trunc += k;
      std::printf("  %5d  %10.3f  %15.3f\n", l, f / 1e12, k / 1e12);
    }
    std::printf("  total  %10.3f  %15.3f   saved %.1f%% (%.3f TFLOP)\n", full / 1e12, trunc / 1e12,
                100.0 * (full - trunc) / full, (full - trunc) / 1e12);
    for (int r = 0; r < reps; ++r) {
      const double off = prefill_seconds(config, "off", keep, n);
      const double on = prefill_seconds(config, "compact", keep, n);
      std::printf("  time rep %d: off %.3f s, compact %.3f s (%.2fx)\n", r, off, on, off / on);
    }
  }
  return 0;
}
