// Engine::prompt_logprobs: teacher-forced log-probabilities of a prompt's tokens, from one
// prefill step on a runner of its own (the engine's KV cache and queue are not touched).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "engine/engine_impl.h"

namespace deepinfer {

std::vector<double> Engine::prompt_logprobs(const Prompt& prompt) {
  Impl& impl = *impl_;
  DI_CHECK(!impl.has_unfinished(), "prompt_logprobs: the engine has unfinished requests (call it when idle)");
  const std::vector<int32_t> ids = impl.tokenize(prompt, "prompt_logprobs");
  const int n = static_cast<int>(ids.size());
  DI_CHECK(n >= 2, "prompt_logprobs: the prompt has ", n, " tokens; at least 2 are needed");
  DI_CHECK(n <= impl.max_model_len, "prompt_logprobs: the prompt has ", n, " tokens, above max_model_len ",
           impl.max_model_len);
  const int vocab = impl.model->vocab_size();
  for (int32_t id : ids)
    DI_CHECK(id >= 0 && id < vocab, "prompt_logprobs: token id ", id, " is outside the vocabulary [0, ", vocab, ")");
  // One sequence, the whole prompt in one step, logits for every position.
  EngineConfig cfg = impl.config;
  const int bs = std::max(1, cfg.kv_block_size);
  const int num_blocks = (n + bs - 1) / bs;
  cfg.max_num_seqs = 1;
  cfg.max_num_batched_tokens = n;
  cfg.num_speculative_tokens = 0;
  RunnerConfig rc = runner_config(cfg, num_blocks, n);
  rc.max_logits_per_seq = n;
  rc.use_graphs = false;
  rc.sample_vocab = impl.sample_vocab;
  Runner runner(*impl.model, *impl.backend, rc);
  std::vector<int32_t> blocks(static_cast<size_t>(num_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  // Groups 1.. (V3.2's indexer keys, V4's window / compressed groups): blocks of their own.
  const std::vector<std::vector<int32_t>> more = scratch_block_tables(runner, 0, n, bs);
  const RunSeq seq{ids, 0, n, blocks, true, n, more};
  const Tensor& logits = runner.execute(std::span(&seq, 1));  // [n, vocab] host F32
  DI_CHECK(logits.size(0) == n, "prompt_logprobs: the runner returned ", logits.size(0), " logits rows for ", n,
           " tokens");
  const int64_t stride = logits.size(1);
  const int cols = impl.sample_vocab > 0 ? std::min(impl.sample_vocab, vocab) : vocab;
  std::vector<double> out(static_cast<size_t>(n - 1));
  for (int i = 0; i + 1 < n; ++i) {
    const float* row = logits.ptr<float>() + int64_t{i} * stride;  // logits after token i
    const int32_t target = ids[static_cast<size_t>(i) + 1];
    DI_CHECK(target < cols, "prompt_logprobs: token ", target, " at position ", i + 1,
             " is outside the sampled vocabulary (", cols, ")");
    double mx = -INFINITY;
    for (int v = 0; v < cols; ++v) mx = std::max(mx, static_cast<double>(row[v]));
    DI_CHECK(std::isfinite(mx), "prompt_logprobs: non-finite logits at position ", i);
    double sum = 0.0;
    for (int v = 0; v < cols; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);  // fixed order
    out[static_cast<size_t>(i)] = static_cast<double>(row[target]) - mx - std::log(sum);
  }
  return out;
}

}  // namespace deepinfer
