// deepinfer eval: two-stage evaluation and exact perplexity baselines (app/eval.h).
//   deepinfer eval generate --dataset items.jsonl --output raw.jsonl [--samples K] [engine and
//                           sampling flags] [--resume]
//   deepinfer eval score --input raw.jsonl [--output scores.json] [--check-structured-output]
//   deepinfer eval ppl --texts texts.jsonl [--output ppl.jsonl] [--baseline FILE [--platform P]
//                      [--write-baseline]]
// generate runs the dataset through the batch runner (app/batch.h: durable, --resume) and
// writes one raw record per sample in dataset order; score reads only that file.
#include <CLI/CLI.hpp>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "app/batch.h"
#include "app/cli.h"
#include "app/commands.h"
#include "app/engine_flags.h"
#include "app/eval.h"
#include "core/settings.h"
#include "core/error.h"
#include "deepinfer/engine.h"
#include "deepinfer/eval.h"

namespace deepinfer::app {
namespace {

using nlohmann::json;


std::vector<json> read_jsonl(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  DI_CHECK(in.good(), flag, ": cannot read ", path);
  std::vector<json> out;
  JsonlReader reader(in);
  while (auto line = reader.next()) {
    DI_CHECK(!line->too_long, path, ": line ", line->line_no, ": longer than ", kMaxRequestLineBytes, " bytes");
    out.push_back(parse_request_json(line->text, path + ": line " + std::to_string(line->line_no)));
  }
  return out;
}

void write_file(const std::string& path, const std::string& text, const char* flag) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  DI_CHECK(out.good(), flag, ": cannot write ", path);
}

std::string dump(const json& j, int indent = -1) { return j.dump(indent, ' ', false, json::error_handler_t::replace); }

json engine_json(const EngineConfig& c) { return json::parse(deepinfer::eval::engine_record(c)); }

// A sample of a batch result line (app/batch.cpp's output_json) as the eval API's SampleOutput.
deepinfer::eval::SampleOutput sample_of(const json& res, int sample) {
  deepinfer::eval::SampleOutput s;
  if (res.contains("error")) {
    s.finish_reason = "error";
    s.error = res["error"].is_string() ? res["error"].get<std::string>() : dump(res["error"]);
    return s;
  }
  const json& out = res.contains("outputs") ? res["outputs"].at(static_cast<size_t>(sample)) : res;
  s.text = out.value("text", "");
  s.token_ids = out.value("token_ids", std::vector<int32_t>{});
  s.finish_reason = out.value("finish_reason", "");
  if (res.contains("usage")) {
    const json& u = res["usage"];
    s.prompt_tokens = u.value("prompt_tokens", int64_t{0});
    s.completion_tokens = u.value("completion_tokens", int64_t{0});
    s.cached_tokens = u.value("cached_tokens", int64_t{0});
  }
  return s;
}

int eval_generate(int argc, char** argv) {
  CLI::App app{"Run a dataset and write one raw JSONL record per sample (stage 1 of 2)", "eval generate"};
  show_defaults(app);
  EngineConfig config;
  ModelFlags model;
  add_engine_flags(app, config, model);
  SamplingFlags sampling;
  add_sampling_flags(app, sampling);
  std::string dataset, output;
  int samples = 1;
  bool resume = false;
  app.add_option("--dataset", dataset, "JSONL dataset (app/eval.h: id, kind, answer/tests + request fields)")
      ->required();
  app.add_option("--output", output,
                 "raw records (JSONL, one per sample, dataset order); OUTPUT.requests.jsonl and "
                 "OUTPUT.batch.jsonl hold the batch job")
      ->required();
  app.add_option("--samples", samples, "samples per item (k of pass@1; the request's n)")
      ->check(CLI::Range(1, SamplingParams::kMaxN));
  app.add_flag("--resume", resume, "keep OUTPUT.batch.jsonl's finished requests and run the rest");
  if (auto code = parse_flags(app, argc, argv)) return *code;
  apply_model_flags(model, DEEPINFER_DEFAULT_MODEL_DIR, config);
  // Items checked before the model loads.
  const std::vector<deepinfer::eval::Task> tasks = deepinfer::eval::read_dataset(dataset, samples, sampling.params());
  std::string requests;
  for (const deepinfer::eval::Task& t : tasks) requests += t.request_json + "\n";
  const std::string requests_path = output + ".requests.jsonl", batch_path = output + ".batch.jsonl";
  write_file(requests_path, requests, "--output");
  {
    SamplingParams defaults = sampling.params();
    if (!defaults.seed) defaults.seed = 0;
    BatchJob job({requests_path, batch_path, resume}, defaults);
    Engine engine(config);
    config.max_model_len = engine.max_model_len();
    const int code = job.run_until_signalled(engine);
    if (code >= 128) return code;  // stopped: --resume finishes it
  }
  std::map<size_t, json> results;
  for (json& r : read_jsonl(batch_path, "--output"))
    if (r.contains("index") && r["index"].is_number_unsigned()) {
      const size_t index = r["index"].get<size_t>();  // before the move (C++17 sequences the right side first)
      results[index] = std::move(r);
    }
  std::string raw;
  int num_errors = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    auto it = results.find(i);
    DI_CHECK(it != results.end(), batch_path, ": no result for item ", i + 1, " (", tasks[i].id,
             "); run again with --resume");
    num_errors += it->second.contains("error") ? 1 : 0;
    for (int j = 0; j < samples; ++j) raw += deepinfer::eval::raw_record(tasks[i], j, sample_of(it->second, j), config) + "\n";
  }
  write_file(output, raw, "--output");
  std::fprintf(stderr, "deepinfer eval generate: %zu items x %d samples -> %s (%d items failed)\n", tasks.size(),
               samples, output.c_str(), num_errors);
  return num_errors == 0 ? kExitOk : kExitError;
}

int eval_score(int argc, char** argv) {
  CLI::App app{"Grade the raw records of `eval generate` (stage 2 of 2; never runs the model)", "eval score"};
  show_defaults(app);
  std::string input, output, details;
  eval::ScoreOptions options;
  options.structured_checker = std::string(DEEPINFER_SOURCE_DIR) + "/tools/eval/check_structured.py";
  app.add_option("--input", input, "raw records from `eval generate --output`")->required();
  app.add_option("--output", output, "scores as JSON (summary, tasks, samples); default: the summary on stdout");
  app.add_option("--python", options.python, "Python 3 for code tests and the structured-output validator");
  app.add_option("--code-timeout", options.code_timeout_s, "seconds per code sample's tests")
      ->check(CLI::Range(0.1, 3600.0));
  app.add_flag("--check-structured-output", options.check_structured_output,
               "validate every output of a regex / json_schema / ebnf request with the independent validator "
               "(exit 1 when one that finished is invalid)");
  app.add_option("--structured-checker", options.structured_checker, "the validator script");
  if (auto code = parse_flags(app, argc, argv)) return *code;
  const std::vector<json> records = read_jsonl(input, "--input");
  DI_CHECK(!records.empty(), "--input: ", input, " has no records");
  options.python = eval::resolve_python(options.python);
  const json scores = eval::score_records(records, options);
  if (!output.empty()) write_file(output, dump(scores, 2) + "\n", "--output");
  std::printf("%s\n", dump(scores["summary"], 2).c_str());
  const json& s = scores["summary"];
  if (s.contains("structured_output") && s["structured_output"]["invalid"].get<int>() > 0) {
    std::fprintf(stderr, "deepinfer eval score: %d structured outputs are not valid\n",
                 s["structured_output"]["invalid"].get<int>());
    return kExitError;
  }
  return kExitOk;
}

std::string hex_of(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, bits);
  return buf;
}

int eval_ppl(int argc, char** argv) {
  CLI::App app{"Per-sample perplexity of texts by teacher forcing; exact (bitwise) baselines", "eval ppl"};
  show_defaults(app);
  EngineConfig config;
  ModelFlags model;
  add_engine_flags(app, config, model);
  std::string texts, output, baseline, platform;
  bool write_baseline = false;
  app.add_option("--texts", texts, "JSONL of {\"id\", \"text\"} (or \"prompt_token_ids\")")->required();
  app.add_option("--output", output, "per-sample results (JSONL); default: stdout");
  auto* base = app.add_option("--baseline", baseline,
                              "baselines JSON (tests/models/ppl_baselines.json): compare each sample's "
                              "perplexity bit for bit with the platform's entry (exit 1 on any difference)");
  app.add_option("--platform", platform, "baseline entry (default: the backend, + -batch-invariant when on)");
  app.add_flag("--write-baseline", write_baseline, "replace the platform's entry with these results")->needs(base);
  if (auto code = parse_flags(app, argc, argv)) return *code;
  apply_model_flags(model, DEEPINFER_DEFAULT_MODEL_DIR, config);
  const bool invariant = config.batch_invariant || env_settings().get_bool("DEEPINFER_BATCH_INVARIANT");
  if (platform.empty()) platform = config.backend + (invariant ? "-batch-invariant" : "");

  const std::vector<json> lines = read_jsonl(texts, "--texts");
  DI_CHECK(!lines.empty(), "--texts: ", texts, " has no texts");
  std::vector<std::pair<std::string, Prompt>> prompts;
  std::set<std::string> ids;
  for (size_t i = 0; i < lines.size(); ++i) {
    const json& l = lines[i];
    const std::string at = texts + ": line " + std::to_string(i + 1) + ": ";
    DI_CHECK(l.is_object() && l.contains("id") && l["id"].is_string(), at, "id: expected a string");
    const std::string id = l["id"].get<std::string>();
    DI_CHECK(ids.insert(id).second, at, "id '", id, "' appears twice");
    if (l.contains("text")) {
      DI_CHECK(l["text"].is_string(), at, "text: expected a string");
      prompts.push_back({id, Prompt::from_text(l["text"].get<std::string>())});
    } else {
      DI_CHECK(l.contains("prompt_token_ids") && l["prompt_token_ids"].is_array(), at,
               "expected \"text\" or \"prompt_token_ids\"");
      std::vector<int32_t> tok;
      for (const json& t : l["prompt_token_ids"]) tok.push_back(json_to_int32(t, "prompt_token_ids"));
      prompts.push_back({id, Prompt::from_tokens(std::move(tok))});
    }
  }
  json base_doc = json::object();
  if (!baseline.empty() && (!write_baseline || std::filesystem::exists(baseline)))
    base_doc = parse_request_json(read_text_file(baseline, "--baseline"), baseline);

  Engine engine(config);
  std::string out_lines;
  json entry = json::object();
  for (const auto& [id, prompt] : prompts) {
    std::vector<double> lp;
    try {
      lp = engine.prompt_logprobs(prompt);
    } catch (const Error& e) {
      fail(texts, ": ", id, ": ", e.what());
    }
    double sum = 0.0;
    for (double v : lp) sum += v;  // in token order
    const double nll = -sum / static_cast<double>(lp.size());
    const double ppl = std::exp(nll);
    const json rec = {{"id", id},         {"num_tokens", lp.size() + 1}, {"scored_tokens", lp.size()},
                      {"nll", nll},       {"ppl", ppl},                  {"nll_hex", hex_of(nll)},
                      {"ppl_hex", hex_of(ppl)}};
    out_lines += dump(rec) + "\n";
    entry[id] = {{"num_tokens", lp.size() + 1}, {"ppl", ppl}, {"ppl_hex", hex_of(ppl)}, {"nll_hex", hex_of(nll)}};
  }
  if (output.empty()) std::fwrite(out_lines.data(), 1, out_lines.size(), stdout);
  else write_file(output, out_lines, "--output");
  if (baseline.empty()) return kExitOk;
  if (write_baseline) {
    base_doc["texts"] = std::filesystem::path(texts).filename().string();
    base_doc["model"] = std::filesystem::path(config.model_dir).filename().string();
    base_doc["compare"] = "ppl_hex: the IEEE-754 bits of each sample's perplexity (a double), compared exactly";
    base_doc["platforms"][platform] = {{"engine", engine_json(config)}, {"samples", entry}};
    write_file(baseline, dump(base_doc, 2) + "\n", "--baseline");
    std::fprintf(stderr, "deepinfer eval ppl: wrote %zu baselines for platform %s to %s\n", entry.size(),
                 platform.c_str(), baseline.c_str());
    return kExitOk;
  }
  DI_CHECK(base_doc.contains("platforms") && base_doc["platforms"].contains(platform), "--baseline: ", baseline,
           " has no entry for platform '", platform, "' (--write-baseline makes one)");
  const json& want = base_doc["platforms"][platform]["samples"];
  int diffs = 0;
  for (const auto& [id, got] : entry.items()) {
    if (!want.contains(id)) {
      std::fprintf(stderr, "ppl baseline: %s: no baseline for this sample\n", id.c_str());
      ++diffs;
      continue;
    }
    const json& w = want[id];
    // Both sides as C++ values: string != json is ambiguous under C++20's rewritten operators
    // with g++ 13 (nlohmann 3.11).
    const std::string got_hex = got["ppl_hex"].get<std::string>();
    if (w.value("ppl_hex", "") != got_hex || w.value("num_tokens", 0) != got["num_tokens"].get<int>()) {
      std::fprintf(stderr, "ppl baseline: %s: got ppl %.17g (%s, %d tokens), baseline %.17g (%s, %d tokens)\n",
                   id.c_str(), got["ppl"].get<double>(), got["ppl_hex"].get<std::string>().c_str(),
                   got["num_tokens"].get<int>(), w.value("ppl", 0.0), w.value("ppl_hex", "").c_str(),
                   w.value("num_tokens", 0));
      ++diffs;
    }
  }
  for (const auto& [id, w] : want.items())
    if (!entry.contains(id)) {
      std::fprintf(stderr, "ppl baseline: %s: in the baseline but not in --texts\n", id.c_str());
      ++diffs;
    }
  std::fprintf(stderr, "deepinfer eval ppl: %zu samples, %d differ from %s [%s]\n", entry.size(), diffs,
               baseline.c_str(), platform.c_str());
  return diffs == 0 ? kExitOk : kExitError;
}

}  // namespace

int cmd_eval(int argc, char** argv) {
  const char* usage =
      "usage: deepinfer eval generate|score|ppl [flags]\n"
      "  generate  run a dataset, one raw JSONL record per sample (request, sampling, seed, output, engine)\n"
      "  score     pass@1 over the samples of each task from the raw records alone (never runs the model)\n"
      "  ppl       per-sample perplexity by teacher forcing; --baseline compares bit for bit\n"
      "Run `deepinfer eval <stage> --help` for its flags.\n";
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? kExitUsage : kExitOk;
  }
  const std::string stage = argv[1];
  if (stage == "generate") return eval_generate(argc - 1, argv + 1);
  if (stage == "score") return eval_score(argc - 1, argv + 1);
  if (stage == "ppl") return eval_ppl(argc - 1, argv + 1);
  throw UsageError("eval: unknown stage '" + stage + "' (generate, score or ppl)");
}

}  // namespace deepinfer::app
