// Numerics guarded end to end (issue 12): NaN logits end only their request, with
// finish_reason Error and a message, on every sampling path (device argmax, Backend::sample,
// host sampler; asynchronous or not); a tokenizer smaller than the model is never given ids it
// lacks, a larger one is an error at construction; a checkpoint with a NaN weight fails to
// load naming the tensor, and loaded anyway (skip_weight_check) only its requests fail.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "core/settings.h"
#include "engine_fixture.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/config.h"
#include "model/weights.h"
#include "tokenizer/byte_level.h"

namespace deepinfer::testing {
namespace {

constexpr int32_t kPoison = 0;  // random_tokens never gives 0

std::unique_ptr<Engine> fake_engine(EngineConfig cfg, int vocab, int32_t nan_token, int nan_after_len,
                                    std::unique_ptr<Tokenizer> tok = nullptr) {
  BackendOptions bo;
  bo.num_threads = 1;
  auto impl = std::make_unique<Engine::Impl>(
      cfg, make_cpu_backend(bo), std::make_unique<FakeModel>(vocab, kEos, 4096, nan_token, nan_after_len),
      std::move(tok));
  return std::make_unique<Engine>(std::move(impl));
}

struct Path {
  bool async;
  bool device_sampling;
  float temperature;
  int logprobs;
};
const Path kPaths[] = {
    {true, true, 0.0f, -1},   // device argmax, issued ahead
    {false, true, 0.0f, -1},  // device argmax, one step at a time
    {true, true, 0.8f, -1},   // Backend::sample, issued ahead
    {true, false, 0.8f, -1},  // host sampler
    {true, true, 0.0f, 2},    // host sampler with logprobs (greedy)
};

std::string describe(const Path& p) {
  return std::string(p.async ? "async" : "sync") + (p.device_sampling ? " device" : " host") + " T " +
         std::to_string(p.temperature) + " logprobs " + std::to_string(p.logprobs);
}

EngineConfig config_for(const Path& p) {
  EngineConfig cfg;
  cfg.kv_block_size = 8;
  cfg.max_num_seqs = 8;
  cfg.max_num_batched_tokens = 128;
  cfg.async_scheduling = p.async;
  cfg.device_sampling = p.device_sampling;
  cfg.seed = 5;
  return cfg;
}

// Requests 1 and 4 hold the poison token: they end with an error and no tokens; every other
// request gets exactly what a model without NaN gives it.
TEST(EngineNumerics, NanLogitsEndOnlyThatRequestWithAnError) {
  for (const Path& path : kPaths) {
    SCOPED_TRACE(describe(path));
    std::mt19937 rng(3);
    std::vector<Prompt> prompts;
    std::vector<SamplingParams> params;
    for (int i = 0; i < 7; ++i) {
      std::vector<int32_t> t = random_tokens(rng, 3 + i);
      if (i == 1 || i == 4) t[t.size() / 2] = kPoison;
      prompts.push_back(Prompt::from_tokens(t));
      SamplingParams p;
      p.temperature = path.temperature;
      p.logprobs = path.logprobs;
      p.max_tokens = 6 + i;
      p.ignore_eos = true;
      p.n = i == 4 ? 2 : 1;
      params.push_back(p);
    }
    auto clean = fake_engine(config_for(path), kVocab, -1, -1);
    const auto want = clean->generate(prompts, params);
    auto broken = fake_engine(config_for(path), kVocab, kPoison, -1);
    std::vector<RequestOutput> got;
    ASSERT_NO_THROW(got = broken->generate(prompts, params));
    ASSERT_EQ(got.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (i == 1 || i == 4) {
        EXPECT_TRUE(got[i].finished);
        EXPECT_NE(got[i].error.find("NaN"), std::string::npos) << i << ": '" << got[i].error << "'";
        for (const CompletionOutput& c : got[i].outputs) {
          EXPECT_EQ(c.finish_reason, FinishReason::Error) << i;
          EXPECT_TRUE(c.token_ids.empty()) << i;
        }
        continue;
      }
      EXPECT_TRUE(got[i].error.empty()) << i << ": " << got[i].error;
      ASSERT_EQ(got[i].outputs.size(), want[i].outputs.size());
      EXPECT_EQ(got[i].outputs[0].token_ids, want[i].outputs[0].token_ids) << i;
      EXPECT_EQ(got[i].outputs[0].finish_reason, FinishReason::Length) << i;
    }
  }
}

// NaN in the middle of decoding (contexts longer than 12 tokens, so the token at position 13):
// the tokens before it stay, the request ends with an error naming that position; requests
// that finish first are untouched.
TEST(EngineNumerics, NanMidDecodeKeepsTheTokensBeforeIt) {
  for (const Path& path : kPaths) {
    SCOPED_TRACE(describe(path));
    std::mt19937 rng(8);
    std::vector<Prompt> prompts;
    std::vector<SamplingParams> params;
    for (int i = 0; i < 6; ++i) {
      prompts.push_back(Prompt::from_tokens(random_tokens(rng, 5)));
      SamplingParams p;
      p.temperature = path.temperature;
      p.logprobs = path.logprobs;
      p.max_tokens = i % 2 ? 4 : 20;  // odd: done at 9 tokens, before any NaN
      p.ignore_eos = true;
      params.push_back(p);
    }
    auto clean = fake_engine(config_for(path), kVocab, -1, -1);
    const auto want = clean->generate(prompts, params);
    auto broken = fake_engine(config_for(path), kVocab, -1, 12);
    std::vector<RequestOutput> got;
    ASSERT_NO_THROW(got = broken->generate(prompts, params));
    for (size_t i = 0; i < prompts.size(); ++i) {
      const CompletionOutput& c = got[i].outputs[0];
      if (i % 2) {
        EXPECT_EQ(c.finish_reason, FinishReason::Length) << i;
        EXPECT_EQ(c.token_ids, want[i].outputs[0].token_ids) << i;
        continue;
      }
      EXPECT_EQ(c.finish_reason, FinishReason::Error) << i;
      EXPECT_NE(got[i].error.find("position 13"), std::string::npos) << got[i].error;
      const std::vector<int32_t> before(want[i].outputs[0].token_ids.begin(),
                                        want[i].outputs[0].token_ids.begin() + 8);
      EXPECT_EQ(c.token_ids, before) << i;  // positions 5..12
    }
  }
}

// A byte-level tokenizer with ids [0, 258): 256 bytes, "ab", and one added token.
std::unique_ptr<Tokenizer> small_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[tokenizer_detail::byte_level_encode(std::string(1, static_cast<char>(b)))] = b;
  vocab["ab"] = 256;
  nlohmann::json j = {
      {"version", "1.0"},
      {"added_tokens", nlohmann::json::array({{{"id", 257}, {"content", "<s>"}, {"special", true},
                                               {"normalized", false}, {"lstrip", false}, {"rstrip", false},
                                               {"single_word", false}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array({"a b"})}}}};
  return std::make_unique<Tokenizer>(Tokenizer::from_json(j.dump(), "small/tokenizer.json"));
}

// Model vocab 300, tokenizer 258: on every path no sampled id is >= 258 (before, ids the
// tokenizer lacks were emitted and silently dropped from the text), and the text is the
// tokens' text.
TEST(EngineNumerics, TokenizerSmallerThanTheModelIsNeverGivenIdsItLacks) {
  const int model_vocab = 300;
  for (const Path& path : kPaths) {
    SCOPED_TRACE(describe(path));
    auto engine = fake_engine(config_for(path), model_vocab, -1, -1, small_tokenizer());
    std::mt19937 rng(2);
    std::vector<Prompt> prompts;
    for (int i = 0; i < 8; ++i) {
      std::vector<int32_t> t(4);
      for (auto& x : t) x = 2 + static_cast<int32_t>(rng() % 250);
      prompts.push_back(Prompt::from_tokens(t));
    }
    SamplingParams p;
    p.temperature = path.temperature > 0 ? 3.0f : 0.0f;  // hot: the whole row is in play
    p.logprobs = path.logprobs;
    p.max_tokens = 40;
    p.ignore_eos = true;
    const auto out = engine->generate(prompts, {p});
    int64_t tokens = 0;
    for (const RequestOutput& r : out) {
      ASSERT_TRUE(r.error.empty()) << r.error;
      for (int32_t id : r.outputs[0].token_ids) {
        EXPECT_LT(id, 258);
        EXPECT_GE(id, 0);
        ++tokens;
      }
      EXPECT_EQ(r.outputs[0].text, engine->decode(r.outputs[0].token_ids));
      for (const TokenLogprob& lp : r.outputs[0].logprobs)
        for (const auto& [id, v] : lp.top) EXPECT_LT(id, 258);
    }
    EXPECT_EQ(tokens, 8 * 40);
  }
}

TEST(EngineNumerics, TokenizerLargerThanTheModelIsAnError) {
  EngineConfig cfg;
  try {
    fake_engine(cfg, 200, -1, -1, small_tokenizer());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("258"), std::string::npos) << m;
    EXPECT_NE(m.find("200"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(fake_engine(cfg, 258, -1, -1, small_tokenizer()));  // equal sizes are fine
}

// The real model (tests/data/tiny_v3, random BF16 weights written to a checkpoint) with a
// NaN in the embedding row of token 77: the load fails naming the tensor and element; with
// skip_weight_check it loads, the requests holding token 77 fail, the others equal a clean
// checkpoint's output.
TEST(EngineNumerics, NanWeightFailsTheLoadOrOnlyItsRequests) {
  const std::string config_path = DEEPINFER_SOURCE_DIR "/tests/data/tiny_v3/config.json";
  const ModelConfig mc = load_model_config(config_path);
  const std::filesystem::path base = std::filesystem::temp_directory_path() / "deepinfer_numerics_nan_weight";
  std::filesystem::remove_all(base);
  const std::filesystem::path good = base / "good", bad = base / "bad";
  std::filesystem::create_directories(good);
  std::filesystem::create_directories(bad);
  std::filesystem::copy_file(config_path, good / "config.json");
  std::filesystem::copy_file(config_path, bad / "config.json");
  write_random_checkpoint(mc, 5, DType::BF16, false, good.string());
  {
    CheckpointReader r = CheckpointReader::open(good.string());
    SafetensorsWriter w;
    for (const std::string& n : r.names()) {
      Tensor t = r.tensor(n);
      if (n != "model.embed_tokens.weight") {
        w.add(n, t);
        continue;
      }
      std::vector<uint16_t> v(t.ptr<uint16_t>(), t.ptr<uint16_t>() + t.numel());
      v[77 * mc.hidden_size + 3] = 0x7FC0;  // NaN
      w.add_bytes(n, t.dtype, t.dims(), v.data(), v.size() * 2);
    }
    w.write((bad / "model.safetensors").string());
  }
  EngineConfig cfg;
  cfg.model_dir = bad.string();
  cfg.num_threads = 2;
  cfg.batch_invariant = true;
  cfg.kv_block_size = 16;
  cfg.num_kv_blocks = 64;
  cfg.max_num_seqs = 8;
  // DEEPINFER_ACCELERATOR=cuda: the same on the GPU (device argmax / sampling op, graphs, steps
  // issued ahead from a -1 id), where the other requests must not see the NaN either.
  if (env_settings().get_string("DEEPINFER_ACCELERATOR") == "cuda")
    cfg.backend = "cuda";
  try {
    Engine e(cfg);
    ADD_FAILURE() << "expected the load to fail";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'model.embed_tokens.weight'"), std::string::npos) << m;
    EXPECT_NE(m.find("NaN at element " + std::to_string(77 * mc.hidden_size + 3)), std::string::npos) << m;
  }
  std::vector<Prompt> prompts = {Prompt::from_tokens({5, 9, 300}), Prompt::from_tokens({5, 77, 8}),
                                 Prompt::from_tokens({12, 13, 14, 15}), Prompt::from_tokens({77})};
  for (float t : {0.0f, 0.7f}) {
    SamplingParams p;
    p.temperature = t;
    p.seed = 4;
    p.max_tokens = 5;
    p.ignore_eos = true;
    cfg.skip_weight_check = true;
    Engine broken(cfg);
    const auto got = broken.generate(prompts, {p});
    EngineConfig clean_cfg = cfg;
    clean_cfg.model_dir = good.string();
    clean_cfg.skip_weight_check = false;
    Engine clean(clean_cfg);
    const auto want = clean.generate(prompts, {p});
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (i == 1 || i == 3) {
        EXPECT_EQ(got[i].outputs[0].finish_reason, FinishReason::Error) << i;
        EXPECT_NE(got[i].error.find("NaN"), std::string::npos) << got[i].error;
      } else {
        EXPECT_TRUE(got[i].error.empty()) << got[i].error;
        EXPECT_EQ(got[i].outputs[0].token_ids, want[i].outputs[0].token_ids) << i;
        EXPECT_EQ(got[i].outputs[0].token_ids.size(), 5u) << i;
      }
    }
  }
  std::filesystem::remove_all(base);
}

}  // namespace
}  // namespace deepinfer::testing
