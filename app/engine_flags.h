// Engine flags shared by `deepinfer generate` and `deepinfer bench`.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

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
  app.add_option("--backend", c.backend, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--threads", c.num_threads, "CPU threads (0 = all cores)");
  app.add_flag("--batch-invariant", c.batch_invariant, "batch-invariant kernels (DEEPINFER_BATCH_INVARIANT=1)");
  app.add_option("--max-num-seqs", c.max_num_seqs, "sequences per step");
  app.add_option("--max-num-batched-tokens", c.max_num_batched_tokens, "tokens per step");
  app.add_option("--max-model-len", c.max_model_len, "context length (0 = the model's)");
  app.add_option("--kv-block-size", c.kv_block_size, "tokens per KV block");
  app.add_option("--num-kv-blocks", c.num_kv_blocks, "KV blocks (0 = from --kv-cache-gib)");
  app.add_option("--kv-cache-bytes", c.kv_cache_num_bytes, "KV cache bytes (0 = 4 GiB)");
  app.add_flag("!--no-prefix-caching", c.enable_prefix_caching, "disable prefix reuse");
  app.add_flag("--enforce-eager", c.enforce_eager, "no CUDA graphs for decode steps");
  app.add_flag("!--no-async-scheduling", c.async_scheduling,
               "one step at a time (no preparing step N+1 while step N runs)");
}

// Resolves --model / --random-weights / --config into the EngineConfig.
inline void apply_model_flags(const ModelFlags& m, const std::string& default_dir, EngineConfig& c) {
  c.model_dir = m.model_dir.empty() && m.config_path.empty() ? default_dir : m.model_dir;
  if (m.random_weights || !m.config_path.empty()) {
    c.random_weights_config = !m.config_path.empty() ? m.config_path : c.model_dir + "/config.json";
  }
}

}  // namespace deepinfer::app
