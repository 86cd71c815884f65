// The architecture registry (model/registry.h): model_type -> config reader and
// forward; unknown model_types are refused with the list of known ones.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <functional>
#include <set>
#include <string>

#include "backend/backend.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "model/config.h"
#include "model/model.h"
#include "model/registry.h"
#include "expect_error.h"
#include "temp_dir.h"

namespace deepinfer {
namespace {

nlohmann::json official_v3() {
  return nlohmann::json::parse(read_text_file(std::string(DEEPINFER_SOURCE_DIR) +
                                              "/tests/unit/io/data/deepseek_v3_official_config.json"));
}

using testing::error_of;
using testing::expect_contains;

TEST(Registry, HoldsEachModelTypeOnce) {
  std::set<std::string> seen;
  for (const Architecture& a : architectures()) {
    EXPECT_TRUE(seen.insert(a.model_type).second) << a.model_type << " registered twice";
    EXPECT_NE(a.parse_config, nullptr) << a.model_type;
    EXPECT_FALSE(a.description.empty()) << a.model_type;
  }
  for (const char* t : {"deepseek_v3", "deepseek_v2", "deepseek_v32"}) {
    EXPECT_EQ(find_architecture(t, "x").model_type, t);
    EXPECT_NE(find_architecture(t, "x").load, nullptr) << t << " has a loader";
  }
}

TEST(Registry, ReaderIsChosenByModelType) {
  // The same numbers read as deepseek_v2 take V2's routing defaults (softmax, greedy).
  nlohmann::json j = official_v3();
  for (const char* k : {"topk_method", "scoring_func", "n_group", "topk_group", "norm_topk_prob"})
    j.erase(k);
  EXPECT_EQ(parse_model_config(j.dump(), "t.json").scoring_func, "sigmoid");
  j["model_type"] = "deepseek_v2";
  const ModelConfig v2 = parse_model_config(j.dump(), "t.json");
  EXPECT_EQ(v2.model_type, "deepseek_v2");
  EXPECT_EQ(v2.scoring_func, "softmax");
  EXPECT_EQ(v2.topk_method, "greedy");
}

TEST(Registry, RefusesUnknownModelTypeListingTheKnownOnes) {
  nlohmann::json j = official_v3();
  j["model_type"] = "llama";
  const std::string msg = error_of([&] { parse_model_config(j.dump(), "dir/config.json"); });
  expect_contains(msg, {"dir/config.json", "model_type", "'llama'", "'deepseek_v3'", "'deepseek_v2'"});
  expect_contains(error_of([] { find_architecture("deepseek_v9", "src"); }),
                  {"src", "'deepseek_v9'", "'deepseek_v3'"});
  j.erase("model_type");
  expect_contains(error_of([&] { parse_model_config(j.dump(), "dir/config.json"); }),
                  {"'model_type'", "missing", "'deepseek_v3'"});
  j["model_type"] = 3;
  expect_contains(error_of([&] { parse_model_config(j.dump(), "dir/config.json"); }),
                  {"'model_type'", "expected a string", "3"});
}

TEST(Registry, LoadModelRefusesUnknownModelType) {
  testing::TempDir dir;
  nlohmann::json j = official_v3();
  j["model_type"] = "mixtral";
  dir.write("config.json", j.dump());
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  LoadOptions options;
  expect_contains(error_of([&] { random_model(dir.file("config.json"), *cpu, options); }),
                  {"'mixtral'", "'deepseek_v3'"});
  expect_contains(error_of([&] { load_model(dir.path(), *cpu, options); }),
                  {"'mixtral'", "'deepseek_v2'"});
}

// Architecture::kv_groups(config) is what the loaded model declares (deepinfer info lists it
// without loading weights): V3 one latent group, V3.2 latent + indexer keys.
TEST(Registry, KvGroupsFromTheConfigEqualTheLoadedModels) {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  const std::string fixtures = std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/";
  for (const char* name : {"v3_tiny", "v2_lite_tiny", "v32_tiny"}) {
    auto model = load_model(fixtures + name, *cpu);
    const Architecture& arch = find_architecture(model->config().model_type, name);
    ASSERT_NE(arch.kv_groups, nullptr) << name;
    const std::vector<KvGroupSpec> want = model->kv_groups(), got = arch.kv_groups(model->config());
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t g = 0; g < want.size(); ++g) {
      EXPECT_EQ(got[g].name, want[g].name) << name;
      EXPECT_EQ(got[g].num_layers, want[g].num_layers) << name;
      EXPECT_EQ(got[g].row_dim, want[g].row_dim) << name;
      EXPECT_EQ(got[g].tokens_per_row, want[g].tokens_per_row) << name;
      EXPECT_EQ(got[g].window, want[g].window) << name;
      EXPECT_EQ(got[g].row_bytes(DType::BF16), want[g].row_bytes(DType::BF16)) << name;
    }
  }
  const auto v32 = find_architecture("deepseek_v32", "x").kv_groups(
      load_model_config(fixtures + "v32_tiny"));
  ASSERT_EQ(v32.size(), 2u);
  EXPECT_EQ(v32[0].name, "latent");
  EXPECT_EQ(v32[0].row_dim, 64 + 16);  // kv_lora_rank + qk_rope_head_dim
  EXPECT_EQ(v32[1].name, "indexer_keys");
  EXPECT_EQ(v32[1].row_dim, 32);  // index_head_dim
  EXPECT_EQ(v32[1].num_layers, 3);
}

}  // namespace
}  // namespace deepinfer
