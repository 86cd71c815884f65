// grammar_maskbench: our matcher on MaskBench (JSON Schemas with valid/invalid instances) with
// a real tokenizer. Per schema: compile time; per instance: tokenize, then per token fill_mask
// (timed) + accept_token, checking that the mask bit agrees; verdict = complete match.
//   grammar_maskbench --maskbench DIR --tokenizer DIR [--limit N] [--stride K] [--jsonl OUT] [--cpu-clock]
// --cpu-clock: masks timed by the thread's CPU clock instead of the wall clock. On the shared
// 2-core build box (load 5-12) preemption inflates wall times 2-3x and makes them noisy; CPU
// time compares two builds more stably (it still rises with cache contention).
// Prints one summary JSON object: schemas compiled/refused, instances judged right, schema
// pass share (compiled and every instance right), mask time avg/p50/p99, compile time p50.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

using namespace deepinfer;
using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {
double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }
double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}
// Times f() in microseconds by the wall clock, or the thread's CPU clock.
template <typename F>
double time_us(bool cpu_clock, F&& f) {
  if (cpu_clock) {
    const double t0 = thread_cpu_us();
    f();
    return thread_cpu_us() - t0;
  }
  const auto t0 = Clock::now();
  f();
  return us_since(t0);
}
double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"grammar maskbench"};
  std::string dir, tok_dir, jsonl;
  int limit = 0, stride = 1;
  bool cpu_clock = false;
  app.add_option("--maskbench", dir)->required();
  app.add_option("--tokenizer", tok_dir)->required();
  app.add_option("--limit", limit);
  app.add_option("--stride", stride);
  app.add_option("--jsonl", jsonl);
  app.add_flag("--cpu-clock", cpu_clock, "time masks by the thread's CPU clock");
  CLI11_PARSE(app, argc, argv);

  Tokenizer tok = Tokenizer::from_dir(tok_dir);
  auto vocab = grammar::vocabulary_from_tokenizer(tok);

  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::ofstream out_jsonl;
  if (!jsonl.empty()) out_jsonl.open(jsonl);

  std::vector<double> mask_us, compile_us;
  int num_schemas = 0, num_compiled = 0, num_passed = 0, num_inst = 0, num_inst_right = 0, mask_disagree = 0;
  std::map<std::string, int> refusals;
  std::vector<uint32_t> mask(vocab->num_mask_words());
  for (size_t fi = 0; fi < files.size(); fi += stride) {
    if (limit && num_schemas >= limit) break;
    json doc = json::parse(std::ifstream(files[fi]));
    ++num_schemas;
    json rec = {{"file", files[fi].filename().string()}};
    std::shared_ptr<const grammar::CompiledGrammar> g;
    auto t0 = Clock::now();
    try {
      g = grammar::CompiledGrammar::compile({grammar::GrammarSpec::Kind::JsonSchema, doc["schema"].dump(), true},
                                            vocab);
    } catch (const Error& e) {
      std::string why = e.what();
      rec["refused"] = why;
      auto p = why.find(" at ");
      refusals[why.substr(0, p)]++;
      if (out_jsonl) out_jsonl << rec.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
      continue;
    }
    compile_us.push_back(us_since(t0));
    rec["compile_us"] = compile_us.back();
    ++num_compiled;
    bool all_right = true;
    json wrong = json::array();
    for (const auto& test : doc["tests"]) {
      ++num_inst;
      std::string text = test["data"].dump(-1, ' ', false, json::error_handler_t::replace);
      grammar::GrammarMatcher m(g);
      bool ok = true;
      for (int32_t id : tok.encode(text, false)) {
        mask_us.push_back(time_us(cpu_clock, [&] { m.fill_mask(mask.data()); }));
        bool bit = (mask[id >> 5] >> (id & 31)) & 1;
        bool acc = m.accept_token(id);
        if (bit != acc) ++mask_disagree;
        if (!acc) {
          ok = false;
          break;
        }
      }
      if (ok) {
        mask_us.push_back(time_us(cpu_clock, [&] { m.fill_mask(mask.data()); }));
      }
      bool verdict = ok && m.can_terminate();
      bool right = verdict == test["valid"].get<bool>();
      num_inst_right += right;
      if (!right) {
        all_right = false;
        wrong.push_back({{"valid", test["valid"]}, {"text", text.substr(0, 300)}});
      }
    }
    num_passed += all_right;
    rec["wrong"] = wrong;
    rec["cache_entries"] = g->mask_cache().num_entries();
    if (out_jsonl) out_jsonl << rec.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
  }
  double sum = 0;
  for (double x : mask_us) sum += x;
  json summary = {{"engine", "deepinfer"},
                  {"mask_clock", cpu_clock ? "thread_cpu" : "wall"},
                  {"schemas", num_schemas},
                  {"compiled", num_compiled},
                  {"passed", num_passed},
                  {"instances", num_inst},
                  {"instances_right", num_inst_right},
                  {"mask_disagreements", mask_disagree},
                  {"mask_us_avg", mask_us.empty() ? 0 : sum / mask_us.size()},
                  {"mask_us_p50", pct(mask_us, 0.5)},
                  {"mask_us_p99", pct(mask_us, 0.99)},
                  {"num_masks", mask_us.size()},
                  {"compile_us_p50", pct(compile_us, 0.5)},
                  {"compile_us_p90", pct(compile_us, 0.9)},
                  {"refusals", refusals}};
  std::cout << summary.dump(1) << std::endl;
  return 0;
}
