// The OpenAI-compatible routes of `deepinfer serve` over the HTTP transport and the engine loop:
// /v1/completions, /v1/chat/completions (SSE when streaming), /v1/models, /health, /metrics,
// /tokenize, /detokenize, /version, /openapi.json. Request fields follow vLLM's server.
#pragma once
#include <atomic>
#include <memory>
#include <string>

#include "server/engine_loop.h"
#include "server/http.h"
#include "server/metrics.h"

namespace deepinfer::server {

struct ServerOptions {
  std::string served_model_name;
  std::string api_key;             // non-empty: Bearer token required (not on /health, /metrics, /version)
  int max_queued_requests = 0;     // > 0: requests waiting for their first token past this get 503
  size_t max_request_bytes = 1 << 20;
  int max_logprobs = 20;
  std::string allowed_origins;     // CORS: "*" or one origin; empty: no CORS headers
  // "" (none), "deepseek_r1" (text before </think> is reasoning_content), "deepseek_v3" (the same
  // when the request's chat_template_kwargs.thinking is true).
  std::string reasoning_parser;
  // The sampling fields' defaults where a request gives none (serve --generation-config: the
  // model's generation_config.json, as vLLM's --generation-config auto): temperature, top_p,
  // top_k, min_p, repetition_penalty (its max_tokens is not used).
  SamplingParams defaults;
  int max_tokens_cap = 0;  // > 0: every request's max_tokens at most this (max_new_tokens there, as vLLM)
};

class Server {
 public:
  Server(ServerOptions options, EngineLoop& loop);
  ~Server();
  void handle(HttpRequest&& request, std::shared_ptr<Reply> reply);
  // Stops taking generation requests (503) and /health turns 503; in-flight ones go on.
  void start_draining() { draining_ = true; }
  int num_in_flight() const { return in_flight_.load(); }

  struct Job;

 private:
  void generate(const HttpRequest& request, std::shared_ptr<Reply> reply, bool chat);
  void tokenize(const HttpRequest& request, std::shared_ptr<Reply> reply);
  void detokenize(const HttpRequest& request, std::shared_ptr<Reply> reply);

  ServerOptions options_;
  EngineLoop& loop_;
  std::shared_ptr<Metrics> metrics_;
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
  std::shared_ptr<std::atomic<int>> waiting_;   // jobs before their first token
  std::shared_ptr<std::atomic<int>> running_;   // jobs after it, until finished
  std::atomic<uint64_t> next_id_{0};
  uint64_t id_salt_ = 0;
};

}  // namespace deepinfer::server
