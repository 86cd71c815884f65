// Engine(EngineConfig): backend, model (checkpoint or random weights) and
// tokenizer from the configuration; DEEPINFER_* environment variables that
// concern the engine are honoured here. On a device that reports its memory,
// the KV cache takes what gpu_memory_utilization leaves after the weights and
// a profile step (unless num_kv_blocks or kv_cache_num_bytes is set).
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "core/settings.h"
#include "engine/engine_impl.h"
#include "kv/kv_sizing.h"
#include "model/parallel.h"

namespace deepinfer {
namespace {

int resolve_max_model_len(const EngineConfig& config, const ModelConfig& mc) {
  // As vLLM: a context above the model's positions is refused (its RoPE table and training stop there).
  if (config.max_model_len > 0 && mc.max_position_embeddings > 0)
    DI_CHECK(config.max_model_len <= mc.max_position_embeddings, "EngineConfig.max_model_len (--max-model-len) ",
             config.max_model_len, " is above the model's max_position_embeddings ", mc.max_position_embeddings,
             " (", mc.source, ")");
  if (config.max_model_len > 0) return config.max_model_len;
  return static_cast<int>(
      std::min<int64_t>(mc.max_position_embeddings > 0 ? mc.max_position_embeddings : 4096, 1 << 20));
}

// Runs one step of max_num_batched_tokens prompt tokens (sequences of at most
// max_model_len; model workspaces and backend scratch grow to their largest),
// then sizes the KV cache from the memory left. The profile's own small cache
// is counted as reclaimable.
int kv_blocks_from_device_memory(const EngineConfig& config, int max_model_len, Model& model,
                                 Backend& backend) {
  const int bs = config.kv_block_size;
  DI_CHECK(bs > 0, "EngineConfig.kv_block_size: must be > 0, got ", bs);
  const int num_tokens = std::max(1, config.max_num_batched_tokens);
  const int tokens_per_seq = std::max(1, std::min(num_tokens, max_model_len));
  const int num_seqs = std::max(1, std::min(config.max_num_seqs, (num_tokens + tokens_per_seq - 1) / tokens_per_seq));
  const int blocks_per_seq = (tokens_per_seq + bs - 1) / bs;
  const int num_blocks = num_seqs * blocks_per_seq;
  const RunnerConfig rc = runner_config(config, model, num_blocks, max_model_len);
  const std::vector<KvGroupSpec> groups = Runner::kv_groups(model, rc.num_mtp_kv_layers);
  KvMemoryBudget budget;
  {
    Runner runner(model, backend, rc);
    const std::vector<int32_t> token_ids(static_cast<size_t>(tokens_per_seq), 0);
    std::vector<int32_t> block_ids(static_cast<size_t>(num_blocks));  // [num_seqs, blocks_per_seq]
    std::iota(block_ids.begin(), block_ids.end(), 0);
    std::vector<std::vector<std::vector<int32_t>>> more_blocks;  // [seq][group 1..][blocks]
    for (int i = 0; i < num_seqs; ++i) more_blocks.push_back(scratch_block_tables(runner, i, tokens_per_seq, bs));
    std::vector<RunSeq> seqs;
    for (int i = 0, left = num_tokens; i < num_seqs && left > 0; ++i, left -= tokens_per_seq)
      seqs.push_back({token_ids, 0, std::min(left, tokens_per_seq),
                      std::span(block_ids).subspan(static_cast<size_t>(i) * blocks_per_seq, blocks_per_seq), true, 1,
                      more_blocks[static_cast<size_t>(i)]});
    runner.execute(seqs);
    backend.synchronize();
    const Backend::MemoryInfo mem = backend.memory_info();
    budget.total_bytes = mem.total_bytes;
    budget.free_bytes = mem.free_bytes;
  }
  budget.reclaimable_bytes = kv_cache_bytes(groups, backend.activation_dtype(), num_blocks, Runner::pool_limits(rc));
  budget.utilization = config.gpu_memory_utilization;
  budget.groups = groups;
  budget.activation = backend.activation_dtype();
  budget.limits = Runner::pool_limits(rc);
  budget.block_size = bs;
  budget.max_model_len = max_model_len;
  return kv_blocks_for_memory(budget);
}

}  // namespace

Engine::Engine(const EngineConfig& config_in) {
  EngineConfig config = config_in;
  // The DEEPINFER_* settings, read once (core/settings.h), fill what the config leaves open.
  const Settings& env = env_settings();
  if (env.get_bool("DEEPINFER_BATCH_INVARIANT")) config.batch_invariant = true;
  // Speculative decoding: the fields win over DEEPINFER_USE_NEXTN_DECODE /
  // DEEPINFER_ENABLE_MTP_VARLEN, which win over the defaults: k = kDefaultSpecTokens with the
  // scheduled length when the checkpoint has an MTP layer (k auto: resolved after loading),
  // else off; a k that is set runs fixed lengths unless spec_varlen says otherwise.
  if (config.num_speculative_tokens < 0 && env.is_set("DEEPINFER_USE_NEXTN_DECODE"))
    config.num_speculative_tokens = static_cast<int>(env.get_int("DEEPINFER_USE_NEXTN_DECODE"));
  if (config.spec_varlen < 0 && env.is_set("DEEPINFER_ENABLE_MTP_VARLEN"))
    config.spec_varlen = env.get_bool("DEEPINFER_ENABLE_MTP_VARLEN") ? 1 : 0;
  // Random weights have no trained MTP layer (their drafts are never accepted): no default k.
  const bool k_auto = config.num_speculative_tokens < 0;
  check_speculation_config(config);  // before anything loads
  if (config.model_dir.empty() && config.random_weights_config.empty())
    config.model_dir = env.get_string("DEEPINFER_HF_MODEL_DIR");
  DI_CHECK(!config.model_dir.empty() || !config.random_weights_config.empty(),
           "EngineConfig: set model_dir (a checkpoint) or random_weights_config (a config.json)");
  DI_CHECK(config.max_num_seqs >= 1, "EngineConfig.max_num_seqs: must be >= 1, got ", config.max_num_seqs);
  DI_CHECK(config.max_num_batched_tokens >= 1, "EngineConfig.max_num_batched_tokens: must be >= 1, got ",
           config.max_num_batched_tokens);
  DI_CHECK(config.max_model_len >= 0, "EngineConfig.max_model_len: must be >= 0 (0 = the model's), got ",
           config.max_model_len);
  DI_CHECK(config.kv_block_size >= 1, "EngineConfig.kv_block_size: must be >= 1, got ", config.kv_block_size);
  DI_CHECK(config.num_kv_blocks >= 0 && config.kv_cache_num_bytes >= 0 && config.num_threads >= 0,
           "EngineConfig: num_kv_blocks, kv_cache_num_bytes and num_threads must be >= 0");
  DI_CHECK(config.gpu_memory_utilization > 0.0 && config.gpu_memory_utilization <= 1.0,
           "EngineConfig.gpu_memory_utilization: expected a fraction in (0, 1], got ",
           config.gpu_memory_utilization);

  // Several processes (EngineConfig::tp/ep/dp): where this one sits, from the launcher's
  // environment; its shard of the model is planned (and impossible layouts refused) before
  // anything loads. Steps then run one at a time, eagerly, without drafts (rank 0 broadcasts
  // each step's inputs: runner/step_follow.cpp).
  const ProcessLayout layout = process_layout_from_env();
  const bool several = layout.world_size > 1 || config.tp > 1 || config.ep > 1 || config.dp > 1;
  ParallelPlan plan;
  if (several) {
    const int64_t extra = env.get_int("DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS");
    DI_CHECK(extra >= 0 && extra <= (1 << 20), "DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS: expected a number of "
             "redundant experts >= 0, got ", extra);
    plan = make_parallel_plan(load_model_config(!config.random_weights_config.empty() ? config.random_weights_config
                                                                                      : config.model_dir),
                              config.tp, config.ep, config.dp, layout.rank, layout.world_size, static_cast<int>(extra));
    if (plan.experts_split) {
      const int64_t interval = env.is_set("DEEPINFER_EPLB_INTERVAL") ? env.get_int("DEEPINFER_EPLB_INTERVAL")
                               : plan.num_extra_experts > 0               ? 1000
                                                                          : 0;
      DI_CHECK(interval >= 0 && interval <= (1 << 30), "DEEPINFER_EPLB_INTERVAL: expected steps >= 0 (0: never), got ",
               interval);
      plan.eplb_interval = static_cast<int>(interval);
      plan.time_collectives = env.get_bool("DEEPINFER_EP_COMM_TIMING");
      if (layout.rank == 0)
        log_info("EPLB: ", plan.num_extra_experts, " redundant experts (DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS=", extra,
                 ", rounded up so ", plan.num_local_experts * config.ep, " physical experts divide over --ep ",
                 config.ep, "), ", plan.num_local_experts, " per rank, re-placed every ", plan.eplb_interval,
                 " steps (0: never)");
    }
    DI_CHECK(config.num_speculative_tokens <= 0, "--tp/--ep/--dp: speculative decoding with several processes "
             "is not built yet; run with 0 drafts (--num-speculative-tokens 0)");
    config.num_speculative_tokens = 0;
    config.async_scheduling = false;
    config.enforce_eager = true;
  }

  BackendOptions bo;
  bo.batch_invariant = config.batch_invariant;
  bo.device_index = layout.local_rank;
  bo.num_threads = config.num_threads;
  bo.cuda = cuda_options(env);
  std::unique_ptr<Backend> backend;
  if (config.backend == "cpu") {
    backend = make_cpu_backend(bo);
  } else if (config.backend == "cuda") {
    backend = make_cuda_backend(bo);
    DI_CHECK(backend != nullptr, "EngineConfig.backend: deepinfer was built without CUDA");
  } else {
    fail("EngineConfig.backend: expected cpu or cuda, got '", config.backend, "'");
  }

  LoadOptions lo;
  lo.load_mtp = (config.num_speculative_tokens > 0 || (k_auto && config.random_weights_config.empty())) &&
                config.speculator == "mtp";
  lo.mtp_optional = k_auto;  // the default k only where the checkpoint has the layer
  lo.seed = config.random_weights_seed;
  lo.check_finite = !config.skip_weight_check;
  DI_CHECK(config.random_weights_dtype == "bf16" || config.random_weights_dtype == "fp8",
           "EngineConfig.random_weights_dtype: expected bf16 or fp8, got '",
           config.random_weights_dtype, "'");
  lo.random_weight_dtype = config.random_weights_dtype == "fp8" ? DType::F8_E4M3 : DType::BF16;
  lo.prefill_truncation_mode = !config.prefill_truncation_mode.empty()
                                   ? config.prefill_truncation_mode
                                   : env.get_string("DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE");
  lo.prefill_keep_tokens = config.prefill_keep_tokens != 0
                               ? config.prefill_keep_tokens
                               : env.get_int("DEEPINFER_YOCO_PREFILL_KEEP_TOKENS");
  std::unique_ptr<Communicator> comm;
  if (several) {
    comm = make_communicator(layout, backend->device(), backend->native_stream());
    plan.comm = comm.get();
    if (plan.dp_size > 1 && plan.tp_size > 1) {  // --dp x --tp: the groups' communicators (owned by comm)
      plan.tp_comm = &comm->split(plan.dp_rank, plan.tp_rank);
      plan.dp_comm = &comm->split(plan.tp_rank, plan.dp_rank);
    }
    lo.parallel = &plan;
    lo.load_mtp = false;
  }
  std::unique_ptr<Model> model;
  if (!config.random_weights_config.empty()) {
    lo.random_weights = true;
    model = random_model(config.random_weights_config, *backend, lo);
  } else {
    model = load_model(config.model_dir, *backend, lo);
  }
  if (k_auto)
    config.num_speculative_tokens =
        lo.load_mtp && (model->num_mtp_layers() > 0 || has_block_drafter(*model)) ? kDefaultSpecTokens : 0;
  if (config.spec_varlen < 0) config.spec_varlen = k_auto && config.num_speculative_tokens > 0 ? 1 : 0;

  std::unique_ptr<Tokenizer> tokenizer;
  std::string tok_dir = !config.tokenizer_dir.empty() ? config.tokenizer_dir : config.model_dir;
  if (!tok_dir.empty() && std::filesystem::exists(std::filesystem::path(tok_dir) / "tokenizer.json"))
    tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_dir(tok_dir));
  else
    DI_CHECK(config.tokenizer_dir.empty(), "EngineConfig.tokenizer_dir: no tokenizer.json in ",
             config.tokenizer_dir);

  config.max_model_len = resolve_max_model_len(config, model->config());
  if (config.num_kv_blocks <= 0 && config.kv_cache_num_bytes <= 0 && backend->memory_info().total_bytes > 0)
    config.num_kv_blocks = kv_blocks_from_device_memory(config, config.max_model_len, *model, *backend);
  // Every rank's KV cache has rank 0's blocks (its block tables address them).
  if (comm) comm->broadcast_bytes(&config.num_kv_blocks, sizeof(config.num_kv_blocks), 0);

  impl_ = std::make_unique<Impl>(config, std::move(backend), std::move(model), std::move(tokenizer),
                                 std::move(comm));
}

}  // namespace deepinfer
