// MaskBench (real-world schemas with valid and invalid instances, judged by the benchmark's
// authors): every schema compiles or is refused with deepinfer::Error, and on compiled schemas
// the byte-level verdict matches the instance's `valid` flag. test_grammar_maskbench_quick uses
// every MASKBENCH_STRIDE-th file (runs under ASan); test_grammar_maskbench (label slow) uses all.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tests/unit/grammar/test_util.h"

namespace deepinfer::grammar {
namespace {

TEST(GrammarMaskBench, InstancesJudgedAsLabelled) {
  const std::filesystem::path dir = std::filesystem::path(DEEPINFER_SHARED_DIR) / "data/maskbench";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no MaskBench data at " << dir;
  const int stride = MASKBENCH_STRIDE;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  auto vocab = testing::small_vocab({});
  int compiled = 0, refused = 0, instances = 0, right = 0, valid_rejected = 0;
  for (size_t i = 0; i < files.size(); i += stride) {
    auto doc = nlohmann::ordered_json::parse(std::ifstream(files[i]));
    std::shared_ptr<const CompiledGrammar> g;
    try {
      g = CompiledGrammar::compile({GrammarSpec::Kind::JsonSchema, doc["schema"].dump()}, vocab);
    } catch (const Error& e) {
      ++refused;
      const std::string why = e.what();
      EXPECT_TRUE(why.rfind("json schema", 0) == 0 || why.rfind("grammar", 0) == 0) << files[i] << ": " << why;
      continue;
    }
    ++compiled;
    for (const auto& t : doc["tests"]) {
      std::string text = t["data"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      bool verdict = testing::matches(g, text);
      bool valid = t["valid"].get<bool>();
      ++instances;
      right += verdict == valid;
      valid_rejected += valid && !verdict;
    }
  }
  std::printf("maskbench stride %d: compiled %d refused %d, instances right %d/%d, valid rejected %d\n", stride,
              compiled, refused, right, instances, valid_rejected);
  ASSERT_GT(compiled, 0);
  // Floors from the measured run (see grammar/README.md); a regression fails here.
  EXPECT_GE(compiled, (compiled + refused) * 70 / 100);
  EXPECT_GE(right, instances * 85 / 100);
}

}  // namespace
}  // namespace deepinfer::grammar
