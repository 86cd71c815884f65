// Engine: the public facade over Engine::Impl, and generate() on top of the
// streaming interface.
#include <unordered_map>

#include "core/error.h"
#include "engine/engine_impl.h"

namespace deepinfer {

const char* to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::None: return "";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    case FinishReason::Error: return "error";
  }
  return "";
}

void SpecDecodeStats::add(const SpecDecodeStats& o) {
  num_verify_steps += o.num_verify_steps;
  num_draft_tokens += o.num_draft_tokens;
  num_accepted_tokens += o.num_accepted_tokens;
  num_emitted_tokens += o.num_emitted_tokens;
  for (auto [mine, theirs] : {std::pair{&accepted_per_position, &o.accepted_per_position},
                              std::pair{&drafts_per_position, &o.drafts_per_position}}) {
    if (mine->size() < theirs->size()) mine->resize(theirs->size(), 0);
    for (size_t j = 0; j < theirs->size(); ++j) (*mine)[j] += (*theirs)[j];
  }
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

int process_rank() { return process_layout_from_env().rank; }

int Engine::rank() const { return impl_->comm ? impl_->comm->rank() : 0; }
int Engine::world_size() const { return impl_->comm ? impl_->comm->size() : 1; }

int64_t Engine::follow() {
  DI_CHECK(rank() != 0, "Engine::follow: rank 0 owns the scheduler; only the other ranks follow");
  return impl_->runner().follow();
}

void Engine::hold_expert_replacement(bool hold) { impl_->runner().hold_expert_replacement(hold); }

std::string Engine::add_request(const Prompt& prompt, const SamplingParams& params,
                                std::string request_id) {
  return impl_->add_request(prompt, params, std::move(request_id));
}
std::vector<RequestOutput> Engine::step() { return impl_->step(); }
bool Engine::abort(const std::string& request_id) { return impl_->abort(request_id); }
bool Engine::has_unfinished() const { return impl_->has_unfinished(); }
const EngineStats& Engine::stats() const {
  impl_->refresh_load_stats();
  return impl_->stats;
}
std::vector<int32_t> Engine::tokenize(const Prompt& prompt) const {
  return impl_->tokenize(prompt, "tokenize");
}
int Engine::vocab_size() const { return impl_->model->vocab_size(); }
int Engine::max_model_len() const { return impl_->max_model_len; }

std::string Engine::chat_format() const {
  return impl_->tokenizer ? to_string(impl_->tokenizer->chat_format()) : std::string();
}

std::string Engine::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return impl_->tokenizer ? impl_->tokenizer->decode(ids, skip_special_tokens) : std::string();
}

std::vector<RequestOutput> Engine::generate(
    const std::vector<Prompt>& prompts, const std::vector<SamplingParams>& params,
    const std::function<void(const RequestOutput&)>& on_output) {
  DI_CHECK(params.size() == 1 || params.size() == prompts.size(), "generate: ", params.size(),
           " SamplingParams for ", prompts.size(), " prompts (expected 1 or one each)");
  std::vector<RequestOutput> results(prompts.size());
  std::unordered_map<std::string, size_t> index_of;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams p = params.size() == 1 ? params[0] : params[i];
    p.delta_outputs = false;  // the results are whole outputs
    try {
      index_of[impl_->add_request(prompts[i], p, "")] = i;
    } catch (const Error& e) {
      RequestOutput& r = results[i];
      r.request_id = "rejected-" + std::to_string(i);
      r.finished = true;
      r.error = e.what();
      CompletionOutput c;
      c.finish_reason = FinishReason::Error;
      r.outputs.push_back(c);
      if (on_output) on_output(r);
    }
  }
  while (!index_of.empty() && impl_->has_unfinished()) {
    for (RequestOutput& out : impl_->step()) {
      if (on_output) on_output(out);
      auto it = index_of.find(out.request_id);
      if (it == index_of.end() || !out.finished) continue;
      results[it->second] = std::move(out);
      index_of.erase(it);
    }
  }
  return results;
}

}  // namespace deepinfer
