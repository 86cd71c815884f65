// deepinfer generate: one prompt streamed to stdout, or a JSONL batch.
//   deepinfer generate [--model DIR] --prompt TEXT [--chat] [--max-tokens N ...]
//   deepinfer generate [--model DIR] --input prompts.jsonl --output out.jsonl [--resume]
// Input lines: {"prompt": "..."} or {"messages": [{"role", "content"}...]} (or
// "prompt_token_ids") plus optional SamplingParams fields by their names (app/request_line.h).
// Output lines (app/batch.h): index, text, token_ids, finish_reason, usage (and outputs when
// n > 1), appended in completion order as each request finishes.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <string>

#include "app/batch.h"
#include "app/cli.h"
#include "app/commands.h"
#include "app/engine_flags.h"
#include "core/error.h"
#include "deepinfer/engine.h"

namespace deepinfer::app {
namespace {

}  // namespace

int cmd_generate(int argc, char** argv) {
  CLI::App app{"Generate text from a prompt (streamed to stdout) or a JSONL batch", "generate"};
  show_defaults(app);
  EngineConfig config;
  ModelFlags model;
  add_engine_flags(app, config, model);
  SamplingFlags sampling;
  add_sampling_flags(app, sampling);
  std::string prompt_text, input, output, generation_config = "auto";
  bool chat = false, resume = false;
  auto* prompt_opt = app.add_option("--prompt", prompt_text, "prompt text (streamed mode)");
  auto* chat_opt = app.add_flag("--chat", chat, "apply the model's chat template to --prompt as a user message");
  using SP = SamplingParams;
  auto* input_opt = app.add_option(
      "--input", input,
      detail::concat("JSONL of requests (batch mode); the sampling flags are every line's defaults, a line's "
                     "fields override them. Bounds per line: n <= ", SP::kMaxN, ", max_tokens <= ", SP::kMaxTokens,
                     ", logprobs <= ", SP::kMaxLogprobs, ", top_k <= ", SP::kMaxTopK, ", stop <= ", SP::kMaxStops,
                     " strings of <= ", SP::kMaxStopBytes, " bytes, stop_token_ids <= ", SP::kMaxStopTokenIds, ", ",
                     kMaxRequestLineBytes >> 20, " MiB per line, JSON depth <= ", kMaxRequestJsonDepth));
  auto* output_opt = app.add_option(
      "--output", output,
      "JSONL of results (batch mode), one line per request appended as it finishes (completion order; "
      "\"index\" is the request's 0-based number in --input)");
  auto* resume_opt = app.add_flag(
      "--resume", resume, "batch: keep --output's results and run only the requests whose index is not in it");
  app.add_option("--generation-config", generation_config,
                 "sampling defaults: auto (the model's generation_config.json: temperature, top_p, top_k, "
                 "min_p, repetition_penalty, max_new_tokens, where no flag is given), none, or a directory");
  prompt_opt->excludes(input_opt);
  chat_opt->excludes(input_opt)->needs(prompt_opt);
  input_opt->needs(output_opt);
  output_opt->needs(input_opt);
  resume_opt->needs(input_opt);
  if (auto code = parse_flags(app, argc, argv)) return *code;
  DI_USAGE_CHECK(!input.empty() || !prompt_text.empty(), "give --prompt TEXT or --input FILE --output FILE");
  apply_model_flags(model, DEEPINFER_DEFAULT_MODEL_DIR, config);
  SamplingParams p = sampling.params();
  const std::string applied = apply_generation_config(
      generation_config, config.model_dir, [&app](const char* flag) { return app.count(flag) > 0; }, p);
  if (!applied.empty())
    std::fprintf(stderr, "deepinfer generate: defaults from %s (flags override; --generation-config none: off)\n",
                 applied.c_str());

  if (process_rank() != 0) {  // several processes: rank 0 reads, schedules and writes
    Engine engine(config);
    engine.follow();
    return kExitOk;
  }
  if (!input.empty()) {
    // Input read and output opened before the model loads: bad paths fail at once.
    BatchJob job({input, output, resume}, p);
    Engine engine(config);
    // First SIGINT/SIGTERM: finish the current step, keep every result, exit 128 + signal.
    const int code = job.run_until_signalled(engine);
    return code;
  }

  Engine engine(config);
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
  if (!last.error.empty()) {
    std::fprintf(stderr, "deepinfer generate: error: %s\n", last.error.c_str());
    return kExitError;
  }
  return kExitOk;
}

}  // namespace deepinfer::app
