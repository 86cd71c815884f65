// The one place for flags shared by `deepinfer generate` and `deepinfer bench`:
// engine and model flags (add_engine_flags, apply_model_flags) and sampling
// flags (add_sampling_flags, SamplingFlags::params).
#pragma once
#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "app/commands.h"
#include "app/request_line.h"
#include "core/error.h"
#include "deepinfer/engine.h"

namespace deepinfer::app {

struct ModelFlags {
  std::string model_dir;
  std::string config_path;  // with --random-weights
  bool random_weights = false;
};

inline void add_engine_flags(CLI::App& app, EngineConfig& c, ModelFlags& m) {
  app.add_option("--model", m.model_dir, "checkpoint directory (config.json, safetensors, tokenizer.json)");
  app.add_option("--config", m.config_path, "config.json for --random-weights");
  app.add_flag("--random-weights", m.random_weights, "random weights from --config (or --model's config)");
  app.add_option("--weights-seed", c.random_weights_seed, "seed of the random weights");
  app.add_option("--dtype", c.random_weights_dtype, "random weight dtype: bf16 | fp8")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  app.add_option("--tokenizer", c.tokenizer_dir, "tokenizer directory (default: --model)");
  app.add_flag("--skip-weight-check", c.skip_weight_check,
               "do not scan the checkpoint for NaN/Inf weights at load (trusted checkpoints)");
  app.add_option("--backend", c.backend, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--threads", c.num_threads, "CPU threads (0 = all cores)")->check(CLI::NonNegativeNumber);
  app.add_flag("--batch-invariant", c.batch_invariant, "batch-invariant kernels (DEEPINFER_BATCH_INVARIANT=1)");
  app.add_option("--max-num-seqs", c.max_num_seqs, "sequences per step")->check(CLI::PositiveNumber);
  app.add_option("--max-num-batched-tokens", c.max_num_batched_tokens, "tokens per step")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-model-len", c.max_model_len,
                 "context length (0 = the model's max_position_embeddings; above it is refused)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--kv-block-size", c.kv_block_size, "tokens per KV block")->check(CLI::PositiveNumber);
  app.add_option("--num-kv-blocks", c.num_kv_blocks,
                 "KV blocks (0 = from --kv-cache-bytes, else device memory, else 4 GiB)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--kv-cache-bytes", c.kv_cache_num_bytes,
                 "KV cache bytes (0 = --gpu-memory-utilization on CUDA, 4 GiB on CPU)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--gpu-memory-utilization", c.gpu_memory_utilization,
                 "fraction of device memory for weights, buffers and KV cache (the rest of it is KV)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("!--no-prefix-caching", c.enable_prefix_caching, "disable prefix reuse");
  app.add_flag("--enforce-eager", c.enforce_eager, "no CUDA graphs for decode steps");
  // Several processes (mpirun -np N deepinfer ..., or torchrun's RANK/WORLD_SIZE variables).
  app.add_option("--tp", c.tp, "tensor parallel ranks: attention heads and dense MLPs split over them "
                 "(= the number of processes, or / --dp)")->check(CLI::PositiveNumber);
  app.add_option("--ep", c.ep, "expert parallel ranks: routed experts split over them (= the number of "
                 "processes; 1: every expert's intermediate split under --tp)")->check(CLI::PositiveNumber);
  app.add_option("--dp", c.dp, "attention data parallel groups (--dp x --tp = the number of processes): each "
                 "its own sequences and KV, heads split over its --tp ranks, the MoE over every group's rows")
      ->check(CLI::PositiveNumber);
  app.add_flag("!--host-sampling", c.device_sampling,
               "sample every non-greedy row on the host (default: on the device when the row allows)");
  app.add_flag("!--no-async-scheduling", c.async_scheduling,
               "one step at a time (no preparing step N+1 while step N runs)");
  app.add_option("--num-speculative-tokens", c.num_speculative_tokens,
                 "draft tokens per step, verified exactly (0 = off; default DEEPINFER_USE_NEXTN_DECODE, else 3 "
                 "with --spec-varlen 1 when the checkpoint has an MTP layer, else 0)")
      ->check(CLI::Range(0, 16));
  app.add_option("--speculator", c.speculator, "draft source: mtp (the checkpoint's MTP layer) | ngram (prompt lookup)")
      ->check(CLI::IsMember({"mtp", "ngram"}));
  app.add_option("--spec-varlen", c.spec_varlen,
                 "verify length per request scheduled from the step times measured at start-up (DSpark): "
                 "1 with confidences from the request's recent acceptance by draft position, 2 from each "
                 "draft's softmax probability (its logits come to the host); 0: all drafts "
                 "(default DEEPINFER_ENABLE_MTP_VARLEN, else 1 for the default k and 0 for a k given)")
      ->check(CLI::Range(0, 2));
}

// Resolves --model / --random-weights / --config into the EngineConfig.
inline void apply_model_flags(const ModelFlags& m, const std::string& default_dir, EngineConfig& c) {
  c.model_dir = m.model_dir.empty() && m.config_path.empty() ? default_dir : m.model_dir;
  if (m.random_weights || !m.config_path.empty()) {
    c.random_weights_config = !m.config_path.empty() ? m.config_path : c.model_dir + "/config.json";
  }
}

inline std::string read_text_file(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  DI_CHECK(in.good(), flag, ": cannot read ", path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// vLLM's --generation-config: "auto" reads the model's generation_config.json (when there is
// one), a directory reads that directory's; its sampling fields (temperature, top_p, top_k,
// min_p, repetition_penalty, max_new_tokens as max_tokens) go into `p` wherever `given(flag)` is
// false for the field's flag (--temperature ...). "none": the built-in defaults. Returns
// "FILE: field=value, ..." for what it set ("" when nothing).
inline std::string apply_generation_config(const std::string& mode, const std::string& model_dir,
                                           const std::function<bool(const char*)>& given, SamplingParams& p) {
  if (mode == "none") return "";
  const bool automatic = mode == "auto";
  const std::filesystem::path file = std::filesystem::path(automatic ? model_dir : mode) / "generation_config.json";
  if (automatic && (model_dir.empty() || !std::filesystem::exists(file))) return "";
  DI_USAGE_CHECK(std::filesystem::exists(file), "--generation-config: no generation_config.json in ", mode,
                 " (expected auto, none or a directory)");
  const GenerationDefaults g = parse_generation_config(read_text_file(file.string(), "--generation-config"),
                                                       file.string());
  std::string applied;
  auto use = [&](const char* flag, const char* name, const auto& value, auto& field) {
    if (!value || given(flag)) return;
    field = *value;
    applied += detail::concat(applied.empty() ? "" : ", ", name, "=", *value);
  };
  use("--temperature", "temperature", g.temperature, p.temperature);
  use("--top-p", "top_p", g.top_p, p.top_p);
  use("--top-k", "top_k", g.top_k, p.top_k);
  use("--min-p", "min_p", g.min_p, p.min_p);
  use("--repetition-penalty", "repetition_penalty", g.repetition_penalty, p.repetition_penalty);
  use("--max-tokens", "max_tokens", g.max_tokens, p.max_tokens);
  if (applied.empty()) return "";
  try {
    p.validate();
  } catch (const Error& e) {
    fail(file.string(), ": ", e.what());
  }
  return file.string() + ": " + applied;
}

// Sampling flags; params() resolves them (reading grammar files) after parsing.
struct SamplingFlags {
  SamplingParams p;
  int seed = -1;
  std::string regex, schema_file, ebnf_file;

  // Throws UsageError for values outside SamplingParams' ranges (exit 2).
  SamplingParams params() const {
    SamplingParams out = p;
    try {
      out.validate();
    } catch (const Error& e) {
      throw UsageError(std::string("sampling flags: ") + e.what());
    }
    if (seed >= 0) out.seed = static_cast<uint64_t>(seed);
    if (!regex.empty()) out.so_args = {"regex", regex};
    if (!schema_file.empty()) out.so_args = {"json_schema", read_text_file(schema_file, "--json-schema")};
    if (!ebnf_file.empty()) out.so_args = {"ebnf", read_text_file(ebnf_file, "--ebnf")};
    return out;
  }
};

inline void add_sampling_flags(CLI::App& app, SamplingFlags& f) {
  app.add_option("--max-tokens", f.p.max_tokens, "new tokens at most");
  app.add_option("--temperature", f.p.temperature, "0 = greedy");
  app.add_option("--top-p", f.p.top_p, "nucleus mass in (0, 1]");
  app.add_option("--top-k", f.p.top_k, "0 = all");
  app.add_option("--min-p", f.p.min_p, "minimum probability relative to the most likely");
  app.add_option("--repetition-penalty", f.p.repetition_penalty, "> 0; 1 = off");
  app.add_option("--seed", f.seed, "sampling seed (default: engine-chosen)");
  app.add_flag("--ignore-eos", f.p.ignore_eos, "do not stop at EOS");
  app.add_option("--stop", f.p.stop, "stop string (repeatable)");
  // One constraint kind at a time (CLI11 refuses two of them: exit 2).
  auto* regex = app.add_option("--regex", f.regex, "constrain output to a regular expression");
  auto* schema = app.add_option("--json-schema", f.schema_file, "constrain output to a JSON Schema file");
  auto* ebnf = app.add_option("--ebnf", f.ebnf_file, "constrain output to an EBNF/GBNF grammar file");
  regex->excludes(schema)->excludes(ebnf);
  schema->excludes(ebnf);
}

}  // namespace deepinfer::app
