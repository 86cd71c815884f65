// deepinfer._core: the public C++ API (include/deepinfer) bound with nanobind. The Python
// layer (python/deepinfer/__init__.py) builds the user-facing names on top of it; this file
// only converts. Every call into the engine releases the GIL, so other Python threads run
// while a step computes; deepinfer::Error becomes deepinfer.Error (a ValueError).
#include <nanobind/nanobind.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "core/error.h"
#include "deepinfer/engine.h"
#include "deepinfer/eval.h"
#include "deepinfer/sampling_params.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace deepinfer {
namespace {

// Fields bound by name: the Python layer sets them from keyword arguments and names an
// unknown one itself, so a typo is an error rather than a silently ignored option.
void bind_config(nb::module_& m) {
  nb::class_<EngineConfig>(m, "EngineConfig")
      .def(nb::init<>())
      .def_rw("model_dir", &EngineConfig::model_dir)
      .def_rw("random_weights_config", &EngineConfig::random_weights_config)
      .def_rw("random_weights_seed", &EngineConfig::random_weights_seed)
      .def_rw("random_weights_dtype", &EngineConfig::random_weights_dtype)
      .def_rw("tokenizer_dir", &EngineConfig::tokenizer_dir)
      .def_rw("backend", &EngineConfig::backend)
      .def_rw("num_threads", &EngineConfig::num_threads)
      .def_rw("batch_invariant", &EngineConfig::batch_invariant)
      .def_rw("max_num_seqs", &EngineConfig::max_num_seqs)
      .def_rw("max_num_batched_tokens", &EngineConfig::max_num_batched_tokens)
      .def_rw("max_model_len", &EngineConfig::max_model_len)
      .def_rw("kv_block_size", &EngineConfig::kv_block_size)
      .def_rw("num_kv_blocks", &EngineConfig::num_kv_blocks)
      .def_rw("kv_cache_num_bytes", &EngineConfig::kv_cache_num_bytes)
      .def_rw("gpu_memory_utilization", &EngineConfig::gpu_memory_utilization)
      .def_rw("enable_prefix_caching", &EngineConfig::enable_prefix_caching)
      .def_rw("async_scheduling", &EngineConfig::async_scheduling)
      .def_rw("enforce_eager", &EngineConfig::enforce_eager)
      .def_rw("device_sampling", &EngineConfig::device_sampling)
      .def_rw("seed", &EngineConfig::seed)
      .def_rw("skip_weight_check", &EngineConfig::skip_weight_check)
      .def_rw("prefill_truncation_mode", &EngineConfig::prefill_truncation_mode)
      .def_rw("prefill_keep_tokens", &EngineConfig::prefill_keep_tokens)
      .def_rw("num_speculative_tokens", &EngineConfig::num_speculative_tokens)
      .def_rw("speculator", &EngineConfig::speculator)
      .def_rw("spec_varlen", &EngineConfig::spec_varlen);
}

void bind_sampling(nb::module_& m) {
  nb::class_<StructuredOutputArgs>(m, "StructuredOutputArgs")
      .def(nb::init<>())
      .def_rw("kind", &StructuredOutputArgs::kind)
      .def_rw("source", &StructuredOutputArgs::source)
      .def_rw("any_whitespace", &StructuredOutputArgs::any_whitespace);
  nb::class_<SamplingParams>(m, "SamplingParams")
      .def(nb::init<>())
      .def_rw("n", &SamplingParams::n)
      .def_rw("temperature", &SamplingParams::temperature)
      .def_rw("top_p", &SamplingParams::top_p)
      .def_rw("top_k", &SamplingParams::top_k)
      .def_rw("min_p", &SamplingParams::min_p)
      .def_rw("repetition_penalty", &SamplingParams::repetition_penalty)
      .def_rw("frequency_penalty", &SamplingParams::frequency_penalty)
      .def_rw("presence_penalty", &SamplingParams::presence_penalty)
      .def_rw("max_tokens", &SamplingParams::max_tokens)
      .def_rw("min_tokens", &SamplingParams::min_tokens)
      .def_rw("stop", &SamplingParams::stop)
      .def_rw("stop_token_ids", &SamplingParams::stop_token_ids)
      .def_rw("ignore_eos", &SamplingParams::ignore_eos)
      .def_rw("include_stop_str_in_output", &SamplingParams::include_stop_str_in_output)
      .def_rw("seed", &SamplingParams::seed)
      .def_rw("seq_seed", &SamplingParams::seq_seed)
      .def_rw("logprobs", &SamplingParams::logprobs)
      .def_rw("skip_special_tokens", &SamplingParams::skip_special_tokens)
      .def_rw("delta_outputs", &SamplingParams::delta_outputs)
      .def_rw("so_args", &SamplingParams::so_args)
      .def("validate", &SamplingParams::validate);
}

void bind_prompt(nb::module_& m) {
  nb::class_<MessageToolCall>(m, "MessageToolCall")
      .def(nb::init<>())
      .def_rw("name", &MessageToolCall::name)
      .def_rw("arguments", &MessageToolCall::arguments)
      .def_rw("type", &MessageToolCall::type);
  nb::class_<Message>(m, "Message")
      .def(nb::init<>())
      .def_rw("role", &Message::role)
      .def_rw("content", &Message::content)
      .def_rw("content_is_null", &Message::content_is_null)
      .def_rw("tool_calls", &Message::tool_calls);
  nb::class_<Prompt>(m, "Prompt")
      .def(nb::init<>())
      .def_rw("text", &Prompt::text)
      .def_rw("messages", &Prompt::messages)
      .def_rw("token_ids", &Prompt::token_ids)
      .def_rw("thinking", &Prompt::thinking);
}

const CompletionOutput& first(const RequestOutput& r) {
  if (r.outputs.empty()) throw Error("RequestOutput " + r.request_id + " has no samples (error: " + r.error + ")");
  return r.outputs[0];
}

void bind_outputs(nb::module_& m) {
  nb::class_<TokenLogprob>(m, "TokenLogprob")
      .def_ro("token_id", &TokenLogprob::token_id)
      .def_ro("logprob", &TokenLogprob::logprob)
      .def_ro("top", &TokenLogprob::top);
  nb::class_<CompletionOutput>(m, "CompletionOutput")
      .def_ro("index", &CompletionOutput::index)
      .def_ro("text", &CompletionOutput::text)
      .def_ro("token_ids", &CompletionOutput::token_ids)
      .def_prop_ro("finish_reason",
                   [](const CompletionOutput& o) -> std::optional<std::string> {
                     if (o.finish_reason == FinishReason::None) return std::nullopt;
                     return std::string(to_string(o.finish_reason));
                   })
      .def_ro("stop_reason", &CompletionOutput::stop_reason)
      .def_ro("logprobs", &CompletionOutput::logprobs)
      .def_ro("delta_text", &CompletionOutput::delta_text)
      .def_ro("delta_token_ids", &CompletionOutput::delta_token_ids);
  nb::class_<SpecDecodeStats>(m, "SpecDecodeStats")
      .def_ro("num_verify_steps", &SpecDecodeStats::num_verify_steps)
      .def_ro("num_draft_tokens", &SpecDecodeStats::num_draft_tokens)
      .def_ro("num_accepted_tokens", &SpecDecodeStats::num_accepted_tokens)
      .def_ro("num_emitted_tokens", &SpecDecodeStats::num_emitted_tokens)
      .def_ro("accepted_per_position", &SpecDecodeStats::accepted_per_position)
      .def_ro("drafts_per_position", &SpecDecodeStats::drafts_per_position)
      .def_prop_ro("acceptance_rate", &SpecDecodeStats::acceptance_rate)
      .def_prop_ro("mean_accepted_length", &SpecDecodeStats::mean_accepted_length);
  nb::class_<RequestOutput>(m, "RequestOutput")
      .def_ro("request_id", &RequestOutput::request_id)
      .def_ro("prompt_token_ids", &RequestOutput::prompt_token_ids)
      .def_ro("outputs", &RequestOutput::outputs)
      .def_ro("finished", &RequestOutput::finished)
      .def_ro("error", &RequestOutput::error)
      .def_ro("num_prompt_tokens", &RequestOutput::num_prompt_tokens)
      .def_ro("num_output_tokens", &RequestOutput::num_output_tokens)
      .def_ro("num_cached_tokens", &RequestOutput::num_cached_tokens)
      .def_ro("time_to_first_token_s", &RequestOutput::time_to_first_token_s)
      .def_ro("decode_tokens_per_s", &RequestOutput::decode_tokens_per_s)
      .def_ro("spec", &RequestOutput::spec)
      // The first sample's fields (n = 1, the common case), and OpenAI-style usage.
      .def_prop_ro("text", [](const RequestOutput& r) { return first(r).text; })
      .def_prop_ro("token_ids", [](const RequestOutput& r) { return first(r).token_ids; })
      .def_prop_ro("finish_reason",
                   [](const RequestOutput& r) -> std::optional<std::string> {
                     if (r.outputs.empty() || r.outputs[0].finish_reason == FinishReason::None) return std::nullopt;
                     return std::string(to_string(r.outputs[0].finish_reason));
                   })
      .def_prop_ro("logprobs", [](const RequestOutput& r) { return first(r).logprobs; })
      .def_prop_ro("usage", [](const RequestOutput& r) {
        nb::dict d;
        d["prompt_tokens"] = r.num_prompt_tokens;
        d["completion_tokens"] = r.num_output_tokens;
        d["total_tokens"] = r.num_prompt_tokens + r.num_output_tokens;
        d["cached_tokens"] = r.num_cached_tokens;
        return d;
      })
      .def("__repr__", [](const RequestOutput& r) {
        return "RequestOutput(request_id=" + r.request_id + ", finished=" + (r.finished ? "True" : "False") +
               ", outputs=" + std::to_string(r.outputs.size()) + (r.error.empty() ? "" : ", error=" + r.error) + ")";
      });
  nb::class_<EngineStats>(m, "EngineStats")
      .def_ro("num_steps", &EngineStats::num_steps)
      .def_ro("num_prefill_steps", &EngineStats::num_prefill_steps)
      .def_ro("num_step_seqs", &EngineStats::num_step_seqs)
      .def_ro("num_kv_block_copies", &EngineStats::num_kv_block_copies)
      .def_ro("num_steps_ahead", &EngineStats::num_steps_ahead)
      .def_ro("spec_varlen", &EngineStats::spec_varlen)
      .def_ro("num_steps_without_drafts", &EngineStats::num_steps_without_drafts)
      .def_ro("num_free_kv_blocks", &EngineStats::num_free_kv_blocks)
      .def_ro("num_running_seqs", &EngineStats::num_running_seqs)
      .def_ro("num_waiting_seqs", &EngineStats::num_waiting_seqs)
      .def_ro("num_prompt_tokens_computed", &EngineStats::num_prompt_tokens_computed)
      .def_ro("num_generated_tokens", &EngineStats::num_generated_tokens)
      .def_ro("num_cached_tokens", &EngineStats::num_cached_tokens)
      .def_ro("num_preemptions", &EngineStats::num_preemptions)
      .def_ro("num_graph_steps", &EngineStats::num_graph_steps)
      .def_ro("num_mtp_graph_runs", &EngineStats::num_mtp_graph_runs)
      .def_ro("num_spec_steps_ahead", &EngineStats::num_spec_steps_ahead)
      .def_ro("num_eplb_replacements", &EngineStats::num_eplb_replacements)
      .def_ro("ep_comm_s", &EngineStats::ep_comm_s)
      .def_ro("ep_comm_bytes", &EngineStats::ep_comm_bytes)
      .def_ro("num_kv_blocks", &EngineStats::num_kv_blocks)
      .def_ro("kv_block_size", &EngineStats::kv_block_size)
      .def_ro("num_speculative_tokens", &EngineStats::num_speculative_tokens)
      .def_ro("spec", &EngineStats::spec);
}

// The engine: construction, add_request, step and abort release the GIL (a step can take
// seconds on the CPU). The Python layer serialises calls with its own lock, so the C++
// engine is only ever entered by one thread at a time.
void bind_engine(nb::module_& m) {
  nb::class_<Engine>(m, "Engine")
      .def(nb::init<const EngineConfig&>(), "config"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("add_request", &Engine::add_request, "prompt"_a, "params"_a, "request_id"_a = "",
           nb::call_guard<nb::gil_scoped_release>())
      .def("step", &Engine::step, nb::call_guard<nb::gil_scoped_release>())
      .def("abort", &Engine::abort, "request_id"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("has_unfinished", &Engine::has_unfinished)
      .def("stats", &Engine::stats, nb::rv_policy::copy)
      .def("vocab_size", &Engine::vocab_size)
      .def("max_model_len", &Engine::max_model_len)
      .def("tokenize", &Engine::tokenize, "prompt"_a)
      .def("decode", &Engine::decode, "token_ids"_a, "skip_special_tokens"_a = true)
      .def("chat_format", &Engine::chat_format)
      .def("prompt_logprobs", &Engine::prompt_logprobs, "prompt"_a,
           nb::call_guard<nb::gil_scoped_release>());
}

// include/deepinfer/eval.h, for deepinfer/eval.py (the same records and scores as the CLI's).
void bind_eval(nb::module_& m) {
  nb::class_<eval::Task>(m, "EvalTask")
      .def_ro("id", &eval::Task::id)
      .def_ro("kind", &eval::Task::kind)
      .def_ro("item_json", &eval::Task::item_json)
      .def_ro("request_json", &eval::Task::request_json)
      .def_ro("prompt", &eval::Task::prompt)
      .def_ro("params", &eval::Task::params);
  nb::class_<eval::SampleOutput>(m, "EvalSampleOutput")
      .def_ro("text", &eval::SampleOutput::text)
      .def_ro("finish_reason", &eval::SampleOutput::finish_reason);
  nb::class_<eval::ScoreOptions>(m, "EvalScoreOptions")
      .def(nb::init<>())
      .def_rw("python", &eval::ScoreOptions::python)
      .def_rw("code_timeout_s", &eval::ScoreOptions::code_timeout_s)
      .def_rw("check_structured_output", &eval::ScoreOptions::check_structured_output)
      .def_rw("structured_checker", &eval::ScoreOptions::structured_checker);
  m.def("eval_read_dataset", &eval::read_dataset, "path"_a, "samples"_a, "defaults"_a);
  m.def("eval_sample_output", &eval::sample_output, "request"_a, "sample"_a);
  m.def("eval_engine_record", &eval::engine_record, "config"_a);
  m.def("eval_raw_record", &eval::raw_record, "task"_a, "sample"_a, "output"_a, "config"_a);
  // Code tests run in subprocesses: the GIL is released while they run.
  m.def("eval_score", &eval::score, "records"_a, "options"_a, nb::call_guard<nb::gil_scoped_release>());
}

}  // namespace
}  // namespace deepinfer

NB_MODULE(_core, m) {
  m.doc() = "deepinfer's C++ engine (use the deepinfer package, not this module)";
  nb::exception<deepinfer::Error>(m, "Error", PyExc_ValueError);
  deepinfer::bind_config(m);
  deepinfer::bind_sampling(m);
  deepinfer::bind_prompt(m);
  deepinfer::bind_outputs(m);
  deepinfer::bind_engine(m);
  deepinfer::bind_eval(m);
  m.attr("__version__") = DEEPINFER_VERSION;
  m.attr("embedded_model_dir") = DEEPINFER_EMBEDDED_MODEL_DIR;
}
