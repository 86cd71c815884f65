// include/deepinfer/eval.h: the dataset reader, raw records and scoring shared by
// `deepinfer eval` (app/cmd_eval.cpp) and Python's deepinfer.eval (python/src/bindings.cpp).
#include "deepinfer/eval.h"

#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "app/eval.h"
#include "app/request_line.h"
#include "core/error.h"
#include "core/settings.h"

#ifndef DEEPINFER_VERSION
#error "DEEPINFER_VERSION is set by app/CMakeLists.txt"
#endif

namespace deepinfer::eval {
namespace {

using nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json sampling_json(const SamplingParams& p) {
  json j = {{"n", p.n},
            {"temperature", p.temperature},
            {"top_p", p.top_p},
            {"top_k", p.top_k},
            {"min_p", p.min_p},
            {"repetition_penalty", p.repetition_penalty},
            {"frequency_penalty", p.frequency_penalty},
            {"presence_penalty", p.presence_penalty},
            {"max_tokens", p.max_tokens},
            {"min_tokens", p.min_tokens},
            {"stop", p.stop},
            {"stop_token_ids", p.stop_token_ids},
            {"ignore_eos", p.ignore_eos},
            {"seq_seed", p.seq_seed},
            {"skip_special_tokens", p.skip_special_tokens}};
  j["seed"] = p.seed ? json(*p.seed) : json(nullptr);
  if (!p.so_args.kind.empty()) j["so_args"] = {{"kind", p.so_args.kind}, {"source", p.so_args.source}};
  return j;
}

}  // namespace

std::vector<Task> read_dataset(const std::string& path, int samples, const SamplingParams& defaults_in) {
  DI_CHECK(samples >= 1 && samples <= SamplingParams::kMaxN, "samples: ", samples, " is outside 1..",
           SamplingParams::kMaxN);
  SamplingParams defaults = defaults_in;
  if (!defaults.seed) defaults.seed = 0;  // an eval is reproducible: the seed is always recorded
  std::ifstream in(path, std::ios::binary);
  DI_CHECK(in.good(), "dataset: cannot read ", path);
  app::JsonlReader reader(in);
  std::vector<Task> tasks;
  std::set<std::string> ids;
  while (auto line = reader.next()) {
    const std::string at = path + ": line " + std::to_string(line->line_no);
    DI_CHECK(!line->too_long, at, ": longer than ", app::kMaxRequestLineBytes, " bytes");
    try {
      app::eval::Item item = app::eval::parse_item(app::parse_request_json(line->text, at), line->line_no);
      DI_CHECK(ids.insert(item.id).second, "line ", line->line_no, ": id '", item.id, "' appears twice");
      item.request["n"] = samples;
      Task t;
      t.id = item.id;
      t.kind = app::eval::to_string(item.kind);
      t.item_json = dump(item.item);
      t.request_json = dump(item.request);
      app::RequestLine r = app::parse_request_line(t.request_json, line->line_no, defaults);
      r.params.validate();
      t.prompt = std::move(r.prompt);
      t.params = std::move(r.params);
      tasks.push_back(std::move(t));
    } catch (const Error& e) {
      fail("dataset: ", path, ": ", e.what());
    }
  }
  DI_CHECK(!tasks.empty(), "dataset: ", path, " has no items");
  return tasks;
}

SampleOutput sample_output(const RequestOutput& r, int sample) {
  SampleOutput s;
  if (!r.error.empty()) {
    s.finish_reason = "error";
    s.error = app::truncate_for_message(r.error, 1024);  // as batch result lines keep it
    return s;
  }
  DI_CHECK(sample >= 0 && static_cast<size_t>(sample) < r.outputs.size(), "sample ", sample, " of request ",
           r.request_id, ": it has ", r.outputs.size(), " outputs");
  const CompletionOutput& c = r.outputs[static_cast<size_t>(sample)];
  s.text = c.text;
  s.token_ids = c.token_ids;
  s.finish_reason = to_string(c.finish_reason);
  s.prompt_tokens = r.num_prompt_tokens;
  s.completion_tokens = r.num_output_tokens;
  s.cached_tokens = r.num_cached_tokens;
  return s;
}

std::string engine_record(const EngineConfig& c) {
  return dump({{"version", DEEPINFER_VERSION},
               {"model_dir", c.model_dir},
               {"random_weights_config", c.random_weights_config},
               {"backend", c.backend},
               {"batch_invariant", c.batch_invariant || env_settings().get_bool("DEEPINFER_BATCH_INVARIANT")},
               {"num_threads", c.num_threads},
               {"max_num_seqs", c.max_num_seqs},
               {"max_num_batched_tokens", c.max_num_batched_tokens},
               {"max_model_len", c.max_model_len},
               {"kv_block_size", c.kv_block_size},
               {"enable_prefix_caching", c.enable_prefix_caching},
               {"num_speculative_tokens", c.num_speculative_tokens},
               {"speculator", c.speculator}});
}

std::string raw_record(const Task& task, int sample, const SampleOutput& out, const EngineConfig& config) {
  const bool error = out.finish_reason == "error";
  json rec = {{"task_id", task.id},
              {"sample", sample},
              {"kind", task.kind},
              {"item", json::parse(task.item_json)},
              {"request", json::parse(task.request_json)},
              {"sampling", sampling_json(task.params)},
              {"seed", task.params.seed ? json(*task.params.seed) : json(nullptr)},
              {"seq_seed", task.params.seq_seed + static_cast<uint64_t>(sample)},
              {"text", error ? "" : out.text},
              {"token_ids", error ? json::array() : json(out.token_ids)},
              {"finish_reason", error ? "error" : out.finish_reason},
              {"engine", json::parse(engine_record(config))}};
  if (error) rec["error"] = out.error;
  if (out.prompt_tokens)
    rec["usage"] = {{"prompt_tokens", *out.prompt_tokens},
                    {"completion_tokens", out.completion_tokens.value_or(0)},
                    {"cached_tokens", out.cached_tokens.value_or(0)}};
  return dump(rec);
}

std::string score(const std::vector<std::string>& records, const ScoreOptions& options) {
  DI_CHECK(!records.empty(), "score: no records");
  std::vector<json> parsed;
  parsed.reserve(records.size());
  for (size_t i = 0; i < records.size(); ++i)
    parsed.push_back(app::parse_request_json(records[i], "record " + std::to_string(i + 1)));
  app::eval::ScoreOptions o;
  o.python = app::eval::resolve_python(options.python);
  o.code_timeout_s = options.code_timeout_s;
  o.check_structured_output = options.check_structured_output;
  o.structured_checker = options.structured_checker;
  return dump(app::eval::score_records(parsed, o));
}

}  // namespace deepinfer::eval
