// DeepSeek-V4's MTP block (model/deepseek_v4: V4MtpBlock, DeepseekV4Model::mtp_forward) on
// fixtures/v4_mtp (tools/golden/v4_mtp_golden.py). transformers 5.17 has NO V4 MTP module
// (DeepseekV4ForCausalLM ignores `mtp.*`), so the reference is written from the description of
// DeepSeek's V4 inference code (inference/model.py, MTPBlock): e_proj(enorm(embed(t_{i+1})))
// added to every stream of h_proj(hnorm(h_i)), h_i the main model's hyper-connection streams
// after its last layer; then a full window-only V4 block (transformers' DeepseekV4DecoderLayer,
// run as a fourth layer of the oracle model with its input replaced by a hook); then the
// block's own hc_head and norm and the shared head. Row i sits at position i.
//  1. through the runner (target step, then run_mtp over every prompt position from the
//     target's hidden rows): the MTP logits within 1e-4 * max(1, max |oracle|), the main
//     model's last logits too;
//  2. fixtures/v4_mtp_hf (the same values, the MTP block in transformers' spelling
//     model.mtp.0.self_attn.*, fused experts): the same MTP logits bit for bit;
//  3. a config declaring more MTP layers than the checkpoint holds: an Error naming the
//     missing tensor; load_mtp off: no MTP block, no error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/backend.h"
#include "model/config.h"
#include "model/model.h"
#include "runner/runner.h"

namespace deepinfer {
namespace {

std::string fixture(const std::string& name) {
  return std::string(DEEPINFER_SOURCE_DIR) + "/tests/golden/fixtures/" + name;
}

double worst(const float* got, const std::vector<double>& want, double& max_ref) {
  double w = 0.0;
  for (size_t v = 0; v < want.size(); ++v) {
    w = std::max(w, std::fabs(got[v] - want[v]));
    max_ref = std::max(max_ref, std::fabs(want[v]));
  }
  return w;
}

// The MTP logits of every prompt position of `dir`'s model (target step, then one MTP pass).
std::vector<float> mtp_logits(const std::string& dir, const std::vector<int32_t>& prompt,
                              const std::vector<int32_t>& next) {
  auto backend = make_cpu_backend();
  auto model = load_model(dir, *backend);
  RunnerConfig rc;
  rc.num_kv_blocks = 64;
  rc.kv_block_size = 4;
  rc.max_num_batched_tokens = 64;
  rc.max_num_seqs = 2;
  rc.max_model_len = 64;
  rc.max_logits_per_seq = 32;
  rc.num_mtp_kv_layers = 1;
  Runner runner(*model, *backend, rc);
  const int S = static_cast<int>(prompt.size());
  std::vector<int32_t> blocks;
  for (int32_t b = 1; b <= 8; ++b) blocks.push_back(b);
  const std::vector<std::vector<int32_t>> more(model->kv_groups().size() - 1, blocks);
  std::vector<RunSeq> target = {{prompt, 0, S, blocks, true, 1, more}};
  runner.execute(target);
  std::vector<RunSeq> pass = {{next, 0, S, blocks, true, S}};
  std::vector<int32_t> rows(static_cast<size_t>(S));
  for (int i = 0; i < S; ++i) rows[static_cast<size_t>(i)] = i;
  runner.run_mtp(pass, rows, true, true);
  const Tensor& ml = runner.mtp_logits();
  return std::vector<float>(ml.ptr<float>(), ml.ptr<float>() + ml.numel());
}

TEST(GoldenV4Mtp, TransformersSpellingLoadsTheSameBlock) {
  std::ifstream in(fixture("v4_mtp") + "/reference.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json j = nlohmann::json::parse(in);
  const auto prompt = j.at("prompt_ids").get<std::vector<int32_t>>();
  const auto next = j.at("next_ids").get<std::vector<int32_t>>();
  const std::vector<float> a = mtp_logits(fixture("v4_mtp"), prompt, next);
  const std::vector<float> b = mtp_logits(fixture("v4_mtp_hf"), prompt, next);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), prompt.size() * 256);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_TRUE(a[i] == b[i]) << "logit " << i << ": " << a[i] << " vs " << b[i];
}

TEST(GoldenV4Mtp, MtpLogitsMatchTheReference) {
  std::ifstream in(fixture("v4_mtp") + "/reference.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json j = nlohmann::json::parse(in);
  const auto prompt = j.at("prompt_ids").get<std::vector<int32_t>>();
  const auto next = j.at("next_ids").get<std::vector<int32_t>>();
  const auto mtp_ref = j.at("mtp_logits").get<std::vector<std::vector<double>>>();
  const auto main_ref = j.at("main_logits").get<std::vector<std::vector<double>>>();
  const int S = static_cast<int>(prompt.size());
  auto backend = make_cpu_backend();
  auto model = load_model(fixture("v4_mtp"), *backend);
  ASSERT_EQ(model->num_mtp_layers(), 1);
  ASSERT_EQ(model->mtp_hidden_size(), 4 * model->config().hidden_size);  // hc_mult streams
  RunnerConfig rc;
  rc.num_kv_blocks = 64;
  rc.kv_block_size = 4;
  rc.max_num_batched_tokens = 64;
  rc.max_num_seqs = 2;
  rc.max_model_len = 64;
  rc.max_logits_per_seq = 32;
  rc.num_mtp_kv_layers = 1;
  Runner runner(*model, *backend, rc);
  const std::vector<KvGroupSpec> groups = model->kv_groups();
  std::vector<int32_t> blocks;
  for (int32_t b = 1; b <= 8; ++b) blocks.push_back(b);
  const std::vector<std::vector<int32_t>> more(groups.size() - 1, blocks);
  ASSERT_EQ(model->mtp_kv_group(), 0);  // the window group is the first: its table is block_ids
  std::vector<RunSeq> target = {{prompt, 0, S, blocks, true, 1, more}};
  const Tensor& logits = runner.execute(target);
  double max_main = 1.0;
  const double main_diff = worst(logits.ptr<float>(), main_ref.back(), max_main);
  EXPECT_LE(main_diff, 1e-4 * max_main);
  std::vector<RunSeq> pass = {{next, 0, S, blocks, true, S}};
  std::vector<int32_t> rows(static_cast<size_t>(S));
  for (int i = 0; i < S; ++i) rows[static_cast<size_t>(i)] = i;
  const std::vector<int32_t>& ids = runner.run_mtp(pass, rows, true, true);
  const Tensor& ml = runner.mtp_logits();
  ASSERT_EQ(ml.size(0), S);
  double max_ref = 1.0, diff = 0.0;
  int argmax_same = 0;
  for (int i = 0; i < S; ++i) {
    const float* row = ml.ptr<float>() + static_cast<int64_t>(i) * ml.size(1);
    diff = std::max(diff, worst(row, mtp_ref[static_cast<size_t>(i)], max_ref));
    const auto& r = mtp_ref[static_cast<size_t>(i)];
    argmax_same += ids[static_cast<size_t>(i)] == static_cast<int32_t>(std::max_element(r.begin(), r.end()) - r.begin());
  }
  std::printf("[golden v4] v4_mtp: MTP logits of %d rows, max |logit - reference| = %.3g (max |ref| %.3g); "
              "main last row %.3g; argmax equal in %d/%d rows\n", S, diff, max_ref, main_diff, argmax_same, S);
  EXPECT_LE(diff, 1e-4 * max_ref);
  EXPECT_EQ(argmax_same, S);
}

// A config declaring two MTP layers over a checkpoint holding one: the first missing tensor
// of block 1 is named. load_mtp off reads none; mtp_optional (the engine's default k) loads
// the block the checkpoint has.
TEST(GoldenV4Mtp, MissingMtpTensorsAreNamed) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("v4_mtp_missing_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  fs::create_directories(dir);
  std::ifstream in(fixture("v4_mtp") + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg["num_nextn_predict_layers"] = 2;
  std::ofstream(dir / "config.json") << cfg.dump();
  fs::remove(dir / "model.safetensors");
  fs::create_symlink(fs::path(fixture("v4_mtp")) / "model.safetensors", dir / "model.safetensors");
  auto backend = make_cpu_backend();
  try {
    load_model(dir.string(), *backend);
    FAIL() << "no error";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'mtp.1."), std::string::npos) << what;
    EXPECT_NE(what.find("MTP block 1"), std::string::npos) << what;
    EXPECT_NE(what.find("is missing"), std::string::npos) << what;
  }
  LoadOptions no_mtp;
  no_mtp.load_mtp = false;
  EXPECT_EQ(load_model(dir.string(), *backend, no_mtp)->num_mtp_layers(), 0);
  LoadOptions optional;
  optional.mtp_optional = true;
  EXPECT_EQ(load_model(dir.string(), *backend, optional)->num_mtp_layers(), 1);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace deepinfer
