#include "server/server.h"

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <random>
#include <algorithm>
#include <set>
#include <stdexcept>

#include "server/deepseek_format.h"
#include "server/json_body.h"
#include "server/openapi.h"

namespace deepinfer::server {
using nlohmann::json;

namespace {

// An error that becomes an OpenAI-shaped body.
struct ApiError : std::runtime_error {
  int status;
  std::string type;
  std::string param;
  ApiError(int s, std::string message, std::string p = "", std::string t = "")
      : std::runtime_error(std::move(message)), status(s), type(std::move(t)), param(std::move(p)) {}
};

const char* error_type(int status) {
  switch (status) {
    case 400: return "BadRequestError";
    case 401: return "AuthenticationError";
    case 404: return "NotFoundError";
    case 405: return "MethodNotAllowed";
    case 413: return "RequestEntityTooLarge";
    case 503: return "ServiceUnavailableError";
    default: return "InternalServerError";
  }
}

json error_body(int status, const std::string& message, const std::string& param = "") {
  return {{"error",
           {{"message", message},
            {"type", error_type(status)},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", status}}}};
}

HttpResponse json_response(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = dump_json(body);
  return r;
}

HttpResponse error_response(int status, const std::string& message, const std::string& param = "") {
  return json_response(status, error_body(status, message, param));
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// --- typed field access: a wrong type or range is a 400 naming the field ---
bool has(const json& b, const char* k) { return b.contains(k) && !b[k].is_null(); }

double get_number(const json& b, const char* k, double def, double lo, double hi) {
  if (!has(b, k)) return def;
  if (!b[k].is_number()) throw ApiError(400, std::string(k) + ": expected a number", k);
  const double v = b[k].get<double>();
  if (!(v >= lo && v <= hi))
    throw ApiError(400, std::string(k) + ": " + b[k].dump() + " is outside [" + json(lo).dump() + ", " +
                            json(hi).dump() + "]", k);
  return v;
}

int64_t get_int(const json& b, const char* k, int64_t def, int64_t lo, int64_t hi) {
  if (!has(b, k)) return def;
  if (!b[k].is_number_integer()) throw ApiError(400, std::string(k) + ": expected an integer", k);
  if (b[k].is_number_unsigned() && b[k].get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    throw ApiError(400, std::string(k) + ": " + b[k].dump() + " is too large", k);
  const int64_t v = b[k].get<int64_t>();
  if (v < lo || v > hi)
    throw ApiError(400, std::string(k) + ": " + std::to_string(v) + " is outside [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "]", k);
  return v;
}

bool get_bool(const json& b, const char* k, bool def) {
  if (!has(b, k)) return def;
  if (!b[k].is_boolean()) throw ApiError(400, std::string(k) + ": expected true or false", k);
  return b[k].get<bool>();
}

std::string content_text(const json& content, size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw ApiError(400, where + ": expected a string or a list of parts", "messages");
  std::string out;
  for (const json& part : content) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
      throw ApiError(400, where + ": only {\"type\": \"text\", \"text\": ...} parts are supported", "messages");
    out += part["text"].get<std::string>();
  }
  return out;
}

std::vector<int32_t> token_list(const json& a, const char* field, int vocab) {
  std::vector<int32_t> ids;
  for (const json& t : a) {
    if (!t.is_number_integer()) throw ApiError(400, std::string(field) + ": expected token ids (integers)", field);
    const int64_t v = t.get<int64_t>();
    if (v < 0 || v >= vocab)
      throw ApiError(400, std::string(field) + ": token id " + std::to_string(v) + " outside the vocabulary [0, " +
                              std::to_string(vocab) + ")", field);
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

// OpenAI chat messages -> engine messages (tool calls kept as structure: the engine renders them
// in the checkpoint's format).
std::vector<Message> parse_messages(const json& list) {
  std::vector<Message> messages;
  for (size_t i = 0; i < list.size(); ++i) {
    const json& m = list[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw ApiError(400, where + ": expected an object with a string role", "messages");
    Message msg;
    msg.role = m["role"].get<std::string>();
    if (msg.role == "developer") msg.role = "system";
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool")
      throw ApiError(400, where + ".role: '" + msg.role + "' is not one of system, developer, user, assistant, tool",
                     "messages");
    msg.content = content_text(m.contains("content") ? m["content"] : json(nullptr), i);
    msg.content_is_null = msg.role == "assistant" && !has(m, "content");
    if (msg.role == "assistant" && has(m, "tool_calls")) {
      if (!m["tool_calls"].is_array()) throw ApiError(400, where + ".tool_calls: expected a list", "messages");
      msg.tool_calls.emplace();
      for (const json& tc : m["tool_calls"]) {
        if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object() ||
            !tc["function"].contains("name") || !tc["function"]["name"].is_string())
          throw ApiError(400, where + ".tool_calls: expected {function: {name, arguments}}", "messages");
        const json& f = tc["function"];
        const json args = f.contains("arguments") && !f["arguments"].is_null() ? f["arguments"] : json("{}");
        MessageToolCall call;
        call.name = f["name"].get<std::string>();
        call.arguments = args.is_string() ? args.get<std::string>() : dump_json(args);
        if (tc.contains("type") && tc["type"].is_string()) call.type = tc["type"].get<std::string>();
        msg.tool_calls->push_back(std::move(call));
      }
    }
    messages.push_back(std::move(msg));
  }
  return messages;
}

// chat_template_kwargs.thinking (or enable_thinking).
bool thinking_of(const json& body) {
  if (!has(body, "chat_template_kwargs")) return false;
  const json& kw = body["chat_template_kwargs"];
  if (!kw.is_object()) throw ApiError(400, "chat_template_kwargs: expected an object", "chat_template_kwargs");
  return get_bool(kw, "thinking", false) || get_bool(kw, "enable_thinking", false);
}

// The `## Tools` system section (the HF templates have none; vLLM's DeepSeek tool templates and
// the V3.1 model card write one), with the call format of the checkpoint.
std::string tools_section(const json& tools, ToolFormat format) {
  std::string section = "## Tools\nYou have access to the following tools:\n";
  for (const json& t : tools) {
    const json& f = t["function"];
    section += "\n### " + f["name"].get<std::string>() + "\nDescription: " +
               (f.contains("description") && f["description"].is_string() ? f["description"].get<std::string>() : "") +
               "\n\nParameters: " + (f.contains("parameters") ? dump_json(f["parameters"]) : "{}") + "\n";
  }
  if (format == ToolFormat::V31) {
    section += std::string("\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n") +
               std::string(kToolCallsBegin) + std::string(kToolCallBegin) + "tool_call_name" + std::string(kToolSep) +
               "tool_call_arguments" + std::string(kToolCallEnd) + "{{additional_tool_calls}}" +
               std::string(kToolCallsEnd) +
               "\n\nWhere:\n\n- `tool_call_name` must be an exact match to one of the available tools\n"
               "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
               "- For multiple tool calls, chain them directly without separators or spaces\n";
  } else {
    section += std::string("\nCall a tool in this exact format:\n") + std::string(kToolCallsBegin) +
               std::string(kToolCallBegin) + "function" + std::string(kToolSep) + "NAME\n```json\nARGUMENTS\n```" +
               std::string(kToolCallEnd) + std::string(kToolCallsEnd) + "\n";
  }
  return section;
}

const std::set<std::string>& known_fields(bool chat) {
  static const std::set<std::string> common = {
      "model", "max_tokens", "n", "stream", "stream_options", "stop", "seed", "temperature", "top_p", "top_k",
      "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs", "response_format",
      "user", "min_tokens", "ignore_eos", "stop_token_ids", "skip_special_tokens",
      "include_stop_str_in_output", "guided_regex", "guided_json", "guided_grammar", "prompt_logprobs"};
  static const std::set<std::string> chat_fields = [] {
    auto s = common;
    for (const char* k : {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                          "chat_template_kwargs", "parallel_tool_calls"})
      s.insert(k);
    return s;
  }();
  static const std::set<std::string> completion_fields = [] {
    auto s = common;
    for (const char* k : {"prompt", "echo"}) s.insert(k);
    return s;
  }();
  return chat ? chat_fields : completion_fields;
}

std::string random_hex(std::mt19937_64& rng) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng()));
  return buf;
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return diff == 0;
}

json token_bytes(const std::string& s) {
  json a = json::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}

// The alternatives shown for one position, as vLLM lists them: the chosen token first, then the
// most likely ones in order without it, `count` at most. Chat's top_logprobs takes k of them (the
// chosen token in place of the k-th most likely when it is not in the top k), completions'
// logprobs k + 1 (the chosen token besides the top k).
template <typename Value>
std::vector<std::pair<int32_t, Value>> chosen_then_top(int32_t chosen, Value chosen_logprob,
                                                       const std::vector<std::pair<int32_t, Value>>& top,
                                                       int count) {
  std::vector<std::pair<int32_t, Value>> out;
  if (count <= 0) return out;
  out.emplace_back(chosen, chosen_logprob);
  for (const auto& e : top) {
    if (static_cast<int>(out.size()) >= count) break;
    if (e.first != chosen) out.push_back(e);
  }
  return out;
}

}  // namespace

// One HTTP generation request: its prompts (one engine request each, with n samples) and what
// its choices have produced so far. Threads: the engine thread adds and aborts its engine
// requests (engine_ids); its sink (on EngineLoop's output executor, an I/O thread) copies each
// update's deltas to the connection's strand (Reply::run), where everything else of the job lives
// (formatting, counters, the reply).
struct Server::Job : std::enable_shared_from_this<Server::Job> {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
  int n = 1;
  int logprobs = -1;  // -1: none; k: the sampled token and the top k (chosen_then_top)
  int prompt_logprobs = -1;  // vLLM's extra field: -1 none; k: the prompt_logprobs list with the top k
  bool reasoning = false;  // chat: split <think>...</think> into reasoning_content
  bool tools = false;      // chat: parse DeepSeek tool calls out of the output
  ToolFormat tool_format = ToolFormat::V3;  // the checkpoint's (EngineLoop::chat_format())
  std::mt19937_64 rng;     // tool call ids
  bool max_tokens_given = false;
  int max_tokens_cap = 0;  // ServerOptions::max_tokens_cap
  std::string id, model;
  int64_t created = 0;
  double arrival_s = 0;
  std::vector<Prompt> prompts;
  SamplingParams params;
  std::shared_ptr<Reply> reply;
  std::shared_ptr<Metrics> metrics;
  std::shared_ptr<std::atomic<int>> waiting, running;
  std::atomic<int>* in_flight = nullptr;
  EngineLoop* loop = nullptr;
  // Set by the engine thread before it adds the requests; read-only afterwards. Engine::decode
  // is const and the tokenizer thread-safe, so the strand decodes token strings with it.
  const Engine* engine = nullptr;
  std::vector<std::vector<int32_t>> prompt_ids;
  std::vector<std::string> prompt_texts;  // echo
  int prompt_tokens = 0;

  // --- engine thread ---
  std::vector<std::string> engine_ids;
  // --- any thread ---
  std::atomic<bool> cancelled{false};  // the client went away (nothing more is added)
  std::atomic<bool> started{false};    // first token seen
  std::atomic<bool> released{false};
  // --- the connection's strand ---
  struct Choice {
    std::string text;
    json logprobs;  // chat: list of content entries; completions: the four lists
    int num_tokens = 0;
    std::string finish_reason;
    json stop_reason;
    std::unique_ptr<OutputParser> parser;  // when reasoning or tools
    std::string content, reasoning;
    json tool_calls = json::array();
    size_t offset_base = 0;  // echo: text_offset of the first completion token (after the prompt's)
  };
  std::vector<Choice> choices;
  std::vector<bool> finished;
  std::vector<bool> echo_sent;          // streaming echo with logprobs: sent with the first update
  std::vector<json> prompt_lp_json;     // per prompt: vLLM's prompt_logprobs list (null until known)
  std::vector<double> last_token_s;
  int num_finished = 0;
  bool done = false;

  std::string token_text(int32_t id) const { return engine->decode({id}, false); }

  json logprob_entries(const CompletionOutput& c, Choice& ch) const {
    // Returns the new entries (chat: content list; completions: an object of four lists).
    json out = chat ? json::array()
                    : json{{"tokens", json::array()}, {"token_logprobs", json::array()},
                           {"top_logprobs", json::array()}, {"text_offset", json::array()}};
    for (const TokenLogprob& lp : c.logprobs) {
      const std::string tok = token_text(lp.token_id);
      if (chat) {
        json top = json::array();
        for (const auto& [id, value] : chosen_then_top(lp.token_id, lp.logprob, lp.top, logprobs)) {
          const std::string s = token_text(id);
          top.push_back({{"token", s}, {"logprob", value}, {"bytes", token_bytes(s)}});
        }
        out.push_back({{"token", tok}, {"logprob", lp.logprob}, {"bytes", token_bytes(tok)}, {"top_logprobs", top}});
      } else {
        json top = json::object();
        for (const auto& [id, value] : chosen_then_top(lp.token_id, lp.logprob, lp.top, logprobs + 1))
          top[token_text(id)] = value;
        out["tokens"].push_back(tok);
        out["token_logprobs"].push_back(lp.logprob);
        out["top_logprobs"].push_back(top);
        out["text_offset"].push_back(ch.offset_base + ch.text.size());
      }
    }
    return out;
  }

  // Completions with echo and logprobs: the prompt's entries of the legacy logprobs object (the
  // first token has no logprob: null, as OpenAI), text offsets over the token strings. Returns the
  // offset after the prompt.
  json echo_entries(size_t p, const std::vector<PromptLogprob>& plp, size_t& end_offset) const {
    json out = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
                {"text_offset", json::array()}};
    const std::vector<int32_t>& ids = prompt_ids[p];
    size_t offset = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string tok = token_text(ids[i]);
      out["tokens"].push_back(tok);
      out["text_offset"].push_back(offset);
      offset += tok.size();
      if (i == 0 || i - 1 >= plp.size()) {
        out["token_logprobs"].push_back(nullptr);
        out["top_logprobs"].push_back(nullptr);
        continue;
      }
      const PromptLogprob& e = plp[i - 1];
      json top = json::object();
      for (const auto& [id, value] : chosen_then_top(e.token_id, e.logprob, e.top, logprobs + 1))
        top[token_text(id)] = value;
      out["token_logprobs"].push_back(e.logprob);
      out["top_logprobs"].push_back(top);
    }
    end_offset = offset;
    return out;
  }

  // vLLM's prompt_logprobs: [null, {"<id>": {logprob, rank, decoded_token}, ...}, ...] with the
  // prompt token and the top k of each position.
  json prompt_logprobs_json(const std::vector<PromptLogprob>& plp) const {
    json list = json::array({nullptr});
    for (const PromptLogprob& e : plp) {
      json d = json::object();
      d[std::to_string(e.token_id)] = {{"logprob", e.logprob}, {"rank", e.rank}, {"decoded_token", token_text(e.token_id)}};
      for (size_t t = 0; t < e.top.size() && static_cast<int>(t) < prompt_logprobs; ++t) {
        const std::string key = std::to_string(e.top[t].first);
        if (!d.contains(key))
          d[key] = {{"logprob", e.top[t].second}, {"rank", t + 1}, {"decoded_token", token_text(e.top[t].first)}};
      }
      list.push_back(std::move(d));
    }
    return list;
  }

  void append_logprobs(Choice& ch, const json& entries) const {
    if (chat) {
      if (ch.logprobs.is_null()) ch.logprobs = json::array();
      for (const json& e : entries) ch.logprobs.push_back(e);
    } else {
      if (ch.logprobs.is_null())
        ch.logprobs = {{"tokens", json::array()}, {"token_logprobs", json::array()},
                       {"top_logprobs", json::array()}, {"text_offset", json::array()}};
      for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
        for (const json& e : entries[k]) ch.logprobs[k].push_back(e);
    }
  }

  json chunk(json choices_json) const {
    return {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
            {"model", model}, {"choices", std::move(choices_json)}};
  }

  json usage() const {
    int completion = 0;
    for (const Choice& c : choices) completion += c.num_tokens;
    return {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion},
            {"total_tokens", prompt_tokens + completion}};
  }

  void send_event(const json& j) const { reply->write("data: " + dump_json(j) + "\n\n"); }

  // Streaming echo: the prompt's text as the first chunk of each of its choices (with its
  // logprobs entries when asked: then at the first update, which carries the prompt logprobs).
  void send_echo(size_t p, const std::vector<PromptLogprob>* plp) {
    for (size_t j = 0; j < static_cast<size_t>(n); ++j) {
      const size_t k = p * static_cast<size_t>(n) + j;
      json lp = nullptr;
      if (plp != nullptr) {
        lp = echo_entries(p, *plp, choices[k].offset_base);
        append_logprobs(choices[k], lp);
      }
      send_event(chunk(json::array({{{"index", k}, {"text", prompt_texts[p]}, {"logprobs", lp},
                                     {"finish_reason", nullptr}}})));
    }
    echo_sent[p] = true;
  }

  // On the strand, once the engine requests are in.
  void start_stream() {
    if (done) return;
    reply->start_stream(200, "text/event-stream", {});
    if (chat) {
      json cs = json::array();
      for (size_t k = 0; k < choices.size(); ++k)
        cs.push_back({{"index", k}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                      {"finish_reason", nullptr}});
      send_event(chunk(cs));
    }
    if (echo && logprobs < 0)
      for (size_t p = 0; p < prompts.size(); ++p) send_echo(p, nullptr);
  }

  void on_output(size_t p, const RequestOutput& out) {
    try {
      take_output(p, out);
    } catch (const std::exception& e) {  // never leave a client waiting
      fail_all(std::string("formatting the output failed: ") + e.what());
    }
  }

  void take_output(size_t p, const RequestOutput& out) {
    if (done) return;
    const double t = now_s();
    if (!out.error.empty()) {
      fail_all(out.error);
      return;
    }
    if (!out.prompt_logprobs.empty() || out.num_prompt_tokens == 1) {
      if (prompt_logprobs >= 0 && prompt_lp_json[p].is_null()) prompt_lp_json[p] = prompt_logprobs_json(out.prompt_logprobs);
      if (echo && logprobs >= 0 && !echo_sent[p]) {
        if (stream) {
          send_echo(p, &out.prompt_logprobs);
        } else {
          for (size_t j = 0; j < static_cast<size_t>(n); ++j) {
            Choice& ch = choices[p * static_cast<size_t>(n) + j];
            append_logprobs(ch, echo_entries(p, out.prompt_logprobs, ch.offset_base));
          }
          echo_sent[p] = true;
        }
      }
    }
    int new_tokens = 0;
    json stream_choices = json::array();
    for (const CompletionOutput& c : out.outputs) {
      const size_t k = p * static_cast<size_t>(n) + static_cast<size_t>(c.index);
      if (k >= choices.size()) continue;
      Choice& ch = choices[k];
      new_tokens += static_cast<int>(c.delta_token_ids.size());
      json lp = logprobs >= 0 ? logprob_entries(c, ch) : json(nullptr);
      ch.text += c.delta_text;
      ch.num_tokens += static_cast<int>(c.delta_token_ids.size());
      if (logprobs >= 0) append_logprobs(ch, lp);
      const bool finishing = c.finish_reason != FinishReason::None && ch.finish_reason.empty();
      ParsedDelta pd;
      json new_calls = json::array();
      if (ch.parser) {
        pd = ch.parser->feed(ch.text, finishing);
        ch.content += pd.content;
        ch.reasoning += pd.reasoning;
        for (const ToolCall& call : pd.calls) {
          json tc = {{"id", "chatcmpl-tool-" + random_hex(rng)}, {"type", "function"},
                     {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
          new_calls.push_back({{"index", ch.tool_calls.size()}, {"id", tc["id"]}, {"type", "function"},
                               {"function", {{"name", call.name}, {"arguments", ""}}}});
          new_calls.push_back({{"index", ch.tool_calls.size()}, {"function", {{"arguments", call.arguments}}}});
          ch.tool_calls.push_back(std::move(tc));
        }
      } else {
        pd.content = c.delta_text;
        ch.content += c.delta_text;
      }
      if (finishing) {
        ch.finish_reason = to_string(c.finish_reason);
        if (ch.parser && ch.parser->saw_tool_calls() && ch.finish_reason == "stop") ch.finish_reason = "tool_calls";
        // A stop string is reported; a stop token (EOS, stop_token_ids) is not, as OpenAI does.
        const bool is_stop_string =
            std::find(params.stop.begin(), params.stop.end(), c.stop_reason) != params.stop.end();
        if (!c.stop_reason.empty() && is_stop_string) ch.stop_reason = c.stop_reason;
        metrics->request_finished(ch.finish_reason);
      }
      const bool has_delta = chat ? !pd.content.empty() || !pd.reasoning.empty() || !new_calls.empty()
                                  : !c.delta_text.empty();
      if (stream && chat && !new_calls.empty()) {
        // A call as two deltas: its id and name, then its arguments.
        for (json& nc : new_calls)
          send_event(chunk(json::array({{{"index", k}, {"delta", {{"tool_calls", json::array({nc})}}},
                                         {"logprobs", nullptr}, {"finish_reason", nullptr}}})));
      }
      if (stream && (has_delta || finishing || (logprobs >= 0 && !c.delta_token_ids.empty()))) {
        json e = {{"index", k}, {"logprobs", lp}, {"finish_reason", finishing ? json(ch.finish_reason) : json(nullptr)}};
        if (chat) {
          e["delta"] = json::object();
          if (!pd.content.empty()) e["delta"]["content"] = pd.content;
          if (!pd.reasoning.empty()) e["delta"]["reasoning_content"] = pd.reasoning;
          if (!lp.is_null()) e["logprobs"] = {{"content", lp}};
        } else {
          e["text"] = c.delta_text;
          e["stop_reason"] = finishing ? ch.stop_reason : json(nullptr);
        }
        stream_choices.push_back(std::move(e));
      }
    }
    if (new_tokens > 0) {
      metrics->generation_tokens(new_tokens);
      if (!started.exchange(true)) {
        waiting->fetch_sub(1);
        running->fetch_add(1);
        metrics->time_to_first_token(t - arrival_s);
      } else if (last_token_s[p] > 0) {
        const double gap = (t - last_token_s[p]) / std::max(1, new_tokens / std::max(1, n));
        metrics->inter_token_latency(gap);
      }
      last_token_s[p] = t;
    }
    if (stream && !stream_choices.empty()) send_event(chunk(stream_choices));
    if (out.finished && !finished[p]) {
      finished[p] = true;
      ++num_finished;
      metrics->prompt_tokens(out.num_prompt_tokens);
    }
    if (num_finished == static_cast<int>(prompts.size())) complete();
  }

  void complete() {
    done = true;
    metrics->e2e_latency(now_s() - arrival_s);
    release();
    if (stream) {
      if (include_usage) {
        json u = chunk(json::array());
        u["usage"] = usage();
        send_event(u);
      }
      reply->write("data: [DONE]\n\n");
      reply->end();
      return;
    }
    json cs = json::array();
    for (size_t k = 0; k < choices.size(); ++k) {
      Choice& ch = choices[k];
      const size_t p = k / static_cast<size_t>(n);
      std::string text = ch.text;
      if (echo) text = prompt_texts[p] + text;
      if (chat) {
        json message = {{"role", "assistant"},
                        {"content", ch.content.empty() && !ch.tool_calls.empty() ? json(nullptr) : json(ch.content)},
                        {"tool_calls", ch.tool_calls}};
        if (reasoning) message["reasoning_content"] = ch.reasoning;
        cs.push_back({{"index", k},
                      {"message", message},
                      {"logprobs", logprobs >= 0 ? json{{"content", ch.logprobs}} : json(nullptr)},
                      {"finish_reason", ch.finish_reason},
                      {"stop_reason", ch.stop_reason}});
      } else {
        json c = {{"index", k}, {"text", text}, {"logprobs", logprobs >= 0 ? ch.logprobs : json(nullptr)},
                  {"finish_reason", ch.finish_reason}, {"stop_reason", ch.stop_reason}};
        if (prompt_logprobs >= 0) c["prompt_logprobs"] = prompt_lp_json[p];
        cs.push_back(std::move(c));
      }
    }
    json body = {{"id", id}, {"object", chat ? "chat.completion" : "text_completion"}, {"created", created},
                 {"model", model}, {"choices", cs}, {"usage", usage()}};
    if (chat && prompt_logprobs >= 0) body["prompt_logprobs"] = prompt_lp_json[0];
    reply->send(json_response(200, body));
  }

  // Counters back when the job ends, however it ends (once).
  void release() {
    if (released.exchange(true)) return;
    if (started.load()) running->fetch_sub(1);
    else waiting->fetch_sub(1);
    in_flight->fetch_sub(1);
  }

  // Engine thread: ends the job's engine requests still running (a finished one is unknown there).
  void abort_in_engine(Engine& e) {
    for (const std::string& eid : engine_ids) loop->abort(e, eid);
  }

  void fail_all(const std::string& message) {
    if (done) return;
    done = true;
    cancelled = true;
    loop->post([job = shared_from_this()](Engine& e) { job->abort_in_engine(e); });
    metrics->request_finished("error");
    release();
    if (stream) {
      send_event(error_body(500, message));
      reply->write("data: [DONE]\n\n");
      reply->end();
    } else {
      reply->send(error_response(500, message));
    }
  }
};

Server::Server(ServerOptions options, EngineLoop& loop)
    : options_(std::move(options)),
      loop_(loop),
      metrics_(std::make_shared<Metrics>()),
      waiting_(std::make_shared<std::atomic<int>>(0)),
      running_(std::make_shared<std::atomic<int>>(0)) {
  std::random_device rd;
  id_salt_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

Server::~Server() = default;

namespace {
// --allowed-origins: every response and stream of a request carries Access-Control-Allow-Origin
// (a browser reads none of a reply without it, the generation routes' replies included).
class CorsReply final : public Reply {
 public:
  CorsReply(std::shared_ptr<Reply> inner, std::string origin) : inner_(std::move(inner)), origin_(std::move(origin)) {}
  void send(HttpResponse response) override {
    response.headers.emplace_back("Access-Control-Allow-Origin", origin_);
    inner_->send(std::move(response));
  }
  void start_stream(int status, std::string content_type, Headers headers) override {
    headers.emplace_back("Access-Control-Allow-Origin", origin_);
    inner_->start_stream(status, std::move(content_type), std::move(headers));
  }
  void write(std::string data) override { inner_->write(std::move(data)); }
  void end() override { inner_->end(); }
  void run(std::function<void()> f) override { inner_->run(std::move(f)); }
  void on_disconnect(std::function<void()> f) override { inner_->on_disconnect(std::move(f)); }

 private:
  std::shared_ptr<Reply> inner_;
  std::string origin_;
};
}  // namespace

void Server::handle(HttpRequest&& req, std::shared_ptr<Reply> reply) {
  const std::string& path = req.target;
  if (!options_.allowed_origins.empty() && req.method != "OPTIONS")
    reply = std::make_shared<CorsReply>(std::move(reply), options_.allowed_origins);
  try {
    if (req.method == "OPTIONS") {
      HttpResponse r;
      r.status = 204;
      r.content_type = "text/plain";
      if (!options_.allowed_origins.empty()) {
        r.headers = {{"Access-Control-Allow-Origin", options_.allowed_origins},
                     {"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                     {"Access-Control-Allow-Headers", "Authorization, Content-Type"}};
      }
      reply->send(r);
      return;
    }
    const bool open_route = path == "/health" || path == "/metrics" || path == "/version";
    if (!options_.api_key.empty() && !open_route) {
      const std::string auth = req.header("authorization");
      const std::string expected = "Bearer " + options_.api_key;
      if (!constant_time_equal(auth, expected)) {
        HttpResponse r = error_response(401, "missing or wrong API key (Authorization: Bearer KEY)");
        r.headers.emplace_back("WWW-Authenticate", "Bearer");
        reply->send(r);
        return;
      }
    }
    auto want = [&](const char* method) {
      if (req.method != method)
        throw ApiError(405, "method " + req.method + " not allowed on " + path + " (use " + method + ")");
    };
    if (path == "/health") {
      want("GET");
      HttpResponse r;
      r.content_type = "text/plain";
      if (loop_.failed()) {
        r.status = 503;
        r.body = "model failed to load: " + loop_.load_error();
      } else if (!loop_.ready() || draining_) {
        r.status = 503;
        r.body = draining_ ? "shutting down" : "loading";
      }
      reply->send(r);
      return;
    }
    if (path == "/version") {
      want("GET");
      reply->send(json_response(200, {{"version", "0.1.0"}}));
      return;
    }
    if (path == "/metrics") {
      want("GET");
      HttpResponse r;
      r.content_type = "text/plain; version=0.0.4";
      r.body = metrics_->render(loop_.stats(), loop_.times(), running_->load(), waiting_->load());
      reply->send(r);
      return;
    }
    if (path == "/openapi.json") {
      want("GET");
      HttpResponse r;
      r.body = openapi_json(options_.served_model_name);
      reply->send(r);
      return;
    }
    const bool known = path == "/v1/models" || path == "/v1/completions" || path == "/v1/chat/completions" ||
                       path == "/tokenize" || path == "/detokenize";
    if (!known) throw ApiError(404, "no route " + req.method + " " + path);
    if (loop_.failed()) throw ApiError(503, "the model failed to load: " + loop_.load_error());
    if (!loop_.ready()) {
      HttpResponse r = error_response(503, "the model is still loading");
      r.headers.emplace_back("Retry-After", "1");
      reply->send(r);
      return;
    }
    if (path == "/v1/models") {
      want("GET");
      const EngineStats s = loop_.stats();
      (void)s;
      json data = json::array();
      data.push_back({{"id", options_.served_model_name}, {"object", "model"}, {"created", std::time(nullptr)},
                      {"owned_by", "deepinfer"}, {"root", options_.served_model_name}});
      reply->send(json_response(200, {{"object", "list"}, {"data", data}}));
      return;
    }
    want("POST");
    if (path == "/tokenize") return tokenize(req, reply);
    if (path == "/detokenize") return detokenize(req, reply);
    generate(req, reply, path == "/v1/chat/completions");
  } catch (const ApiError& e) {
    HttpResponse r = error_response(e.status, e.what(), e.param);
    if (e.status == 503) r.headers.emplace_back("Retry-After", "1");
    reply->send(r);
  } catch (const std::invalid_argument& e) {
    reply->send(error_response(400, e.what()));
  } catch (const std::exception& e) {
    reply->send(error_response(500, std::string("internal error: ") + e.what()));
  }
}

void Server::generate(const HttpRequest& req, std::shared_ptr<Reply> reply, bool chat) {
  const json body = parse_request_json(req.body, options_.max_request_bytes);
  if (!body.is_object()) throw ApiError(400, "request body: expected a JSON object");
  const char* route = chat ? "/v1/chat/completions" : "/v1/completions";
  for (const auto& [k, v] : body.items())
    if (!known_fields(chat).count(k))
      std::fprintf(stderr, "deepinfer serve: warning: %s: ignoring unknown field '%s'\n", route, k.c_str());
  if (has(body, "model")) {
    if (!body["model"].is_string()) throw ApiError(400, "model: expected a string", "model");
    if (body["model"].get<std::string>() != options_.served_model_name)
      throw ApiError(404, "The model `" + body["model"].get<std::string>() + "` does not exist.", "model");
  }
  auto job = std::make_shared<Job>();
  job->chat = chat;
  job->tool_format = tool_format_of(loop_.chat_format());
  job->model = options_.served_model_name;
  job->created = std::time(nullptr);
  job->arrival_s = now_s();
  std::mt19937_64 rng(id_salt_ ^ (next_id_.fetch_add(1) * 0x9e3779b97f4a7c15ull));
  job->id = std::string(chat ? "chatcmpl-" : "cmpl-") + random_hex(rng);
  const int vocab = 1 << 30;  // token ids are range-checked by the engine
  // Prompts.
  if (chat) {
    if (!has(body, "messages") || !body["messages"].is_array() || body["messages"].empty())
      throw ApiError(400, "messages: expected a non-empty list of messages", "messages");
    std::vector<Message> messages = parse_messages(body["messages"]);
    job->prompts.push_back(Prompt::from_messages(std::move(messages)));
  } else {
    if (!has(body, "prompt")) throw ApiError(400, "prompt: required", "prompt");
    const json& p = body["prompt"];
    if (p.is_string()) {
      job->prompts.push_back(Prompt::from_text(p.get<std::string>()));
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      job->prompts.push_back(Prompt::from_tokens(token_list(p, "prompt", vocab)));
    } else if (p.is_array() && !p.empty()) {
      for (const json& e : p) {
        if (e.is_string()) job->prompts.push_back(Prompt::from_text(e.get<std::string>()));
        else if (e.is_array() && !e.empty()) job->prompts.push_back(Prompt::from_tokens(token_list(e, "prompt", vocab)));
        else throw ApiError(400, "prompt: expected a string, a list of strings, token ids or lists of token ids", "prompt");
      }
    } else {
      throw ApiError(400, "prompt: expected a non-empty string, list of strings, token ids or lists of token ids",
                     "prompt");
    }
    if (job->prompts.size() > 1024) throw ApiError(400, "prompt: more than 1024 prompts", "prompt");
    job->echo = get_bool(body, "echo", false);
  }
  // Sampling.
  SamplingParams& sp = job->params;
  job->stream = get_bool(body, "stream", false);
  if (has(body, "stream_options")) {
    if (!body["stream_options"].is_object()) throw ApiError(400, "stream_options: expected an object", "stream_options");
    if (!job->stream) throw ApiError(400, "stream_options: only allowed when stream is true", "stream_options");
    job->include_usage = get_bool(body["stream_options"], "include_usage", false);
  }
  job->n = static_cast<int>(get_int(body, "n", 1, 1, 128));
  sp.n = job->n;
  const SamplingParams& def = options_.defaults;  // generation_config.json's where it has them
  sp.temperature = static_cast<float>(get_number(body, "temperature", def.temperature, 0.0, 2.0));
  sp.top_p = static_cast<float>(get_number(body, "top_p", def.top_p, 1e-9, 1.0));
  sp.top_k = static_cast<int>(get_int(body, "top_k", def.top_k, -1, 1 << 30));
  if (sp.top_k < 0) sp.top_k = 0;
  sp.min_p = static_cast<float>(get_number(body, "min_p", def.min_p, 0.0, 1.0));
  sp.presence_penalty = static_cast<float>(get_number(body, "presence_penalty", 0.0, -2.0, 2.0));
  sp.frequency_penalty = static_cast<float>(get_number(body, "frequency_penalty", 0.0, -2.0, 2.0));
  sp.repetition_penalty = static_cast<float>(get_number(body, "repetition_penalty", def.repetition_penalty, 1e-6, 1e6));
  sp.min_tokens = static_cast<int>(get_int(body, "min_tokens", 0, 0, 1 << 30));
  sp.ignore_eos = get_bool(body, "ignore_eos", false);
  sp.skip_special_tokens = get_bool(body, "skip_special_tokens", true);
  sp.include_stop_str_in_output = get_bool(body, "include_stop_str_in_output", false);
  if (has(body, "seed")) sp.seed = static_cast<uint64_t>(get_int(body, "seed", 0, INT64_MIN, INT64_MAX));
  if (has(body, "stop")) {
    const json& s = body["stop"];
    if (s.is_string()) {
      sp.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const json& e : s) {
        if (!e.is_string()) throw ApiError(400, "stop: expected a string or a list of strings", "stop");
        sp.stop.push_back(e.get<std::string>());
      }
    } else {
      throw ApiError(400, "stop: expected a string or a list of strings", "stop");
    }
    for (const std::string& e : sp.stop)
      if (e.empty()) throw ApiError(400, "stop: empty stop string", "stop");
  }
  if (has(body, "stop_token_ids")) {
    if (!body["stop_token_ids"].is_array()) throw ApiError(400, "stop_token_ids: expected a list", "stop_token_ids");
    sp.stop_token_ids = token_list(body["stop_token_ids"], "stop_token_ids", vocab);
  }
  const int64_t max_logprobs = options_.max_logprobs;
  if (chat) {
    const bool lp = get_bool(body, "logprobs", false);
    const int64_t top = get_int(body, "top_logprobs", 0, 0, max_logprobs);
    if (has(body, "top_logprobs") && !lp)
      throw ApiError(400, "top_logprobs: needs logprobs set to true", "top_logprobs");
    if (lp) job->logprobs = static_cast<int>(top);
  } else if (has(body, "logprobs")) {
    job->logprobs = static_cast<int>(get_int(body, "logprobs", 0, 0, max_logprobs));
  }
  sp.logprobs = job->logprobs;
  sp.delta_outputs = true;  // the job keeps its own text; updates carry what they add
  // vLLM's prompt_logprobs extra field, and the legacy echo + logprobs (the prompt's tokens first).
  job->prompt_logprobs = static_cast<int>(get_int(body, "prompt_logprobs", -1, 0, max_logprobs));
  if (job->prompt_logprobs >= 0 && job->stream)
    throw ApiError(400, "prompt_logprobs: not available when stream is true", "prompt_logprobs");
  sp.prompt_logprobs = std::max(job->prompt_logprobs, job->echo ? job->logprobs : -1);
  int64_t max_tokens = -1;
  if (has(body, "max_completion_tokens")) max_tokens = get_int(body, "max_completion_tokens", 0, 1, 1 << 30);
  else if (has(body, "max_tokens")) max_tokens = get_int(body, "max_tokens", 0, 1, 1 << 30);
  if (has(body, "response_format")) {
    const json& rf = body["response_format"];
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
      throw ApiError(400, "response_format: expected an object with a type", "response_format");
    const std::string type = rf["type"].get<std::string>();
    if (type == "json_object") {
      sp.so_args = {"json_object", "", false};
    } else if (type == "json_schema") {
      if (!rf.contains("json_schema") || !rf["json_schema"].is_object() || !rf["json_schema"].contains("schema"))
        throw ApiError(400, "response_format.json_schema.schema: required", "response_format");
      const json& schema = rf["json_schema"]["schema"];
      if (!schema.is_object() && !schema.is_boolean())
        throw ApiError(400, "response_format.json_schema.schema: expected a JSON Schema object", "response_format");
      sp.so_args = {"json_schema", schema.dump(), false};
    } else if (type != "text") {
      throw ApiError(400, "response_format.type: expected text, json_object or json_schema, got '" + type + "'",
                     "response_format");
    }
  }
  if (chat && has(body, "tools")) {
    const json& tools = body["tools"];
    if (!tools.is_array()) throw ApiError(400, "tools: expected a list", "tools");
    std::vector<std::string> names;
    for (const json& t : tools) {
      if (!t.is_object() || t.value("type", "function") != "function" || !t.contains("function") ||
          !t["function"].is_object() || !t["function"].contains("name") || !t["function"]["name"].is_string())
        throw ApiError(400, "tools: expected [{\"type\": \"function\", \"function\": {\"name\", ...}}]", "tools");
      names.push_back(t["function"]["name"].get<std::string>());
    }
    const json tc = has(body, "tool_choice") ? body["tool_choice"] : json(tools.empty() ? "none" : "auto");
    std::string forced;  // "required" or a function's name
    if (tc.is_string()) {
      const std::string c = tc.get<std::string>();
      if (c != "none" && c != "auto" && c != "required")
        throw ApiError(400, "tool_choice: expected none, auto, required or {\"type\": \"function\", ...}", "tool_choice");
      if (c == "required") forced = c;
      job->tools = c != "none" && !tools.empty();
    } else if (tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
               tc["function"].contains("name") && tc["function"]["name"].is_string()) {
      forced = tc["function"]["name"].get<std::string>();
      if (std::find(names.begin(), names.end(), forced) == names.end())
        throw ApiError(400, "tool_choice: function '" + forced + "' is not in tools", "tool_choice");
      job->tools = true;
    } else {
      throw ApiError(400, "tool_choice: expected none, auto, required or {\"type\": \"function\", ...}", "tool_choice");
    }
    if (job->tools) {
      const std::string section = tools_section(tools, job->tool_format);
      auto& msgs = job->prompts[0].messages;
      msgs.insert(msgs.begin(), Message{"system", section});
      if (!forced.empty()) {
        if (has(body, "response_format") && sp.so_args.kind != "")
          throw ApiError(400, "tool_choice: a forced tool call cannot be combined with response_format", "tool_choice");
        // The call list by the grammar engine: the checkpoint's markers around each call, the
        // arguments following the function's parameters schema (grammar/tool_calls.cpp).
        const bool v31 = job->tool_format == ToolFormat::V31;
        json calls = json::array();
        for (const json& t : tools) {
          const json& f = t["function"];
          const std::string name = f["name"].get<std::string>();
          if (forced != "required" && name != forced) continue;
          calls.push_back({{"prefix", std::string(kToolCallBegin) + (v31 ? name + std::string(kToolSep)
                                                                          : "function" + std::string(kToolSep) + name +
                                                                                "\n```json\n")},
                           {"schema", f.contains("parameters") && !f["parameters"].is_null() ? f["parameters"]
                                                                                            : json{{"type", "object"}}},
                           {"suffix", std::string(v31 ? "" : "\n```") + std::string(kToolCallEnd)}});
        }
        const bool parallel = get_bool(body, "parallel_tool_calls", true);
        const json source = {{"begin", std::string(kToolCallsBegin)}, {"end", std::string(kToolCallsEnd)},
                             {"separator", v31 ? "" : "\n"}, {"min_calls", 1},
                             {"max_calls", forced == "required" && parallel ? -1 : 1}, {"calls", calls}};
        sp.so_args = {"tool_calls", dump_json(source), false};
      }
    }
  }
  if (chat) {
    const bool thinking = thinking_of(body);
    job->prompts[0].thinking = thinking;
    job->reasoning = options_.reasoning_parser == "deepseek_r1" || (options_.reasoning_parser == "deepseek_v3" && thinking);
  }
  // vLLM's guided_* extras (structured outputs by regex, JSON Schema or grammar).
  for (const auto& [field, kind] : {std::pair<const char*, const char*>{"guided_regex", "regex"},
                                    {"guided_json", "json_schema"}, {"guided_grammar", "ebnf"}}) {
    if (!has(body, field)) continue;
    const json& v = body[field];
    if (kind == std::string("json_schema") && v.is_object()) sp.so_args = {kind, v.dump(), false};
    else if (v.is_string()) sp.so_args = {kind, v.get<std::string>(), false};
    else throw ApiError(400, std::string(field) + ": expected a string", field);
  }
  job->max_tokens_given = max_tokens > 0;
  job->max_tokens_cap = options_.max_tokens_cap;
  job->rng.seed(rng());
  // Admission.
  if (draining_) throw ApiError(503, "the server is shutting down");
  if (options_.max_queued_requests > 0 && waiting_->load() >= options_.max_queued_requests)
    throw ApiError(503, "too many requests waiting (--max-queued-requests " +
                            std::to_string(options_.max_queued_requests) + "); retry later");
  const size_t num_choices = job->prompts.size() * static_cast<size_t>(job->n);
  job->choices.resize(num_choices);
  if (job->chat && (job->reasoning || job->tools))
    for (auto& ch : job->choices) ch.parser = std::make_unique<OutputParser>(job->reasoning, job->tools, job->tool_format);
  job->finished.assign(job->prompts.size(), false);
  job->echo_sent.assign(job->prompts.size(), false);
  job->prompt_lp_json.assign(job->prompts.size(), json(nullptr));
  job->last_token_s.assign(job->prompts.size(), 0.0);
  job->reply = reply;
  job->metrics = metrics_;
  job->waiting = waiting_;
  job->running = running_;
  job->in_flight = &in_flight_;
  job->loop = &loop_;
  waiting_->fetch_add(1);
  in_flight_.fetch_add(1);
  EngineLoop* loop = &loop_;
  // On the strand: the job ends here; its engine requests end before the engine's next step.
  reply->on_disconnect([loop, job] {
    if (job->done) return;
    job->done = true;
    job->cancelled = true;
    loop->post([job](Engine& engine) { job->abort_in_engine(engine); });
    job->metrics->request_finished("abort");
    job->release();
  });
  const int64_t requested_max = max_tokens;
  loop_.post([loop, job, requested_max](Engine& engine) {
    if (job->cancelled) return;  // the client went away first
    job->engine = &engine;
    job->metrics->queue_time(now_s() - job->arrival_s);
    const int max_len = engine.max_model_len();
    std::vector<std::vector<int32_t>> ids(job->prompts.size());
    std::vector<SamplingParams> params(job->prompts.size(), job->params);
    try {
      for (size_t p = 0; p < job->prompts.size(); ++p) {
        ids[p] = engine.tokenize(job->prompts[p]);
        const int64_t n_prompt = static_cast<int64_t>(ids[p].size());
        if (n_prompt >= max_len)
          throw ApiError(400, "This model's maximum context length is " + std::to_string(max_len) +
                                  " tokens. However, your prompt has " + std::to_string(n_prompt) + " tokens.",
                         job->chat ? "messages" : "prompt");
        int64_t mt = requested_max;
        if (mt > 0 && n_prompt + mt > max_len)
          throw ApiError(400, "This model's maximum context length is " + std::to_string(max_len) +
                                  " tokens. However, you requested " + std::to_string(n_prompt + mt) + " tokens (" +
                                  std::to_string(n_prompt) + " in the messages, " + std::to_string(mt) +
                                  " in the completion). Please reduce the length of the messages or completion.",
                         "max_tokens");
        if (mt <= 0) mt = job->chat ? max_len - n_prompt : std::min<int64_t>(16, max_len - n_prompt);
        if (job->max_tokens_cap > 0) mt = std::min<int64_t>(mt, job->max_tokens_cap);  // generation_config.json
        params[p].max_tokens = static_cast<int>(mt);
        job->prompt_tokens += static_cast<int>(n_prompt);
        if (job->echo)
          job->prompt_texts.push_back(job->prompts[p].token_ids.empty() ? job->prompts[p].text
                                                                        : engine.decode(ids[p], false));
      }
      job->prompt_ids = ids;
      for (size_t p = 0; p < job->prompts.size(); ++p) {
        const std::string eid = job->id + "-" + std::to_string(p);
        try {
          // The update (deltas only: SamplingParams::delta_outputs) goes to the connection's
          // strand, where the chunk is built and written.
          loop->add(engine, Prompt::from_tokens(ids[p]), params[p], eid, [job, p](RequestOutput&& out) {
            job->reply->run([job, p, d = std::move(out)] { job->on_output(p, d); });
          });
        } catch (const std::exception& e) {
          for (const std::string& prev : job->engine_ids) loop->abort(engine, prev);
          job->engine_ids.clear();
          throw ApiError(400, e.what());
        }
        job->engine_ids.push_back(eid);
      }
    } catch (const ApiError& e) {
      job->reply->run([job, status = e.status, message = std::string(e.what()), param = e.param] {
        if (job->done) return;
        job->done = true;
        job->release();
        job->reply->send(error_response(status, message, param));
      });
      return;
    } catch (const std::exception& e) {
      job->reply->run([job, message = std::string(e.what())] {
        if (job->done) return;
        job->done = true;
        job->release();
        job->reply->send(error_response(400, message));
      });
      return;
    }
    if (job->stream) job->reply->run([job] { job->start_stream(); });
  });
}

void Server::tokenize(const HttpRequest& req, std::shared_ptr<Reply> reply) {
  const json body = parse_request_json(req.body, options_.max_request_bytes);
  if (!body.is_object()) throw ApiError(400, "request body: expected a JSON object");
  if (has(body, "model") && (!body["model"].is_string() || body["model"].get<std::string>() != options_.served_model_name))
    throw ApiError(404, "The model `" + body["model"].dump() + "` does not exist.", "model");
  Prompt prompt;
  if (has(body, "messages")) {
    if (!body["messages"].is_array() || body["messages"].empty())
      throw ApiError(400, "messages: expected a non-empty list", "messages");
    prompt.messages = parse_messages(body["messages"]);
    prompt.thinking = thinking_of(body);
    // As a chat request renders them: a tools list adds the `## Tools` system section.
    if (has(body, "tools") && body["tools"].is_array() && !body["tools"].empty() &&
        !(has(body, "tool_choice") && body["tool_choice"] == "none")) {
      for (const json& t : body["tools"])
        if (!t.is_object() || !t.contains("function") || !t["function"].is_object() ||
            !t["function"].contains("name") || !t["function"]["name"].is_string())
          throw ApiError(400, "tools: expected [{\"type\": \"function\", \"function\": {\"name\", ...}}]", "tools");
      prompt.messages.insert(prompt.messages.begin(),
                             Message{"system", tools_section(body["tools"], tool_format_of(loop_.chat_format()))});
    }
  } else if (has(body, "prompt") && body["prompt"].is_string()) {
    prompt.text = body["prompt"].get<std::string>();
  } else {
    throw ApiError(400, "prompt: expected a string (or messages: a list)", "prompt");
  }
  const std::string name = options_.served_model_name;
  loop_.post([reply, prompt, name](Engine& engine) {
    try {
      const std::vector<int32_t> ids = engine.tokenize(prompt);
      reply->send(json_response(200, {{"count", ids.size()}, {"max_model_len", engine.max_model_len()},
                                      {"tokens", ids}}));
    } catch (const std::exception& e) {
      reply->send(error_response(400, e.what()));
    }
  });
}

void Server::detokenize(const HttpRequest& req, std::shared_ptr<Reply> reply) {
  const json body = parse_request_json(req.body, options_.max_request_bytes);
  if (!body.is_object() || !has(body, "tokens") || !body["tokens"].is_array())
    throw ApiError(400, "tokens: expected a list of token ids", "tokens");
  if (has(body, "model") && (!body["model"].is_string() || body["model"].get<std::string>() != options_.served_model_name))
    throw ApiError(404, "The model `" + body["model"].dump() + "` does not exist.", "model");
  const json tokens = body["tokens"];
  loop_.post([reply, tokens](Engine& engine) {
    try {
      const std::vector<int32_t> ids = token_list(tokens, "tokens", engine.vocab_size());
      reply->send(json_response(200, {{"prompt", engine.decode(ids, false)}}));
    } catch (const ApiError& e) {
      reply->send(error_response(e.status, e.what(), e.param));
    }
  });
}

}  // namespace deepinfer::server
