// `deepinfer info` on V4 (model/deepseek_v4/info.h): the parameter count from the config
// equals the parameters the golden checkpoints hold (both namings, FP8 + packed FP4), and
// the summary is V4-shaped.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "io/safetensors.h"
#include "model/deepseek_v4/info.h"

namespace deepinfer {
namespace {

std::string fixture(const std::string& name) {
  return std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/" + name;
}

// Elements of every tensor but block scales (E8M0), tid2eid (I64) and the routers'
// selection bias; packed FP4 (I8) holds two per byte.
int64_t checkpoint_parameters(const CheckpointReader& reader) {
  int64_t n = 0;
  for (const std::string& name : reader.names()) {
    const TensorInfo& t = reader.info(name);
    const bool bias = name.ends_with("e_score_correction_bias") || name.ends_with("gate.bias");
    if (t.dtype == DType::F8_E8M0 || t.dtype == DType::I64 || bias) continue;
    n += t.numel() * (t.dtype == DType::I8 ? 2 : 1);
  }
  return n;
}

class V4Info : public ::testing::TestWithParam<std::string> {};

TEST_P(V4Info, ParameterCountEqualsTheCheckpoint) {
  const DeepseekV4Config c = load_deepseek_v4_config(fixture(GetParam()));
  const CheckpointReader reader = CheckpointReader::open(fixture(GetParam()));
  const ParameterCount p = v4_parameter_count(c);
  EXPECT_EQ(p.total, checkpoint_parameters(reader)) << GetParam();
  // 8 routed experts top-2 of 3 * 64 * 32 each, on every one of the 3 layers.
  EXPECT_EQ(p.total - p.active_per_token, 3 * (8 - 2) * 3 * 64 * 32) << GetParam();
}

TEST_P(V4Info, DescribeIsV4Shaped) {
  auto reader = std::make_shared<const CheckpointReader>(CheckpointReader::open(fixture(GetParam())));
  nlohmann::json j;
  describe_deepseek_v4(fixture(GetParam()), reader, j);
  const std::string text = j.at("summary").get<std::string>();
  EXPECT_NE(text.find("1 window-only, 1 CSA (ratio 4, indexer), 1 HCA"), std::string::npos) << text;
  EXPECT_NE(text.find("hyper-connections      4 streams"), std::string::npos) << text;
  EXPECT_NE(text.find("csa_pending"), std::string::npos) << text;
  EXPECT_EQ(j.at("attention_kinds"), nlohmann::json({"window", "csa", "hca"}));
  EXPECT_EQ(j.at("parameters").at("total").get<int64_t>(),
            v4_parameter_count(load_deepseek_v4_config(fixture(GetParam()))).total);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, V4Info, ::testing::Values("v4_tiny", "v4_fp8_fp4"));

}  // namespace
}  // namespace deepinfer
