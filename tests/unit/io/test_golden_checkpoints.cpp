// The golden fixtures (tests/golden/fixtures/<name>/{config.json,
// model.safetensors}, made by tools/golden/make_golden.py with transformers)
// load: config parses and every weight matches it. Skipped until they exist.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <set>
#include <string>

#include "io/safetensors.h"
#include "model/config.h"
#include "model/weights.h"

namespace deepinfer {
namespace {

class GoldenCheckpoint : public ::testing::TestWithParam<const char*> {};

TEST_P(GoldenCheckpoint, ConfigAndWeightsLoad) {
  const std::string dir = std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/" + GetParam();
  struct stat st {};
  if (::stat((dir + "/config.json").c_str(), &st) != 0) GTEST_SKIP() << dir << " not present yet";
  ModelConfig c = load_model_config(dir);
  ModelWeights w = load_weights(dir, c);
  EXPECT_EQ(static_cast<int>(w.layers.size()), c.num_hidden_layers);
  // Every tensor in the file is accounted for by the weights (nothing silently ignored),
  // except checkpoint-only extras the forward does not use.
  CheckpointReader r = CheckpointReader::open(dir);
  uint64_t used_bytes = 0;
  std::set<const void*> seen;
  w.for_each_tensor([&](const std::string&, Tensor& t) {
    if (seen.insert(t.data).second) used_bytes += t.num_bytes();
  });
  EXPECT_EQ(used_bytes, r.total_bytes()) << "checkpoint holds tensors the loader did not use";
  if (c.num_nextn_predict_layers > 0 && r.has("model.layers." + std::to_string(c.num_hidden_layers) + ".eh_proj.weight")) {
    EXPECT_EQ(static_cast<int>(w.mtp.size()), c.num_nextn_predict_layers);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenCheckpoint,
                         ::testing::Values("v3_tiny", "v2_lite_tiny", "v3_fp8_yarn"));

}  // namespace
}  // namespace deepinfer
