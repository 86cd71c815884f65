// `deepinfer info` for DeepSeek-V4.1: the parameter count against the fixture checkpoint's own
// tensors, and the KV bytes per token of the released schedule in the cache formats (890 B of
// global KV per token: MODELS.md).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "io/safetensors.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/info.h"
#include "model/deepseek_v41/kv_layout.h"

namespace deepinfer {
namespace {

const std::string kDir = std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/v41_tiny";

TEST(DeepseekV41Info, ParameterCountIsTheCheckpointsTensors) {
  auto reader = std::make_shared<const CheckpointReader>(CheckpointReader::open(kDir));
  int64_t total = 0;
  for (const std::string& name : reader->names()) {
    const bool bias = name.size() > 10 && (name.rfind(".gate.bias") == name.size() - 10 ||
                                           name.rfind(".gate.bias_vl") == name.size() - 13);
    if (!bias) total += reader->tensor(name).numel();
  }
  nlohmann::json out;
  describe_deepseek_v41(kDir, reader, out);
  EXPECT_EQ(out["parameters"]["total"].get<int64_t>(), total);
  EXPECT_EQ(out["kv_source_layer_ids"], nlohmann::json({1, 3, 4}));
  // Compact prefill truncation: layers above the last KV source (5, 6); floor window 8 + 2 x (5 + 1),
  // exact from 2 layers x (8 - 1) + 1 rows.
  EXPECT_EQ(out["prefill_truncation"]["first_layer"], 5);
  EXPECT_EQ(out["prefill_truncation"]["keep_floor"], 20);
  EXPECT_EQ(out["prefill_truncation"]["exact_keep"], 15);
  EXPECT_NE(out["summary"].get<std::string>().find("layers 5-6 on a prompt's last"), std::string::npos);
  EXPECT_NE(out["summary"].get<std::string>().find("index sources          [1, 3, 4, 6]"),
            std::string::npos)
      << out["summary"].get<std::string>();
  // Groups: window (7 layers), ratio 2 (sources 1, 3: entries, keys, pending), ratio 1 (source 4).
  std::vector<std::string> names;
  for (const auto& g : out["kv_groups"]) names.push_back(g["name"].get<std::string>());
  EXPECT_EQ(names, (std::vector<std::string>{"window", "compressed_r2", "indexer_keys_r2",
                                             "pending_r2", "compressed_r1", "indexer_keys_r1"}));
  // A window ring per layer; compressed rows only at the KV sources (2 of ratio 2, 1 of ratio 1).
  std::vector<int> layers;
  for (const auto& g : out["kv_groups"]) layers.push_back(g["num_layers"].get<int>());
  EXPECT_EQ(layers, (std::vector<int>{7, 2, 2, 2, 1, 1}));
  // Layers 2 and 3 read slot 0 and 1 of the ratio-2 groups (sources 1 and 3); 5 and 6 source 4's.
  const V41KvLayout lay = v41_kv_layout(load_deepseek_v41_config(kDir));
  EXPECT_EQ(lay.source_slot, (std::vector<int>{-1, 0, 0, 1, 0, 0, 0}));
  EXPECT_EQ(lay.ratio_of_layer, (std::vector<int>{-1, 0, 0, 0, 1, 1, 1}));
}

// With Engram (tables, wkv, q/k weights; the tables' scales are not parameters), and its token group.
TEST(DeepseekV41Info, ParameterCountHoldsTheEngramTables) {
  const std::string dir = std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/v41_engram";
  auto reader = std::make_shared<const CheckpointReader>(CheckpointReader::open(dir));
  int64_t total = 0;
  for (const std::string& name : reader->names()) {
    auto ends = [&](const std::string& t) {
      return name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
    };
    if (!ends(".gate.bias") && !ends(".gate.bias_vl") && !ends(".embed.scale"))
      total += reader->tensor(name).numel();
  }
  nlohmann::json out;
  describe_deepseek_v41(dir, reader, out);
  EXPECT_EQ(out["parameters"]["total"].get<int64_t>(), total);
  EXPECT_EQ(out["kv_groups"].back()["name"], "engram_tokens");
  EXPECT_NE(out["summary"].get<std::string>().find("layers [1, 5]"), std::string::npos)
      << out["summary"].get<std::string>();
}

TEST(DeepseekV41Info, ReleasedScheduleHolds890BytesOfGlobalKvPerToken) {
  const nlohmann::json cfg = {{"model_type", "deepseek_v41"},
                              {"text_config", nlohmann::json::object()}};
  const DeepseekV41Config c = parse_deepseek_v41_config(cfg, "cfg.json");
  double per_token = 0.0;
  int64_t window = 0;
  for (const KvGroupSpec& g : v41_kv_layout(c).groups) {
    const int64_t bytes = g.num_layers * v41_format_row_bytes(g);
    if (g.name == "window")
      window = bytes / g.num_layers;
    else if (g.name.rfind("pending", 0) != 0)
      per_token += static_cast<double>(bytes) / g.tokens_per_row;
  }
  // Ratio 2: 3 sources x (288 + 68) B per 2 tokens; ratio 1: 1 source x (288 + 68) B per token.
  EXPECT_EQ(per_token, 890.0);
  EXPECT_EQ(window, 528);  // 512 FP8 + 16 E8M0 scales
}

}  // namespace
}  // namespace deepinfer
