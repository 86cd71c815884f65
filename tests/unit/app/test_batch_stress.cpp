// Batch mode under stress (meant for the ASan+UBSan build too): random mixes of good and
// bad JSONL lines on the embedded tiny model. Every line gets exactly one result line;
// each bad line is its own error; every good line's result equals its solo result (the
// same line run alone on a fresh engine), also when the run is stopped and resumed.
#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <map>
#include <random>

#include "app/batch.h"
#include "core/error.h"
#include "tests/unit/io/temp_dir.h"

namespace deepinfer::app {
namespace {

using nlohmann::json;

EngineConfig engine_config(bool solo) {
  EngineConfig c;
  c.model_dir = DEEPINFER_DEFAULT_MODEL_DIR;
  c.batch_invariant = true;  // a row's numbers do not depend on the batch around it
  c.num_threads = 2;
  c.kv_block_size = 16;
  c.max_model_len = 256;
  if (solo) {
    c.max_num_seqs = 1;
    c.enable_prefix_caching = false;
  }
  return c;
}

Engine& batch_engine() {
  static Engine e(engine_config(false));
  return e;
}
Engine& solo_engine() {
  static Engine e(engine_config(true));
  return e;
}

const char* kPrompts[] = {"def add(a, b):", "import os\n", "class Stack:", "for i in range(3):", "# sum a list\n"};

std::string good_line(std::mt19937& rng) {
  json j;
  const std::string prompt = kPrompts[rng() % 5];
  j["max_tokens"] = 1 + static_cast<int>(rng() % 6);
  switch (rng() % 8) {
    case 0: j["prompt"] = prompt; j["temperature"] = 0; break;
    case 1: j["prompt"] = prompt; j["temperature"] = 0.8; j["top_k"] = 20; j["top_p"] = 0.9;
            j["seed"] = rng(); break;
    case 2: j["prompt"] = prompt; j["n"] = 2; j["temperature"] = 1.0; j["seed"] = rng(); break;
    case 3: j["prompt"] = prompt; j["temperature"] = 0; j["stop"] = {"\n", ")"}; j["max_tokens"] = 8; break;
    case 4: j["prompt"] = prompt; j["temperature"] = 0; j["logprobs"] = 2; break;
    case 5: j["messages"] = {{{"role", "user"}, {"content", prompt}}}; j["temperature"] = 0; break;
    case 6: j["prompt_token_ids"] = {2 + rng() % 500, 2 + rng() % 500, 2 + rng() % 500};
            j["temperature"] = 0; j["ignore_eos"] = true; j["min_tokens"] = 1; break;
    default: j["prompt"] = prompt; j["temperature"] = 0; j["regex"] = "[a-z ]{1,8}"; break;
  }
  return j.dump();
}

std::string bad_line(std::mt19937& rng) {
  switch (rng() % 12) {
    case 0: return "{\"prompt\": \"bad \xff byte\", \"max_tokens\": 2}";
    case 1: return "{\"prompt\": \"unterminated";
    case 2: return R"({"prompt": "x", "max_token": 3})";
    case 3: return R"({"prompt": "x", "n": 1e9})";
    case 4: return R"({"prompt": "x", "max_tokens": 4294967298})";
    case 5: return R"({"prompt": "x", "temperature": -1})";
    case 6: {
      std::string words;
      for (int i = 0; i < 300; ++i) words += "word ";
      return json{{"prompt", words}, {"max_tokens", 2}}.dump();  // longer than the 256-token context
    }
    case 7: return R"({"prompt_token_ids": [1, 999999], "max_tokens": 2})";  // outside the vocabulary
    case 8: return "{\"prompt\": \"x\", \"schema\": " + std::string(5000, '[') + std::string(5000, ']') + "}";
    case 9: return R"({"prompt": "x", "regex": "a", "ebnf": "root ::= \"a\""})";
    case 10: return R"({"prompt": "x", "regex": "((("})";  // the engine's grammar compiler refuses it
    default: return R"({"prompt": ""})";
  }
}

// A result line without the fields that depend on timing or on the prefix cache.
json comparable(json j) {
  j.erase("index");
  j.erase("time_to_first_token_s");
  j.erase("decode_tokens_per_s");
  j.erase("spec_decode");  // draft counts depend on the batch (the default drafts; its tokens do not)
  if (j.contains("usage")) j["usage"].erase("cached_tokens");
  return j;
}

std::vector<json> read_results(const std::string& path) {
  std::vector<json> rows;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) rows.push_back(json::parse(line));
  return rows;
}

json solo_result(const testing::TempDir& dir, const std::string& line) {
  static std::map<std::string, json> cache;
  if (auto it = cache.find(line); it != cache.end()) return it->second;
  BatchOptions o{dir.write("solo_in.jsonl", line + "\n"), dir.file("solo_out.jsonl"), false, false};
  BatchJob job(o, SamplingParams{});
  job.run(solo_engine());
  const std::vector<json> rows = read_results(o.output);
  EXPECT_EQ(rows.size(), 1u);
  return cache[line] = rows.empty() ? json() : comparable(rows[0]);
}

struct Mix {
  std::vector<std::string> requests;  // by index
  std::vector<bool> good;
  std::string file_text;              // with blank lines between some requests
};

Mix random_mix(uint32_t seed, int num_lines) {
  std::mt19937 rng(seed);
  Mix m;
  for (int i = 0; i < num_lines; ++i) {
    const bool good = rng() % 2 == 0;
    m.requests.push_back(good ? good_line(rng) : bad_line(rng));
    m.good.push_back(good);
    m.file_text += m.requests.back() + "\n";
    if (rng() % 6 == 0) m.file_text += "\n";
  }
  return m;
}

void expect_results(const testing::TempDir& dir, const Mix& m, const std::vector<json>& rows) {
  ASSERT_EQ(rows.size(), m.requests.size());
  std::vector<int> seen(m.requests.size(), 0);
  for (const json& row : rows) {
    const size_t i = row.at("index").get<size_t>();
    ASSERT_LT(i, m.requests.size());
    ++seen[i];
    if (m.good[i]) {
      EXPECT_FALSE(row.contains("error")) << "request " << i << ": " << m.requests[i] << " -> " << row.dump();
      EXPECT_EQ(comparable(row), solo_result(dir, m.requests[i])) << "request " << i << ": " << m.requests[i];
    } else {
      EXPECT_EQ(row.value("finish_reason", ""), "error") << "request " << i << ": " << row.dump();
      EXPECT_FALSE(row.value("error", "").empty());
      EXPECT_LT(row.value("error", "").size(), 400u) << "request " << i;
    }
  }
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "request " << i << " results";
}

TEST(BatchStress, EveryGoodLineGetsItsSoloResult) {
  for (uint32_t seed : {1u, 2u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    testing::TempDir dir;
    const Mix m = random_mix(seed, 18);
    BatchOptions o{dir.write("in.jsonl", m.file_text), dir.file("out.jsonl"), false, false};
    BatchJob job(o, SamplingParams{});
    EXPECT_EQ(job.num_requests(), m.requests.size());
    const int code = job.run(batch_engine());
    const bool any_bad = std::find(m.good.begin(), m.good.end(), false) != m.good.end();
    EXPECT_EQ(code, any_bad ? 1 : 0);
    expect_results(dir, m, read_results(o.output));
  }
}

TEST(BatchStress, StoppedRunKeepsFinishedLinesAndResumeCompletesIt) {
  testing::TempDir dir;
  const Mix m = random_mix(3, 16);
  BatchOptions o{dir.write("in.jsonl", m.file_text), dir.file("out.jsonl"), false, false};
  size_t first_run = 0;
  {
    BatchJob job(o, SamplingParams{});
    int polls = 0;
    EXPECT_EQ(job.run(batch_engine(), [&] { return ++polls > 3 ? SIGINT : 0; }), 128 + SIGINT);
    first_run = read_results(o.output).size();
    EXPECT_GT(first_run, 0u);
    EXPECT_LT(first_run, m.requests.size());
  }
  // The stopped run's requests are still in the engine; a fresh one finishes the rest.
  Engine fresh(engine_config(false));
  o.resume = true;
  BatchJob job(o, SamplingParams{});
  EXPECT_EQ(job.num_skipped(), first_run);
  job.run(fresh);
  expect_results(dir, m, read_results(o.output));
}

TEST(BatchStress, ResumeCutsAPartialLastLine) {
  testing::TempDir dir;
  const std::string out = dir.write("out.jsonl", "{\"index\": 0, \"text\": \"a\"}\n{\"index\": 2}\n{\"index\": 1, \"te");
  EXPECT_EQ(finished_indices(out), (std::set<size_t>{0, 2}));
  std::ifstream in(out);
  const std::string kept((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(kept, "{\"index\": 0, \"text\": \"a\"}\n{\"index\": 2}\n");
  EXPECT_TRUE(finished_indices(dir.file("missing.jsonl")).empty());
}

TEST(BatchStress, UnwritableOutputFailsBeforeAnyWork) {
  testing::TempDir dir;
  BatchOptions o{dir.write("in.jsonl", "{\"prompt\": \"x\"}\n"), dir.path() + "/no/such/dir/out.jsonl", false, false};
  try {
    BatchJob job(o, SamplingParams{});
    FAIL() << "an unwritable --output was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--output: cannot write"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer::app
