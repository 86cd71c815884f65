// deepinfer generate: one prompt streamed to stdout, or a JSONL batch.
//   deepinfer generate [--model DIR] --prompt TEXT [--chat] [--max-tokens N ...]
//   deepinfer generate [--model DIR] --input prompts.jsonl --output out.jsonl
// Input lines: {"prompt": "..."} or {"messages": [{"role", "content"}...]} (or
// "prompt_token_ids") plus optional SamplingParams fields by their names.
// Output lines: index, text, token_ids, finish_reason, usage (and outputs when n > 1).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/commands.h"
#include "app/engine_flags.h"
#include "core/error.h"
#include "deepinfer/engine.h"

namespace deepinfer::app {
namespace {

using nlohmann::json;

// One JSONL line -> prompt + params. Throws Error naming the line and field.
void parse_line(const std::string& text, int line_no, const SamplingParams& defaults, Prompt& prompt,
                SamplingParams& p) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("line ", line_no, ": not JSON: ", e.what());
  }
  DI_CHECK(j.is_object(), "line ", line_no, ": expected a JSON object");
  p = defaults;
  for (auto& [key, v] : j.items()) {
    try {
      if (key == "prompt") prompt.text = v.get<std::string>();
      else if (key == "messages") {
        for (auto& m : v) prompt.messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
      } else if (key == "prompt_token_ids") prompt.token_ids = v.get<std::vector<int32_t>>();
      else if (key == "n") p.n = v.get<int>();
      else if (key == "temperature") p.temperature = v.get<float>();
      else if (key == "top_p") p.top_p = v.get<float>();
      else if (key == "top_k") p.top_k = v.get<int>();
      else if (key == "min_p") p.min_p = v.get<float>();
      else if (key == "repetition_penalty") p.repetition_penalty = v.get<float>();
      else if (key == "frequency_penalty") p.frequency_penalty = v.get<float>();
      else if (key == "presence_penalty") p.presence_penalty = v.get<float>();
      else if (key == "max_tokens") p.max_tokens = v.get<int>();
      else if (key == "min_tokens") p.min_tokens = v.get<int>();
      else if (key == "stop") p.stop = v.is_string() ? std::vector<std::string>{v.get<std::string>()} : v.get<std::vector<std::string>>();
      else if (key == "stop_token_ids") p.stop_token_ids = v.get<std::vector<int32_t>>();
      else if (key == "seed") p.seed = v.get<uint64_t>();
      else if (key == "seq_seed") p.seq_seed = v.get<uint64_t>();
      else if (key == "logprobs") p.logprobs = v.get<int>();
      else if (key == "ignore_eos") p.ignore_eos = v.get<bool>();
      else if (key == "skip_special_tokens") p.skip_special_tokens = v.get<bool>();
      else if (key == "include_stop_str_in_output") p.include_stop_str_in_output = v.get<bool>();
      else if (key == "regex") p.so_args = {"regex", v.get<std::string>()};
      else if (key == "json_schema") p.so_args = {"json_schema", v.is_string() ? v.get<std::string>() : v.dump()};
      else if (key == "ebnf") p.so_args = {"ebnf", v.get<std::string>()};
      else if (key == "json_object") { if (v.get<bool>()) p.so_args = {"json_object", ""}; }
      else fail("line ", line_no, ": unknown field '", key, "'");
    } catch (const json::exception& e) {
      fail("line ", line_no, ": field '", key, "': ", e.what());
    }
  }
  DI_CHECK(!prompt.text.empty() || !prompt.messages.empty() || !prompt.token_ids.empty(),
           "line ", line_no, ": needs a non-empty prompt, messages or prompt_token_ids");
}

json completion_json(const CompletionOutput& c) {
  json o = {{"index", c.index}, {"text", c.text}, {"token_ids", c.token_ids},
            {"finish_reason", to_string(c.finish_reason)}};
  if (!c.stop_reason.empty()) o["stop_reason"] = c.stop_reason;
  if (!c.logprobs.empty()) {
    json lp = json::array();
    for (auto& t : c.logprobs) {
      json top = json::array();
      for (auto& [id, l] : t.top) top.push_back({id, l});
      lp.push_back({{"token_id", t.token_id}, {"logprob", t.logprob}, {"top", top}});
    }
    o["logprobs"] = lp;
  }
  return o;
}

json output_json(size_t index, const RequestOutput& r) {
  if (!r.error.empty()) return {{"index", index}, {"error", r.error}, {"finish_reason", "error"}};
  json o = completion_json(r.outputs[0]);
  o["index"] = index;
  o["usage"] = {{"prompt_tokens", r.num_prompt_tokens}, {"completion_tokens", r.num_output_tokens},
                {"cached_tokens", r.num_cached_tokens}};
  o["time_to_first_token_s"] = r.time_to_first_token_s;
  o["decode_tokens_per_s"] = r.decode_tokens_per_s;
  if (r.spec.num_verify_steps > 0) o["spec_decode"] = spec_json(r.spec);
  if (r.outputs.size() > 1) {
    o["outputs"] = json::array();
    for (auto& c : r.outputs) o["outputs"].push_back(completion_json(c));
  }
  return o;
}

class ProgressBar {
 public:
  explicit ProgressBar(size_t total) : total_(total), start_(clock::now()) {}
  void update(size_t done, int64_t tokens, bool force = false) {
    double t = std::chrono::duration<double>(clock::now() - start_).count();
    if (!force && t - last_ < 0.25) return;
    last_ = t;
    double rate = t > 0 ? tokens / t : 0.0;
    double eta = done > 0 ? t * (total_ - done) / done : 0.0;
    int width = 30, filled = total_ ? static_cast<int>(width * done / total_) : width;
    std::fprintf(stderr, "\r[%s%s] %zu/%zu requests  %.1f tok/s  ETA %.0fs ", std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), done, total_, rate, eta);
    if (force) std::fprintf(stderr, "\n");
  }

 private:
  using clock = std::chrono::steady_clock;
  size_t total_;
  clock::time_point start_;
  double last_ = -1.0;
};

int run_batch(Engine& engine, const std::string& input, const std::string& output,
              const SamplingParams& defaults) {
  std::ifstream in(input);
  DI_CHECK(in.good(), "--input: cannot read ", input);
  std::vector<Prompt> prompts;
  std::vector<SamplingParams> params;
  std::vector<std::string> line_errors;  // per input request; empty if parsed
  std::string text;
  int line_no = 0;
  while (std::getline(in, text)) {
    ++line_no;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    Prompt prompt;
    SamplingParams p;
    try {
      parse_line(text, line_no, defaults, prompt, p);
      line_errors.emplace_back();
    } catch (const Error& e) {
      std::fprintf(stderr, "deepinfer generate: %s: %s\n", input.c_str(), e.what());
      line_errors.emplace_back(e.what());
    }
    prompts.push_back(std::move(prompt));
    params.push_back(p);
  }
  std::vector<Prompt> good_prompts;
  std::vector<SamplingParams> good_params;
  std::vector<size_t> good_index;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (!line_errors[i].empty()) continue;
    good_prompts.push_back(prompts[i]);
    good_params.push_back(params[i]);
    good_index.push_back(i);
  }
  ProgressBar bar(good_prompts.size());
  size_t done = 0;
  int64_t tokens = 0;
  auto results = good_prompts.empty() ? std::vector<RequestOutput>{}
                                      : engine.generate(good_prompts, good_params, [&](const RequestOutput& r) {
    for (auto& c : r.outputs) tokens += static_cast<int64_t>(c.delta_token_ids.size());
    if (r.finished) ++done;
    bar.update(done, tokens);
  });
  bar.update(done, tokens, true);
  std::ofstream out(output);
  DI_CHECK(out.good(), "--output: cannot write ", output);
  int num_errors = 0;
  size_t next_good = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    json o;
    if (!line_errors[i].empty()) {
      o = {{"index", i}, {"error", line_errors[i]}, {"finish_reason", "error"}};
      ++num_errors;
    } else {
      const RequestOutput& r = results[next_good++];
      o = output_json(i, r);
      if (!r.error.empty()) {
        std::fprintf(stderr, "deepinfer generate: request %zu: %s\n", i, r.error.c_str());
        ++num_errors;
      }
    }
    out << o.dump() << "\n";
  }
  std::fprintf(stderr, "%zu requests, %d failed; wrote %s\n", prompts.size(), num_errors, output.c_str());
  return num_errors == 0 ? 0 : 1;
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  CLI::App app{"Generate text from a prompt (streamed to stdout) or a JSONL batch", "generate"};
  EngineConfig config;
  ModelFlags model;
  add_engine_flags(app, config, model);
  SamplingFlags sampling;
  add_sampling_flags(app, sampling);
  std::string prompt_text, input, output;
  bool chat = false;
  app.add_option("--prompt", prompt_text, "prompt text (streamed mode)");
  app.add_flag("--chat", chat, "apply the model's chat template to --prompt as a user message");
  app.add_option("--input", input, "JSONL of requests (batch mode)");
  app.add_option("--output", output, "JSONL of results (batch mode)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const SamplingParams p = sampling.params();
  DI_CHECK(input.empty() != prompt_text.empty(), "give exactly one of --prompt or --input");
  DI_CHECK(input.empty() || !output.empty(), "--input needs --output");
  apply_model_flags(model, DEEPINFER_DEFAULT_MODEL_DIR, config);

  Engine engine(config);
  if (!input.empty()) return run_batch(engine, input, output, p);

  Prompt prompt = chat ? Prompt::from_messages({{"user", prompt_text}}) : Prompt::from_text(prompt_text);
  std::string id = engine.add_request(prompt, p);
  RequestOutput last;
  while (engine.has_unfinished()) {
    for (auto& r : engine.step()) {
      std::fwrite(r.outputs[0].delta_text.data(), 1, r.outputs[0].delta_text.size(), stdout);
      std::fflush(stdout);
      if (r.finished) last = r;
    }
  }
  std::printf("\n");
  std::fprintf(stderr, "[%d prompt + %d generated tokens, finish %s, TTFT %.3fs, %.1f tok/s]\n",
               last.num_prompt_tokens, last.num_output_tokens, to_string(last.outputs[0].finish_reason),
               last.time_to_first_token_s, last.decode_tokens_per_s);
  if (!last.error.empty()) {  // e.g. NaN logits: the request ended with an error
    std::fprintf(stderr, "deepinfer generate: %s\n", last.error.c_str());
    return 1;
  }
  return 0;
}

}  // namespace deepinfer::app
