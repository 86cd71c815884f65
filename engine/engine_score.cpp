// Prompt logprobs (SamplingParams::prompt_logprobs, vLLM's): sample 0 of such a request asks
// its prefill steps for the logits of every prompt position, and collect() scores them here;
// Engine::prompt_logprobs (`deepinfer eval ppl`) is one such request.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "engine/engine_impl.h"
#include "sample/sampler.h"

namespace deepinfer {

int Engine::Impl::prompt_logprob_rows(const SeqState& seq, int begin, int end, int& from) const {
  const RequestState& r = *seq.request;
  from = 0;
  if (seq.index != 0 || r.params.prompt_logprobs < 0 || r.prompt_logprobs_done()) return 0;
  // Position p's logits score prompt token p + 1: positions [0, num_prompt - 1). Positions
  // already scored (a recompute after preemption) are not asked again.
  from = std::max(begin, r.num_prompt_logprobs);
  const int last = std::min(end, seq.num_prompt_tokens - 1);
  return last > from ? last - from : 0;
}

bool Engine::Impl::score_prompt(SeqState& seq, const Tensor& logits, int row, int from, int count) {
  RequestState& r = *seq.request;
  const int64_t stride = logits.size(1);
  const int cols = std::min<int>(sample_vocab, static_cast<int>(stride));
  const int k = std::min(r.params.prompt_logprobs, cols);
  std::vector<std::pair<float, int32_t>> cand;
  for (int i = 0; i < count; ++i) {
    const int p = from + i;
    const float* x = logits.ptr<float>() + int64_t{row + i} * stride;  // logits after token p
    // Log-softmax in double in a fixed order (the ppl baselines' bits depend on it).
    double mx = -INFINITY;
    for (int v = 0; v < cols; ++v) mx = std::max(mx, static_cast<double>(x[v]));
    if (!std::isfinite(mx)) {
      fail_seq(seq, nan_logits_error(p) + " (prompt logprobs)");
      return false;
    }
    double sum = 0.0;
    for (int v = 0; v < cols; ++v) sum += std::exp(static_cast<double>(x[v]) - mx);
    const double log_z = std::log(sum);
    PromptLogprob& out = r.prompt_logprobs[static_cast<size_t>(p)];
    out.token_id = seq.token_ids[static_cast<size_t>(p) + 1];
    out.logprob = static_cast<double>(x[out.token_id]) - mx - log_z;
    out.rank = 1 + static_cast<int>(std::count_if(x, x + cols, [&](float v) { return v > x[out.token_id]; }));
    out.top.clear();
    if (k > 0) {
      cand.clear();
      for (int v = 0; v < cols; ++v) cand.emplace_back(x[v], v);
      std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), [](const auto& a, const auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
      });
      for (int j = 0; j < k; ++j)
        out.top.emplace_back(cand[static_cast<size_t>(j)].second,
                             static_cast<double>(cand[static_cast<size_t>(j)].first) - mx - log_z);
    }
  }
  r.num_prompt_logprobs = std::max(r.num_prompt_logprobs, from + count);
  // Every position scored: a later readmission (after preemption) may use the prefix cache.
  if (r.prompt_logprobs_done()) seq.use_prefix_cache = true;
  return true;
}

std::vector<double> Engine::prompt_logprobs(const Prompt& prompt) {
  Impl& impl = *impl_;
  DI_CHECK(!impl.has_unfinished(),
           "prompt_logprobs: the engine has unfinished requests (call it when idle, or add a request with "
           "SamplingParams::prompt_logprobs)");
  const std::vector<int32_t> ids = impl.tokenize(prompt, "prompt_logprobs");
  const int n = static_cast<int>(ids.size());
  DI_CHECK(n >= 2, "prompt_logprobs: the prompt has ", n, " tokens; at least 2 are needed");
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 1;
  p.prompt_logprobs = 0;
  const RequestOutput out = generate({Prompt::from_tokens(ids)}, {p})[0];
  if (!out.error.empty()) fail("prompt_logprobs: ", out.error);
  DI_CHECK(static_cast<int>(out.prompt_logprobs.size()) == n - 1, "prompt_logprobs: ", out.prompt_logprobs.size(),
           " prompt logprobs for ", n, " tokens");
  std::vector<double> lp;
  lp.reserve(out.prompt_logprobs.size());
  for (const PromptLogprob& e : out.prompt_logprobs) lp.push_back(e.logprob);
  return lp;
}

}  // namespace deepinfer
