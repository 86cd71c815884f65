// deepinfer bench: prefill and decode throughput through the engine, one JSONL
// record per measurement with the raw quantities (PERFORMANCE.md's method):
// warm-up run, then the median of --repeats timed runs.
//   deepinfer bench --config CFG --random-weights --backend cuda --prefill 512,4096
//       --batch 1,8,32,64 --prompt-len 512 --gen-len 128 --dtype bf16 --output out.jsonl
//       --roofline-gbps 4160 --peak-tflops 777
// prefill: one request of N prompt tokens, 1 generated; time to its first token.
// decode:  B requests of prompt-len tokens, gen-len generated each (EOS ignored);
//          the timed part starts once every request has its first token.
// Counted per step by the project's one count (app/bench_counts.h, bench/NOTES.md): weight
// bytes read, KV bytes, FLOPs.
// sweep (--sweep, or --prefill-batch / --contexts lists): Pareto records as DeepInfer
//          publishes them: prefill B requests of N tokens at once (non-cached input tokens/s
//          against time per prefill) and decode over batch sizes at each context (output
//          tokens/s against tokens/s per request); every record names its curve ("curve":
//          one per prefill length / decode context) and the fields a plot must not mix
//          (bench/plot_pareto.py checks them).
// throughput (--throughput RxPxG, e.g. 1000x512x128): R requests of P random
//          prompt tokens, G generated each (EOS ignored), all given to the engine
//          at once (continuous batching under the real scheduler); one record with
//          output and total tokens/s over the wall time and the raw quantities.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "app/cli.h"
#include "app/commands.h"
#include "app/batch.h"
#include "app/bench_counts.h"
#include "app/engine_flags.h"
#include "core/error.h"
#include "deepinfer/engine.h"
#include "model/config.h"

namespace deepinfer::app {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct ThroughputSpec {
  int num_requests = 0;
  int prompt_len = 0;
  int gen_len = 0;
};

// "1000x512x128" -> {1000, 512, 128}; every part >= 1.
ThroughputSpec parse_throughput(const std::string& text) {
  ThroughputSpec t;
  char tail = 0;
  const int n = std::sscanf(text.c_str(), "%dx%dx%d%c", &t.num_requests, &t.prompt_len, &t.gen_len, &tail);
  DI_USAGE_CHECK(n == 3 && t.num_requests >= 1 && t.prompt_len >= 1 && t.gen_len >= 1,
           "--throughput: expected REQUESTSxPROMPT_LENxGEN_LEN with each >= 1 (e.g. 1000x512x128), got '",
           text, "'");
  return t;
}

// Offline throughput: every request queued at once, the engine's own batching
// decides the steps. Returns the record (the caller adds the common fields).
// EPLB's statistics flush held for a timed window (several processes; released at its end, where
// a flush that fell due runs, outside the window).
class EplbHold {
 public:
  EplbHold(Engine& engine, bool on) : engine_(engine), on_(on && engine.world_size() > 1) {
    if (on_) engine_.hold_expert_replacement(true);
  }
  ~EplbHold() {
    if (!on_) return;
    try {
      engine_.hold_expert_replacement(false);
    } catch (const std::exception&) {
      // The run failed and its communicator with it; the error already propagates.
    }
  }
  EplbHold(const EplbHold&) = delete;
  EplbHold& operator=(const EplbHold&) = delete;

 private:
  Engine& engine_;
  bool on_;
};

json run_throughput(Engine& engine, const ThroughputSpec& t, const SamplingParams& sampling, int warmup,
                    const std::function<Prompt(int)>& random_prompt) {
  SamplingParams p = sampling;
  p.max_tokens = t.gen_len;
  p.ignore_eos = true;
  // Warm-up: a few short requests so first-step allocations are not timed.
  for (int run = 0; run < warmup; ++run) {
    SamplingParams w = p;
    w.max_tokens = std::min(t.gen_len, 2);
    std::vector<Prompt> few;
    for (int i = 0; i < std::min(t.num_requests, 8); ++i) few.push_back(random_prompt(t.prompt_len));
    engine.generate(few, {w});
  }
  std::vector<Prompt> prompts;
  prompts.reserve(static_cast<size_t>(t.num_requests));
  for (int i = 0; i < t.num_requests; ++i) prompts.push_back(random_prompt(t.prompt_len));
  const EngineStats before = engine.stats();
  std::vector<RequestOutput> out;
  double elapsed_s = 0;
  {
    EplbHold hold(engine, true);
    const auto t0 = Clock::now();
    out = engine.generate(prompts, {p});
    elapsed_s = seconds_since(t0);
  }
  const EngineStats& after = engine.stats();
  int64_t prompt_tokens = 0, output_tokens = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    DI_CHECK(out[i].error.empty(), "throughput request ", i, ": ", out[i].error);
    prompt_tokens += out[i].num_prompt_tokens;
    output_tokens += out[i].num_output_tokens;
  }
  return {{"kind", "throughput"},
          {"requests", t.num_requests},
          {"prompt_len", t.prompt_len},
          {"gen_len", t.gen_len},
          {"temperature", p.temperature},
          {"prompt_tokens", prompt_tokens},
          {"output_tokens", output_tokens},
          {"elapsed_s", elapsed_s},
          {"output_tokens_per_s", output_tokens / elapsed_s},
          {"total_tokens_per_s", (prompt_tokens + output_tokens) / elapsed_s},
          {"requests_per_s", t.num_requests / elapsed_s},
          {"steps", after.num_steps - before.num_steps},
          // The same counters as the server's deepinfer:engine_* metrics (bench/serve_load.py compares them).
          {"prefill_steps", after.num_prefill_steps - before.num_prefill_steps},
          {"mean_batch", after.num_steps > before.num_steps
                             ? static_cast<double>(after.num_step_seqs - before.num_step_seqs) /
                                   static_cast<double>(after.num_steps - before.num_steps)
                             : 0.0},
          {"prompt_tokens_computed", after.num_prompt_tokens_computed - before.num_prompt_tokens_computed},
          {"preemptions", after.num_preemptions - before.num_preemptions},
          {"kv_blocks", after.num_kv_blocks},
          {"kv_block_size", after.kv_block_size}};
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  CLI::App app{"Benchmark prefill and decode throughput; one JSONL record per run", "bench"};
  show_defaults(app);
  EngineConfig config;
  ModelFlags model;
  add_engine_flags(app, config, model);
  // Throughput requests sample with these (greedy unless --temperature is given);
  // --throughput sets max_tokens and ignore_eos itself.
  SamplingFlags sampling;
  sampling.p.temperature = 0.0f;
  add_sampling_flags(app, sampling);
  std::vector<int> prefill_lens, batches, prefill_batches, contexts;
  int prompt_len = 512, gen_len = 128, repeats = 3, warmup = 1;
  uint64_t seed = 0;
  bool sweep = false;
  std::string output, throughput, prompt_file, tag;
  double roofline_gbps = 0, peak_tflops = 0, peer_tokens_per_s = 0;
  app.add_option("--prefill", prefill_lens, "prefill lengths at batch 1 (comma list)")->delimiter(',');
  app.add_option("--batch", batches, "decode batch sizes (comma list)")->delimiter(',');
  app.add_option("--prefill-batch", prefill_batches,
                 "prefill: requests prefilled at once, each of every --prefill length (comma list; default 1)")
      ->delimiter(',');
  app.add_option("--contexts", contexts, "decode: prompt lengths to decode after (comma list; default --prompt-len)")
      ->delimiter(',');
  app.add_flag("--sweep", sweep,
               "Pareto sweep: lists not given default to --prefill 512,4096 --prefill-batch 1,2,4,8 "
               "--batch 1,2,4,8,16,32,64,128,256 --contexts 512,4096");
  app.add_option("--tag", tag, "prefix of every record's curve name (e.g. a build or kernel variant)");
  app.add_option("--prompt-len", prompt_len, "decode: prompt tokens per sequence");
  app.add_option("--gen-len", gen_len, "decode: generated tokens per sequence");
  app.add_option("--repeats", repeats, "timed runs per measurement (median reported)");
  app.add_option("--warmup", warmup, "untimed runs first");
  app.add_option("--prompt-seed", seed, "seed of the random prompts");
  app.add_option("--output", output, "append records to this file (default stdout)");
  app.add_option("--prompt-file", prompt_file,
                 "decode: text prompts, one JSON object {\"prompt\": ...} per line, given to the batch in turn "
                 "(instead of --prompt-len random tokens: drafts need real text to be accepted)");
  app.add_option("--roofline-gbps", roofline_gbps, "memory bandwidth for the roofline ratio (GB/s)");
  app.add_option("--peak-tflops", peak_tflops, "compute peak for the roofline ratio (TFLOP/s)");
  app.add_option("--throughput", throughput,
                 "offline throughput: REQUESTSxPROMPT_LENxGEN_LEN random-token requests at once (e.g. 1000x512x128)");
  app.add_option("--peer-tokens-per-s", peer_tokens_per_s,
                 "throughput: a peer's output tokens/s (e.g. llama.cpp's batched figure) for the ratio");
  if (auto code = parse_flags(app, argc, argv)) return *code;
  if (sweep) {
    if (prefill_lens.empty()) prefill_lens = {512, 4096};
    if (prefill_batches.empty()) prefill_batches = {1, 2, 4, 8};
    if (batches.empty()) batches = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    if (contexts.empty()) contexts = {512, 4096};
  }
  if (prefill_batches.empty()) prefill_batches = {1};
  if (contexts.empty()) contexts = {prompt_len};
  DI_USAGE_CHECK(!prefill_lens.empty() || !batches.empty() || !throughput.empty(),
                 "give --prefill, --batch, --sweep and/or --throughput");
  DI_USAGE_CHECK(gen_len >= 2 && prompt_len >= 1 && repeats >= 1 && warmup >= 0,
                 "--gen-len >= 2, --prompt-len >= 1, --repeats >= 1, --warmup >= 0");
  constexpr int kMaxBenchBatch = 1 << 16, kMaxBenchLen = 1 << 24;
  for (int b : batches)
    DI_USAGE_CHECK(b >= 1 && b <= kMaxBenchBatch, "--batch: each size must be in [1, ", kMaxBenchBatch, "], got ", b);
  for (int n : prefill_lens)
    DI_USAGE_CHECK(n >= 1 && n <= kMaxBenchLen, "--prefill: each length must be in [1, ", kMaxBenchLen, "], got ", n);
  for (int b : prefill_batches)
    DI_USAGE_CHECK(b >= 1 && b <= kMaxBenchBatch, "--prefill-batch: each size must be in [1, ", kMaxBenchBatch,
                   "], got ", b);
  for (int c : contexts)
    DI_USAGE_CHECK(c >= 1 && c <= kMaxBenchLen, "--contexts: each length must be in [1, ", kMaxBenchLen, "], got ", c);
  DI_USAGE_CHECK(prompt_len <= kMaxBenchLen && gen_len <= kMaxBenchLen, "--prompt-len and --gen-len: at most ",
                 kMaxBenchLen);
  apply_model_flags(model, DEEPINFER_DEFAULT_MODEL_DIR, config);
  const std::string config_file =
      !config.random_weights_config.empty() ? config.random_weights_config : config.model_dir;
  const ModelConfig mc = load_model_config(config_file);

  const ThroughputSpec tp = throughput.empty() ? ThroughputSpec{} : parse_throughput(throughput);
  const int max_batch = batches.empty() ? 1 : *std::max_element(batches.begin(), batches.end());
  const int max_prefill = prefill_lens.empty() ? 1 : *std::max_element(prefill_lens.begin(), prefill_lens.end());
  const int max_prefill_batch = *std::max_element(prefill_batches.begin(), prefill_batches.end());
  const int max_context = *std::max_element(contexts.begin(), contexts.end());
  config.max_num_seqs = std::max({config.max_num_seqs, max_batch, prefill_lens.empty() ? 1 : max_prefill_batch});
  config.max_num_batched_tokens = std::max(config.max_num_batched_tokens, max_prefill);
  config.max_model_len =
      std::max({config.max_model_len, max_prefill + 1, max_context + gen_len, tp.prompt_len + tp.gen_len});
  config.enable_prefix_caching = false;  // every run computes its prompt
  // Throughput sizes the KV cache as serving does (free device memory, or
  // --num-kv-blocks / --kv-cache-bytes); the other modes need only their batch.
  // Blocks are per sequence: a batch of B needs B * ceil((prompt + gen) / block) of them (sizing
  // by total tokens left some requests waiting for others to finish at gen 32: the decode
  // timing then covered only the tail of the run).
  if (config.num_kv_blocks == 0 && throughput.empty()) {
    auto blocks = [&](int64_t tokens) { return (tokens + config.kv_block_size - 1) / config.kv_block_size; };
    const int64_t needed =
        std::max<int64_t>(int64_t{max_batch} * blocks(max_context + gen_len),
                          int64_t{prefill_lens.empty() ? 1 : max_prefill_batch} * blocks(max_prefill + 1));
    DI_USAGE_CHECK(needed < std::numeric_limits<int>::max(), "--batch ", max_batch, " x (largest context + --gen-len) ",
                   max_context + gen_len, " needs ", needed, " KV blocks, more than an int holds");
    config.num_kv_blocks = static_cast<int>(needed) + 1;
  }
  const auto t_load = Clock::now();
  if (process_rank() != 0) {  // several processes: rank 0 runs and reports the benchmark
    Engine follower(config);
    follower.follow();
    return kExitOk;
  }
  Engine engine(config);
  const double load_s = seconds_since(t_load);
  const double bytes_per_param = config.random_weights_config.empty() ? (mc.quantization.is_fp8() ? 1.0 : 2.0)
                                 : (config.random_weights_dtype == "fp8" ? 1.0 : 2.0);
  const double kv_value_bytes = config.backend == "cpu" ? 4.0 : 2.0;
  constexpr double kTableBytes = 2.0;  // embed_tokens and lm_head stay bf16 (FP8 checkpoints too)

  std::mt19937_64 rng(seed);
  auto random_prompt = [&](int len) {
    std::vector<int32_t> ids(len);
    for (auto& t : ids) t = 2 + static_cast<int32_t>(rng() % static_cast<uint64_t>(engine.vocab_size() - 2));
    return Prompt::from_tokens(std::move(ids));
  };
  std::vector<Prompt> text_prompts;
  if (!prompt_file.empty()) {
    std::ifstream in(prompt_file);
    DI_CHECK(in.good(), "--prompt-file: cannot read ", prompt_file);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.empty()) continue;
      json j = json::parse(line, nullptr, false);
      DI_CHECK(!j.is_discarded() && j.is_object() && j.contains("prompt") && j["prompt"].is_string() &&
                   !j["prompt"].get<std::string>().empty(),
               "--prompt-file ", prompt_file, " line ", n, ": expected {\"prompt\": \"non-empty text\"}");
      text_prompts.push_back(Prompt::from_text(j["prompt"].get<std::string>()));
    }
    DI_CHECK(!text_prompts.empty(), "--prompt-file ", prompt_file, ": no prompts");
  }
  std::ofstream file;
  if (!output.empty()) {
    file.open(output, std::ios::app);
    DI_CHECK(file.good(), "--output: cannot write ", output);
  }
  auto write = [&](json rec) {
    rec["engine"] = "deepinfer";
    rec["backend"] = config.backend;
    rec["model"] = config_file;
    rec["dtype"] = config.random_weights_config.empty() ? "checkpoint" : config.random_weights_dtype;
    rec["random_weights"] = !config.random_weights_config.empty();
    rec["batch_invariant"] = config.batch_invariant;
    rec["max_num_seqs"] = config.max_num_seqs;
    rec["max_num_batched_tokens"] = config.max_num_batched_tokens;
    rec["load_s"] = load_s;
    rec["num_speculative_tokens"] = engine.stats().num_speculative_tokens;
    rec["speculator"] = config.speculator;
    rec["spec_varlen"] = engine.stats().spec_varlen;
    if (!engine.stats().spec_step_times.empty()) rec["spec_step_times"] = spec_step_times_json(engine.stats().spec_step_times);
    // The layout a plot must not mix; several processes run eagerly, one step at a time.
    const bool several = engine.world_size() > 1;
    rec["parallel"] = several ? "tp" + std::to_string(config.tp) + "-ep" + std::to_string(config.ep) + "-dp" +
                                    std::to_string(config.dp) + "-" + std::to_string(engine.world_size()) + "proc"
                              : "single-device";
    rec["enforce_eager"] = config.enforce_eager || several;
    rec["graph_steps_total"] = engine.stats().num_graph_steps;  // since the engine started
    rec["async_scheduling"] = config.async_scheduling && !several;
    rec["spec_steps_ahead_total"] = engine.stats().num_spec_steps_ahead;  // verify steps issued with drafts in flight
    rec["mtp_graph_runs_total"] = engine.stats().num_mtp_graph_runs;
    // EPLB re-placements since the engine started; they run between timed windows (EplbHold:
    // one that fell due inside a window runs at its end), never inside one.
    if (several) rec["eplb_replacements_total"] = engine.stats().num_eplb_replacements;
    const std::string line = rec.dump();
    if (file.is_open()) file << line << "\n" << std::flush;
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  auto emit = [&](json rec, const StepCounts& per_step, double steps, double tokens, double elapsed) {
    rec["repeats"] = repeats;
    rec["steps"] = steps;
    rec["tokens"] = tokens;
    rec["elapsed_s"] = elapsed;
    rec["tokens_per_s"] = tokens / elapsed;
    if (!per_step.modeled) {  // no count for this architecture yet: no roofline rather than a wrong one
      rec["counts_modeled"] = false;
      write(std::move(rec));
      return;
    }
    rec["weight_bytes_per_step"] = per_step.weight_bytes;
    rec["kv_bytes_per_step"] = per_step.kv_bytes;
    rec["bytes_counted"] = (per_step.weight_bytes + per_step.kv_bytes) * steps;
    rec["flops_counted"] = per_step.flops * steps;
    if (roofline_gbps > 0 || peak_tflops > 0) {
      const double t_mem = roofline_gbps > 0 ? (per_step.weight_bytes + per_step.kv_bytes) / (roofline_gbps * 1e9) : 0;
      const double t_flop = peak_tflops > 0 ? per_step.flops / (peak_tflops * 1e12) : 0;
      const double floor_s = std::max(t_mem, t_flop) * steps;
      rec["roofline_gbps"] = roofline_gbps;
      rec["peak_tflops"] = peak_tflops;
      rec["floor_s"] = floor_s;
      rec["roofline_tokens_per_s"] = tokens / floor_s;
      rec["fraction_of_roofline"] = floor_s / elapsed;
    }
    write(std::move(rec));
  };

  for (int n : prefill_lens) {
    for (int pb : prefill_batches) {
      SamplingParams p;
      p.temperature = 0;
      p.max_tokens = 1;
      p.ignore_eos = true;
      std::vector<double> times;
      for (int run = 0; run < warmup + repeats; ++run) {
        std::vector<Prompt> prompts;
        for (int i = 0; i < pb; ++i) prompts.push_back(random_prompt(n));
        EplbHold hold(engine, run >= warmup);
        const auto t0 = Clock::now();
        auto out = engine.generate(prompts, {p});
        const double dt = seconds_since(t0);
        for (const RequestOutput& o : out) DI_CHECK(o.error.empty(), "prefill ", n, ": ", o.error);
        if (run >= warmup) times.push_back(dt);
      }
      const double t = median(times);
      json rec = {{"kind", "prefill"}, {"batch", pb}, {"prompt_len", n}, {"context", n}, {"runs_s", times},
                  {"curve", tag + "prefill len=" + std::to_string(n)},
                  // Pareto axes: every prompt token is computed (prefix caching is off here).
                  {"time_per_prefill_s", t}, {"input_tokens_per_s", static_cast<double>(pb) * n / t}};
      // Prefill runs as ceil(pb * n / max_num_batched_tokens) steps; counted as one pass over pb * n tokens.
      emit(rec,
           count_step(mc, StepKind::Prefill, bytes_per_param, kTableBytes, pb, n, pb, (n + 1) / 2.0, kv_value_bytes),
           1, static_cast<double>(pb) * n, t);
    }
  }

  for (int ctx : contexts) {
    for (int b : batches) {
      // Greedy unless sampling flags are given (--temperature 0.8 --top-p 0.95 ...).
      SamplingParams p = sampling.params();
      p.max_tokens = gen_len;
      p.ignore_eos = true;
      // The timed part starts when every request has its first token; it counts the tokens and
      // steps made after that point (with chunked prefill, requests admitted first decode while
      // later prompts are still in prefill: those tokens are not in the timed part).
      std::vector<double> times, prefill_times, timed_tokens, timed_steps, timed_comm_s, timed_comm_bytes;
      SpecDecodeStats spec_timed;  // drafts verified in the timed parts (all runs)
      int64_t undrafted_timed = 0;  // steps after which drafting was skipped (spec_varlen), all runs
      for (int run = 0; run < warmup + repeats; ++run) {
        EplbHold hold(engine, run >= warmup);
        const auto t0 = Clock::now();
        for (int i = 0; i < b; ++i)
          engine.add_request(text_prompts.empty() ? random_prompt(ctx)
                                                  : text_prompts[static_cast<size_t>(i) % text_prompts.size()],
                             p);
        int have_first = 0;
        Clock::time_point t_decode = Clock::now();
        EngineStats at_decode = engine.stats();
        bool decoding = false;
        while (engine.has_unfinished()) {
          for (auto& r : engine.step())
            if (r.num_output_tokens == 1 || (r.finished && r.num_output_tokens <= 1)) ++have_first;
          if (!decoding && have_first >= b) {
            decoding = true;
            t_decode = Clock::now();
            at_decode = engine.stats();
            if (run >= warmup) prefill_times.push_back(std::chrono::duration<double>(t_decode - t0).count());
          }
        }
        if (run >= warmup) {
          times.push_back(seconds_since(t_decode));
          const EngineStats& end = engine.stats();
          timed_tokens.push_back(static_cast<double>(end.num_generated_tokens - at_decode.num_generated_tokens));
          timed_steps.push_back(static_cast<double>(end.num_steps - at_decode.num_steps));
          timed_comm_s.push_back(end.ep_comm_s - at_decode.ep_comm_s);
          timed_comm_bytes.push_back(static_cast<double>(end.ep_comm_bytes - at_decode.ep_comm_bytes));
          SpecDecodeStats d = end.spec;  // end - at_decode
          d.num_verify_steps -= at_decode.spec.num_verify_steps;
          d.num_draft_tokens -= at_decode.spec.num_draft_tokens;
          d.num_accepted_tokens -= at_decode.spec.num_accepted_tokens;
          d.num_emitted_tokens -= at_decode.spec.num_emitted_tokens;
          for (size_t j = 0; j < at_decode.spec.drafts_per_position.size(); ++j) {
            d.drafts_per_position[j] -= at_decode.spec.drafts_per_position[j];
            d.accepted_per_position[j] -= at_decode.spec.accepted_per_position[j];
          }
          spec_timed.add(d);
          undrafted_timed += end.num_steps_without_drafts - at_decode.num_steps_without_drafts;
        }
      }
      // Every run makes the same tokens in the same steps (same scheduler, same lengths).
      const double steps = median(timed_steps), tokens = median(timed_tokens);
      json rec = {{"kind", "decode"}, {"batch", b}, {"prompt_len", ctx}, {"gen_len", gen_len},
                  {"context", ctx + gen_len / 2.0}, {"runs_s", times},
                  {"prefill_elapsed_s", median(prefill_times)}, {"timed_tokens_per_run", timed_tokens},
                  {"temperature", p.temperature},
                  {"top_p", p.top_p}, {"top_k", p.top_k}, {"device_sampling", config.device_sampling},
                  {"prompt_file", prompt_file}, {"spec_decode", spec_json(spec_timed)},
                  {"steps_without_drafts", static_cast<double>(undrafted_timed) / std::max(repeats, 1)},
                  {"curve", tag + "decode ctx=" + std::to_string(ctx)},
                  // Pareto axes: output tokens/s of the batch against tokens/s seen by one request.
                  {"per_user_tokens_per_s", tokens / b / median(times)}};
      // DEEPINFER_EP_COMM_TIMING: rank 0's time and bytes in the expert dispatch's collectives
      // per decode step (against NCCL's bandwidth: bench/cuda/nccl_bw.py).
      if (steps > 0 && median(timed_comm_s) > 0) {
        rec["ep_comm_s_per_step"] = median(timed_comm_s) / steps;
        rec["ep_comm_bytes_per_step"] = median(timed_comm_bytes) / steps;
      }
      // "tokens" are emitted tokens only (accepted drafts + the target's own), never drafts.
      emit(rec, count_step(mc, StepKind::Decode, bytes_per_param, kTableBytes, b, 1, b, ctx + gen_len / 2.0,
                           kv_value_bytes),
           steps, tokens, median(times));
    }
  }
  if (!throughput.empty()) {
    json rec = run_throughput(engine, tp, sampling.params(), warmup, random_prompt);
    const double out_tps = rec["output_tokens_per_s"].get<double>();
    if (peer_tokens_per_s > 0) {
      rec["peer_output_tokens_per_s"] = peer_tokens_per_s;
      rec["output_ratio_to_peer"] = out_tps / peer_tokens_per_s;
    }
    std::fprintf(stderr, "throughput %s: %.0f output tok/s, %.0f total tok/s in %.2f s (%lld steps, %lld preemptions, %d KV blocks)",
                 throughput.c_str(), out_tps, rec["total_tokens_per_s"].get<double>(),
                 rec["elapsed_s"].get<double>(), static_cast<long long>(rec["steps"].get<int64_t>()),
                 static_cast<long long>(rec["preemptions"].get<int64_t>()), rec["kv_blocks"].get<int>());
    if (peer_tokens_per_s > 0) std::fprintf(stderr, "; %.2fx the peer's %.0f output tok/s", out_tps / peer_tokens_per_s, peer_tokens_per_s);
    std::fprintf(stderr, "\n");
    write(std::move(rec));
  }
  return 0;
}

}  // namespace deepinfer::app
