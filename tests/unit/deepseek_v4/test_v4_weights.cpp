// DeepSeek-V4 weight reading: bad checkpoints give errors naming the tensor (issue 16
// item 7): tid2eid ids outside the expert range, FP4 scales of the wrong shape, a missing
// tensor. Each case rewrites the v4_fp8_fp4 golden fixture (DeepSeek's names, FP8 + FP4)
// with one tensor changed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/weights.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;

const std::string kFixture = std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/v4_fp8_fp4";

// Copies the fixture into a fresh directory, letting `edit` replace or drop tensors, and returns
// the error message of load_v4_weights ("" when it loads).
std::string load_error(const std::function<bool(const std::string&, const Tensor&, SafetensorsWriter&)>& edit) {
  const fs::path dir = fs::temp_directory_path() / ("deepinfer_v4_weights_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kFixture + "/config.json", dir / "config.json");
  {
    CheckpointReader src = CheckpointReader::open(kFixture);
    SafetensorsWriter w;
    for (const std::string& name : src.names()) {
      Tensor t = src.tensor(name);
      if (!edit(name, t, w)) w.add(name, t);
    }
    w.write((dir / "model.safetensors").string());
  }
  std::string error;
  try {
    DeepseekV4Config c = load_deepseek_v4_config(dir.string());
    auto reader = std::make_shared<const CheckpointReader>(CheckpointReader::open(dir.string()));
    load_v4_weights(c, reader);
  } catch (const Error& e) {
    error = e.what();
  }
  fs::remove_all(dir);
  return error;
}

TEST(DeepseekV4Weights, FixtureLoadsUnchanged) {
  EXPECT_EQ(load_error([](const std::string&, const Tensor&, SafetensorsWriter&) { return false; }), "");
}

TEST(DeepseekV4Weights, Tid2eidOutsideTheExpertsIsRefusedNamingTheTensor) {
  const std::string e = load_error([](const std::string& name, const Tensor& t, SafetensorsWriter& w) {
    if (name != "layers.0.ffn.gate.tid2eid") return false;
    std::vector<int64_t> v(t.ptr<const int64_t>(), t.ptr<const int64_t>() + t.numel());
    v[7] = 8;  // 8 routed experts: ids 0..7
    w.add_bytes(name, DType::I64, t.dims(), v.data(), v.size() * sizeof(int64_t));
    return true;
  });
  EXPECT_NE(e.find("layers.0.ffn.gate.tid2eid"), std::string::npos) << e;
  EXPECT_NE(e.find("expert 8"), std::string::npos) << e;
}

TEST(DeepseekV4Weights, Fp4ScalesOfTheWrongShapeAreRefusedNamingTheTensor) {
  const std::string e = load_error([](const std::string& name, const Tensor& t, SafetensorsWriter& w) {
    if (name != "layers.1.ffn.experts.3.w1.scale") return false;
    std::vector<int64_t> dims = t.dims();
    dims[1] -= 1;
    w.add_bytes(name, t.dtype, dims, t.data, static_cast<size_t>(dims[0] * dims[1]));
    return true;
  });
  EXPECT_NE(e.find("layers.1.ffn.experts.3.w1.scale"), std::string::npos) << e;
  EXPECT_NE(e.find("shape"), std::string::npos) << e;
}

TEST(DeepseekV4Weights, MissingTensorIsNamedInBothSpellings) {
  const std::string e = load_error([](const std::string& name, const Tensor&, SafetensorsWriter&) {
    return name == "layers.2.attn.compressor.ape";
  });
  EXPECT_NE(e.find("layers.2.attn.compressor.ape"), std::string::npos) << e;
  EXPECT_NE(e.find("model.layers.2.self_attn.compressor.position_bias"), std::string::npos) << e;
}

}  // namespace
}  // namespace deepinfer
