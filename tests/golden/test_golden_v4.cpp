// DeepSeek-V4 golden tests: the CPU prefill forward (model/deepseek_v4) against HF
// transformers 5.17's DeepseekV4ForCausalLM (fp32, eager) on tiny random checkpoints made
// by tools/golden/make_golden.py (v4_golden.py): fixtures/v4_* /{config.json,
// model.safetensors, reference.json}.
//  1. whole-prompt prefill: every position's logits within 1e-4 * max(1, max |oracle|);
//  2. greedy tokens decoded one at a time through the sequence state (window rows,
//     compressed entries, pending groups, CSA overlap) identical to the oracle's (which
//     recomputes without cache), and the same with a whole re-prefill every 8th step;
//  3. the prompt in chunks (7, 1, the rest): logits within the same tolerance.
// The shared expert is clamped as transformers does; DeepSeek's reference leaves it
// unclamped. In these fixtures no shared-expert pre-activation reaches the limit 10, so
// both rules give the same logits (checked: SharedExpertClampDoesNotActHere).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "io/safetensors.h"
#include "model/deepseek_v4/model.h"
#include "model/model.h"

namespace deepinfer {
namespace {

struct V4Reference {
  std::vector<int32_t> prompt, greedy;
  std::vector<std::vector<double>> logits;
};

V4Reference read(const std::string& dir) {
  std::ifstream in(dir + "/reference.json");
  DI_CHECK(in.good(), dir, "/reference.json cannot be opened");
  const nlohmann::json j = nlohmann::json::parse(in);
  return {j.at("prompt_ids").get<std::vector<int32_t>>(), j.at("greedy_ids").get<std::vector<int32_t>>(),
          j.at("logits").get<std::vector<std::vector<double>>>()};
}

std::string fixture(const std::string& name) {
  return std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/" + name;
}

double max_abs(const V4Reference& ref) {
  double m = 1.0;
  for (const auto& row : ref.logits)
    for (double v : row) m = std::max(m, std::fabs(v));
  return m;
}

// max |logits[t] - oracle[first + t]| over the rows of `logits`.
double worst_diff(const HostBuffer& logits, const V4Reference& ref, int64_t first) {
  const Tensor& t = logits.tensor();
  double worst = 0.0;
  for (int64_t r = 0; r < t.size(0); ++r)
    for (int64_t v = 0; v < t.size(1); ++v)
      worst = std::max(worst, std::fabs(t.ptr<const float>()[r * t.size(1) + v] - ref.logits[first + r][v]));
  return worst;
}

int32_t last_argmax(const HostBuffer& logits) {
  const Tensor& t = logits.tensor();
  const float* row = t.ptr<const float>() + (t.size(0) - 1) * t.size(1);
  return static_cast<int32_t>(std::max_element(row, row + t.size(1)) - row);
}

class GoldenV4 : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ref_ = read(fixture(GetParam()));
    backend_ = make_cpu_backend();
    model_ = load_model(fixture(GetParam()), *backend_);
    v4_ = dynamic_cast<DeepseekV4Model*>(model_.get());
    ASSERT_NE(v4_, nullptr);
  }
  V4Reference ref_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  DeepseekV4Model* v4_ = nullptr;
};

TEST_P(GoldenV4, PrefillLogitsMatchTransformers) {
  const int64_t T = static_cast<int64_t>(ref_.prompt.size()), V = v4_->vocab_size();
  HostBuffer logits(DType::F32, {T, V});
  v4_->prefill(ref_.prompt, logits.tensor());
  const double worst = worst_diff(logits, ref_, 0), max_ref = max_abs(ref_);
  std::printf("[golden v4] %s: prefill of %lld tokens, max |logit - oracle| = %.3g (max |oracle| %.3g)\n",
              GetParam().c_str(), static_cast<long long>(T), worst, max_ref);
  EXPECT_LE(worst, 1e-4 * max_ref) << GetParam();
}

TEST_P(GoldenV4, GreedyDecodeThroughTheSequenceStateMatchesTransformers) {
  const int64_t T = static_cast<int64_t>(ref_.prompt.size()), V = v4_->vocab_size();
  V4SequenceState state;
  HostBuffer logits(DType::F32, {T, V});
  v4_->step(state, ref_.prompt, logits.tensor());
  std::vector<int32_t> ids = ref_.prompt;
  int32_t next = last_argmax(logits);
  for (size_t step = 0; step < ref_.greedy.size(); ++step) {
    ASSERT_EQ(next, ref_.greedy[step]) << GetParam() << ": greedy step " << step;
    ids.push_back(next);
    HostBuffer one(DType::F32, {1, V});
    v4_->step(state, {next}, one.tensor());
    next = last_argmax(one);
    if (step % 8 == 7) {  // the state's decode logits equal a whole re-prefill's last row
      HostBuffer all(DType::F32, {static_cast<int64_t>(ids.size()), V});
      v4_->prefill(ids, all.tensor());
      double worst = 0.0;
      for (int64_t v = 0; v < V; ++v)
        worst = std::max(worst, static_cast<double>(std::fabs(all.ptr<float>()[(ids.size() - 1) * V + v] -
                                                              one.ptr<float>()[v])));
      EXPECT_LE(worst, 1e-4 * max_abs(ref_)) << GetParam() << ": decode vs re-prefill at step " << step;
    }
  }
}

TEST_P(GoldenV4, ChunkedPrefillMatchesTransformers) {
  const int64_t T = static_cast<int64_t>(ref_.prompt.size()), V = v4_->vocab_size();
  V4SequenceState state;
  int64_t first = 0;
  double worst = 0.0;
  for (int64_t len : {int64_t{7}, int64_t{1}, T - 8}) {
    std::vector<int32_t> chunk(ref_.prompt.begin() + first, ref_.prompt.begin() + first + len);
    HostBuffer logits(DType::F32, {len, V});
    v4_->step(state, chunk, logits.tensor());
    worst = std::max(worst, worst_diff(logits, ref_, first));
    first += len;
  }
  EXPECT_LE(worst, 1e-4 * max_abs(ref_)) << GetParam() << ": chunks 7 + 1 + " << T - 8;
}

TEST_P(GoldenV4, SharedExpertClampDoesNotActHere) {
  DeepseekV4Config c = load_deepseek_v4_config(fixture(GetParam()));
  c.clamp_shared_expert = false;  // DeepSeek's reference rule
  auto reader = std::make_shared<const CheckpointReader>(CheckpointReader::open(fixture(GetParam())));
  DeepseekV4Model unclamped(c, load_v4_weights(c, reader), *backend_);
  const int64_t T = static_cast<int64_t>(ref_.prompt.size()), V = v4_->vocab_size();
  HostBuffer a(DType::F32, {T, V}), b(DType::F32, {T, V});
  v4_->prefill(ref_.prompt, a.tensor());
  unclamped.prefill(ref_.prompt, b.tensor());
  for (int64_t i = 0; i < T * V; ++i) ASSERT_EQ(a.ptr<float>()[i], b.ptr<float>()[i]) << i;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenV4, ::testing::Values("v4_tiny", "v4_fp8_fp4"));

}  // namespace
}  // namespace deepinfer
