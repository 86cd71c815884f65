// Golden tests: the CPU forward against HF transformers (fp32 oracle) on tiny random
// checkpoints made by tools/golden/make_golden.py (fixtures/<name>/{config.json,
// model.safetensors, reference.json}). DEEPINFER_ACCELERATOR=cuda runs the CUDA forward
// instead (run_golden_cuda: BF16 tolerance, teacher-forced, MoE routing and V3.2 indexer
// near-ties replayed from the CPU reference).
//
// Per fixture on the CPU:
//  1. whole-prompt prefill (direct MLA): every position's logits within kLogitTolerance;
//  2. 32 greedy steps, one token at a time through the paged cache (absorbed MLA):
//     tokens identical to the oracle's;
//  3. the prompt in chunks of 5 + 7 (second chunk: absorbed MLA with cached context):
//     logits within kLogitTolerance.
// Tolerance: max |logit - oracle| <= 1e-4 * max(1, max |oracle logit|). Weights are read
// exactly (BF16 / FP8 x scale) and everything accumulates in fp32, so the error is fp32
// rounding (~1e-5 relative); the fixtures' logit std is ~2.5 and the smallest top-1/top-2
// gap along the greedy path is recorded in reference.json (checks.min_top1_top2_gap_greedy).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/settings.h"
#include "model/model.h"
#include "paged_driver.h"
#include "routing_replay.h"

namespace deepinfer {
namespace {

constexpr double kLogitTolerance = 1e-4;  // relative to max(1, max |oracle logit|)
// On CUDA activations are BF16 (8 bits of mantissa), so logits carry ~1e-2 relative
// error after a few layers; greedy decoding is then checked teacher-forced (below).
constexpr double kLogitToleranceBf16 = 3e-2;

// DEEPINFER_ACCELERATOR=cuda runs the same tests on the CUDA backend (tools/gpu/run_all.sh).
bool on_cuda() {
  return env_settings().get_string("DEEPINFER_ACCELERATOR") == "cuda";
}

std::unique_ptr<Backend> make_test_backend() {
  if (!on_cuda()) return make_cpu_backend();
  BackendOptions options;
  options.cuda = cuda_options(env_settings());  // e.g. DEEPINFER_CUDA_SYNC=1
  auto backend = make_cuda_backend(options);
  DI_CHECK(backend != nullptr, "DEEPINFER_ACCELERATOR=cuda but deepinfer was built without CUDA");
  return backend;
}

// DEEPINFER_GOLDEN_DIR overrides the fixture root (e.g. fixtures regenerated elsewhere).
std::string fixture_dir(const std::string& name) {
  const std::string& root = env_settings().get_string("DEEPINFER_GOLDEN_DIR");
  return (!root.empty() ? root : std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures") + "/" +
         name;
}

struct Reference {
  std::vector<int32_t> prompt;
  std::vector<std::vector<double>> logits;  // [prompt positions][vocab]
  std::vector<int32_t> greedy;
};

Reference read_reference(const std::string& dir) {
  std::ifstream in(dir + "/reference.json");
  DI_CHECK(in.good(), dir, "/reference.json cannot be opened");
  const nlohmann::json j = nlohmann::json::parse(in);
  Reference r;
  r.prompt = j.at("prompt_ids").get<std::vector<int32_t>>();
  r.logits = j.at("logits").get<std::vector<std::vector<double>>>();
  r.greedy = j.at("greedy_ids").get<std::vector<int32_t>>();
  return r;
}

int32_t argmax(const std::vector<float>& row) {
  int32_t best = 0;
  for (size_t i = 1; i < row.size(); ++i) {
    if (row[i] > row[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

// Max |got - want| over rows [first, first + got.size()) of the reference.
double max_error(const std::vector<std::vector<float>>& got, const Reference& ref, size_t first,
                 double* scale) {
  double err = 0, mag = 1;
  for (size_t r = 0; r < got.size(); ++r) {
    const std::vector<double>& want = ref.logits.at(first + r);
    EXPECT_EQ(got[r].size(), want.size());
    for (size_t v = 0; v < want.size() && v < got[r].size(); ++v) {
      err = std::max(err, std::fabs(got[r][v] - want[v]));
      mag = std::max(mag, std::fabs(want[v]));
    }
  }
  *scale = mag;
  return err;
}

// Max |a - b| over two sets of logits rows.
double max_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double err = 0;
  EXPECT_EQ(a.size(), b.size());
  for (size_t r = 0; r < a.size() && r < b.size(); ++r) {
    for (size_t v = 0; v < a[r].size() && v < b[r].size(); ++v) {
      err = std::max(err, double(std::fabs(a[r][v] - b[r][v])));
    }
  }
  return err;
}

// CPU (fp32, the reference): the oracle's logits and free-running greedy tokens exactly.
void run_golden_cpu(const std::string& name, const Reference& ref, const std::string& dir) {
  auto backend = make_cpu_backend();
  auto model = load_model(dir, *backend);
  {  // 1 + 2: whole prefill, then greedy decode one token at a time.
    test::PagedDriver driver(*model, *backend);
    const int seq = driver.add_sequence();
    auto logits = driver.step({{seq, ref.prompt, true}});
    double scale = 1;
    const double err = max_error(logits, ref, 0, &scale);
    EXPECT_LE(err, kLogitTolerance * scale) << name << ": prefill max abs logit error " << err;
    std::printf("[golden] %s on %s prefill: max abs logit error %.3g (max |logit| %.3g)\n",
                name.c_str(), backend->name().c_str(), err, scale);
    std::vector<int32_t> generated = {argmax(logits.back())};
    while (generated.size() < ref.greedy.size()) {
      auto row = driver.step({{seq, {generated.back()}, false}});
      generated.push_back(argmax(row[0]));
    }
    EXPECT_EQ(generated, ref.greedy) << name << ": greedy tokens differ from the oracle";
  }
  {  // 3: the prompt in chunks 5 + 7 (absorbed MLA with cached context for the second).
    test::PagedDriver driver(*model, *backend);
    const int seq = driver.add_sequence();
    const size_t split = std::min<size_t>(5, ref.prompt.size());
    std::vector<int32_t> a(ref.prompt.begin(), ref.prompt.begin() + split);
    std::vector<int32_t> b(ref.prompt.begin() + split, ref.prompt.end());
    auto la = driver.step({{seq, a, true}});
    double scale = 1;
    double err = max_error(la, ref, 0, &scale);
    EXPECT_LE(err, kLogitTolerance * scale) << name << ": first chunk max abs error " << err;
    if (!b.empty()) {
      auto lb = driver.step({{seq, b, true}});
      err = max_error(lb, ref, split, &scale);
      EXPECT_LE(err, kLogitTolerance * scale) << name << ": second chunk max abs error " << err;
      std::printf("[golden] %s chunked: max abs logit error %.3g\n", name.c_str(), err);
    }
  }
}

// The CUDA forward next to the CPU reference over the same steps: the CPU records its MoE
// routing and V3.2's indexer top-k, CUDA replays them where a near-tie flipped one
// (routing_replay.h).
class CudaReplay {
 public:
  explicit CudaReplay(const std::string& dir)
      : cpu_(make_cpu_backend()),
        gpu_(make_test_backend()),
        cpu_rec_(*cpu_, log, test::RoutingReplayBackend::Mode::Record),
        gpu_rep_(*gpu_, log, test::RoutingReplayBackend::Mode::Replay),
        cpu_model_(load_model(dir, cpu_rec_)),
        gpu_model_(load_model(dir, gpu_rep_)) {}

  struct Pair {
    test::PagedDriver cpu, gpu;
  };
  std::unique_ptr<Pair> make_pair() {
    return std::unique_ptr<Pair>(new Pair{{*cpu_model_, cpu_rec_}, {*gpu_model_, gpu_rep_}});
  }
  // One step on both. Returns CUDA's logits (the CPU's into *cpu_logits when given).
  std::vector<std::vector<float>> step(Pair& p, const std::vector<test::PagedDriver::Chunk>& chunks,
                                       std::vector<std::vector<float>>* cpu_logits) {
    log.clear_calls();
    auto c = p.cpu.step(chunks);
    auto g = p.gpu.step(chunks);
    EXPECT_EQ(log.next, log.calls.size()) << "CUDA made fewer routing calls than the CPU";
    EXPECT_EQ(log.next_topk, log.topk_calls.size()) << "CUDA made fewer indexer top-k calls than the CPU";
    if (cpu_logits != nullptr) *cpu_logits = std::move(c);
    return g;
  }
  Backend& gpu() { return *gpu_; }
  void print_stats(const std::string& name) const {
    std::printf("[golden] %s on %s: routing of %lld tokens compared, %lld near-tie flips replaced "
                "(largest choice-score gap %.3g)\n",
                name.c_str(), gpu_->name().c_str(), static_cast<long long>(log.compared_tokens),
                static_cast<long long>(log.flipped_tokens), log.max_flip_margin);
    if (log.compared_rows > 0)
      std::printf("[golden] %s on %s: indexer top-k of %lld rows compared, %lld near-tie flips "
                  "replaced (largest relative score gap %.3g)\n",
                  name.c_str(), gpu_->name().c_str(), static_cast<long long>(log.compared_rows),
                  static_cast<long long>(log.flipped_rows), log.max_topk_margin);
  }

  test::RoutingLog log;  // before the backends that hold a reference to it

 private:
  std::unique_ptr<Backend> cpu_, gpu_;
  test::RoutingReplayBackend cpu_rec_, gpu_rep_;
  std::unique_ptr<Model> cpu_model_, gpu_model_;
};

// CUDA (BF16 activations), through CudaReplay:
//  1. whole-prompt prefill: logits within kLogitToleranceBf16 of the oracle;
//  2. 32 teacher-forced decode steps (the oracle's tokens as input): the oracle's token is the
//     argmax or within tolerance of it, and the logits within tolerance of the CPU's (fp32,
//     equal to the oracle's: the CPU test above);
//  3. chunks 5 + 7: logits within tolerance of the oracle.
void run_golden_cuda(const std::string& name, const Reference& ref, const std::string& dir) {
  CudaReplay r(dir);
  const double tolerance = kLogitToleranceBf16;
  {  // 1 + 2
    auto p = r.make_pair();
    const int seq = p->cpu.add_sequence();
    ASSERT_EQ(p->gpu.add_sequence(), seq);
    auto logits = r.step(*p, {{seq, ref.prompt, true}}, nullptr);
    double scale = 1;
    const double err = max_error(logits, ref, 0, &scale);
    EXPECT_LE(err, tolerance * scale) << name << ": prefill max abs logit error " << err;
    std::printf("[golden] %s on %s prefill: max abs logit error %.3g (max |logit| %.3g)\n",
                name.c_str(), r.gpu().name().c_str(), err, scale);
    std::vector<float> row = logits.back();
    int exact = 0;
    double decode_err = 0;
    for (size_t i = 0; i < ref.greedy.size(); ++i) {
      const int32_t want = ref.greedy[i];
      const int32_t got = argmax(row);
      exact += got == want;
      EXPECT_LE(row[got] - row[want], tolerance * scale)
          << name << ": step " << i << " argmax " << got << " but oracle chose " << want;
      if (i + 1 == ref.greedy.size()) break;
      std::vector<std::vector<float>> cpu_row;
      auto gpu_row = r.step(*p, {{seq, {want}, false}}, &cpu_row);
      const double e = max_diff(gpu_row, cpu_row);
      decode_err = std::max(decode_err, e);
      EXPECT_LE(e, tolerance * scale) << name << ": decode step " << i + 1 << " logits differ from the CPU's by " << e;
      row = gpu_row[0];
    }
    std::printf("[golden] %s on %s: %d/%zu teacher-forced steps exact, max abs logit error vs CPU %.3g\n",
                name.c_str(), r.gpu().name().c_str(), exact, ref.greedy.size(), decode_err);
  }
  {  // 3
    auto p = r.make_pair();
    const int seq = p->cpu.add_sequence();
    ASSERT_EQ(p->gpu.add_sequence(), seq);
    const size_t split = std::min<size_t>(5, ref.prompt.size());
    std::vector<int32_t> a(ref.prompt.begin(), ref.prompt.begin() + split);
    std::vector<int32_t> b(ref.prompt.begin() + split, ref.prompt.end());
    auto la = r.step(*p, {{seq, a, true}}, nullptr);
    double scale = 1;
    double err = max_error(la, ref, 0, &scale);
    EXPECT_LE(err, tolerance * scale) << name << ": first chunk max abs error " << err;
    if (!b.empty()) {
      auto lb = r.step(*p, {{seq, b, true}}, nullptr);
      err = max_error(lb, ref, split, &scale);
      EXPECT_LE(err, tolerance * scale) << name << ": second chunk max abs error " << err;
      std::printf("[golden] %s chunked on %s: max abs logit error %.3g\n", name.c_str(),
                  r.gpu().name().c_str(), err);
    }
  }
  r.print_stats(name);
}

void run_golden(const std::string& name) {
  const std::string dir = fixture_dir(name);
  if (!std::filesystem::exists(dir)) {
    GTEST_SKIP() << "golden fixture " << dir << " is missing (make it with "
                 << "tools/golden/make_golden.py --out tests/golden/fixtures)";
  }
  const Reference ref = read_reference(dir);
  ASSERT_EQ(ref.logits.size(), ref.prompt.size());
  if (on_cuda()) {
    run_golden_cuda(name, ref, dir);
  } else {
    run_golden_cpu(name, ref, dir);
  }
}

TEST(Golden, V3Tiny) { run_golden("v3_tiny"); }
TEST(Golden, V2LiteTiny) { run_golden("v2_lite_tiny"); }
TEST(Golden, V3Fp8Yarn) { run_golden("v3_fp8_yarn"); }

// DeepSeek-V3.2 (deepseek_v32, DeepSeek sparse attention) against transformers 5.17 on the CPU:
// index_topk 8 / 12 with prompts of 24 / 20 tokens, so from query index_topk on the indexer
// drops positions (reference.json checks: the smallest margin at the top-k cut, and how far
// dense attention would move the logits). The steps above (whole prefill with the direct
// form, 32 greedy tokens through the absorbed form, chunks 5 + rest) plus: chunks 3 + 6 + 7 +
// rest (the first chunk to cross index_topk has cached context) and a step holding two
// sequences (the whole prompt and a 10-token prefix) against the oracle.
// Oracle vs DeepSeek's reference (inference/model.py of DeepSeek-V3.2-Exp): the reference
// rotates the indexer's q/k by a Hadamard transform (orthogonal: q.k unchanged) and quantizes
// them to FP8 per 128 values before scoring; transformers and this engine score in fp32
// (precision only, not simulated). Both keep min(index_topk, context) positions. The indexer
// RoPE is non-interleaved in both (the GitHub copy's interleaved call was DeepSeek's bug,
// fixed in the HF repo's code). On CUDA (DEEPINFER_ACCELERATOR=cuda) every step runs next to
// the CPU reference with BF16 tolerance; indexer top-k near-ties (the fixtures' cut margins go
// down to 1.5e-4 relative) are replayed from the CPU as MoE routing is (routing_replay.h).
void run_golden_v32(const std::string& name) {
  run_golden(name);
  const std::string dir = fixture_dir(name);
  if (!std::filesystem::exists(dir)) return;  // run_golden skipped
  const Reference ref = read_reference(dir);
  // The CPU alone (fp32, kLogitTolerance) or CUDA next to it (CudaReplay, kLogitToleranceBf16).
  const bool cuda = on_cuda();
  const double tolerance = cuda ? kLogitToleranceBf16 : kLogitTolerance;
  std::unique_ptr<CudaReplay> replay;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  if (cuda) {
    replay = std::make_unique<CudaReplay>(dir);
  } else {
    backend = make_cpu_backend();
    model = load_model(dir, *backend);
  }
  struct Drivers {
    std::unique_ptr<test::PagedDriver> cpu;
    std::unique_ptr<CudaReplay::Pair> pair;
    int add_sequence() {
      if (!pair) return cpu->add_sequence();
      const int s = pair->cpu.add_sequence();
      EXPECT_EQ(pair->gpu.add_sequence(), s);
      return s;
    }
  };
  auto drivers = [&] {
    Drivers d;
    if (cuda)
      d.pair = replay->make_pair();
    else
      d.cpu = std::make_unique<test::PagedDriver>(*model, *backend);
    return d;
  };
  auto step = [&](Drivers& d, const std::vector<test::PagedDriver::Chunk>& chunks) {
    return cuda ? replay->step(*d.pair, chunks, nullptr) : d.cpu->step(chunks);
  };
  {
    Drivers d = drivers();
    const int seq = d.add_sequence();
    size_t first = 0;
    for (size_t len : {size_t{3}, size_t{6}, size_t{7}, ref.prompt.size()}) {
      const size_t end = std::min(ref.prompt.size(), first + len);
      if (end <= first) break;
      std::vector<int32_t> chunk(ref.prompt.begin() + first, ref.prompt.begin() + end);
      auto logits = step(d, {{seq, chunk, true}});
      double scale = 1;
      const double err = max_error(logits, ref, first, &scale);
      EXPECT_LE(err, tolerance * scale)
          << name << ": chunk [" << first << ", " << end << ") max abs logit error " << err;
      first = end;
    }
  }
  {
    Drivers d = drivers();
    const int a = d.add_sequence(), b = d.add_sequence();
    const std::vector<int32_t> prefix(ref.prompt.begin(), ref.prompt.begin() + 10);
    auto logits = step(d, {{a, ref.prompt, true}, {b, prefix, true}});
    ASSERT_EQ(logits.size(), ref.prompt.size() + prefix.size());
    const std::vector<std::vector<float>> rows_a(logits.begin(), logits.begin() + ref.prompt.size());
    const std::vector<std::vector<float>> rows_b(logits.begin() + ref.prompt.size(), logits.end());
    double scale = 1;
    double err = max_error(rows_a, ref, 0, &scale);
    EXPECT_LE(err, tolerance * scale) << name << ": batched sequence 0 max abs error " << err;
    err = max_error(rows_b, ref, 0, &scale);
    EXPECT_LE(err, tolerance * scale) << name << ": batched sequence 1 max abs error " << err;
  }
  if (cuda) replay->print_stats(name + " (chunks 3 + 6 + 7 + rest, two sequences)");
}

TEST(Golden, V32Tiny) { run_golden_v32("v32_tiny"); }
TEST(Golden, V32Fp8Ue8m0) { run_golden_v32("v32_fp8"); }

}  // namespace
}  // namespace deepinfer
