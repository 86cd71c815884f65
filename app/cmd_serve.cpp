// deepinfer serve: the OpenAI-compatible HTTP server (server/).
//   deepinfer serve [--model DIR] [--host 127.0.0.1] [--port 8000] [--api-key KEY] ...
// Listens at once (GET /health answers 503 until the model is loaded). SIGTERM or SIGINT:
// stop accepting, let in-flight requests finish (up to --drain-timeout), exit 0.
#include <CLI/CLI.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>

#include "app/commands.h"
#include "app/engine_flags.h"
#include "core/error.h"

#ifdef DEEPINFER_HAVE_SERVER
#include <pthread.h>

#include "server/engine_loop.h"
#include "server/http.h"
#include "server/server.h"
#endif

namespace deepinfer::app {

#ifndef DEEPINFER_HAVE_SERVER
int cmd_serve(int, char**) {
  std::fprintf(stderr, "deepinfer serve: this build has no server (configure with libboost1.81-dev and "
                       "prometheus-cpp-dev installed: tools/setup.sh)\n");
  return 2;
}
#else
int cmd_serve(int argc, char** argv) {
  CLI::App app{"deepinfer serve: OpenAI-compatible server (/v1/completions, /v1/chat/completions, /v1/models, "
               "/health, /metrics, /tokenize, /detokenize, /version, /openapi.json)"};
  EngineConfig config;
  ModelFlags model;
  add_engine_flags(app, config, model);
  server::HttpOptions http;
  server::ServerOptions opts;
  int drain_timeout_s = 30;
  std::string step_log, generation_config = "auto";
  app.add_option("--host", http.host, "address to listen on");
  app.add_option("--port", http.port, "port (0 = any free port; the chosen one is printed)");
  app.add_option("--served-model-name", opts.served_model_name, "model name clients send (default: the model directory's name)");
  app.add_option("--api-key", opts.api_key, "require Authorization: Bearer KEY (not on /health, /metrics, /version)");
  app.add_option("--max-queued-requests", opts.max_queued_requests,
                 "requests waiting for their first token past this get 503 + Retry-After (0 = no limit)");
  app.add_option("--max-request-bytes", http.max_body_bytes, "larger request bodies get 413");
  app.add_option("--max-logprobs", opts.max_logprobs, "largest logprobs / top_logprobs accepted");
  app.add_option("--allowed-origins", opts.allowed_origins, "CORS Access-Control-Allow-Origin value (e.g. *)");
  app.add_option("--reasoning-parser", opts.reasoning_parser,
                 "deepseek_r1: text before </think> is reasoning_content; deepseek_v3: the same when "
                 "chat_template_kwargs.thinking is true")
      ->check(CLI::IsMember({"", "deepseek_r1", "deepseek_v3"}));
  app.add_option("--http-threads", http.num_threads, "I/O threads (0 = a quarter of the cores, 1 to 4)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--drain-timeout", drain_timeout_s, "seconds to let in-flight requests finish on SIGTERM");
  app.add_option("--step-log", step_log,
                 "write one line per engine step to this file (timing, batch, prompt tokens, queue; "
                 "bench/serve_vs_bench.sh)");
  app.add_option("--generation-config", generation_config,
                 "sampling defaults for requests that give none: auto (the model's generation_config.json: "
                 "temperature, top_p, top_k, min_p, repetition_penalty; max_new_tokens caps max_tokens), none, "
                 "or a directory");
  CLI11_PARSE(app, argc, argv);
  apply_model_flags(model, DEEPINFER_DEFAULT_MODEL_DIR, config);
  opts.defaults.max_tokens = SamplingParams::kMaxTokens;  // stays so unless the file has max_new_tokens
  const std::string applied =
      apply_generation_config(generation_config, config.model_dir, [](const char*) { return false; }, opts.defaults);
  if (opts.defaults.max_tokens != SamplingParams::kMaxTokens) opts.max_tokens_cap = opts.defaults.max_tokens;
  if (!applied.empty())
    std::fprintf(stderr, "deepinfer serve: request defaults from %s (request fields override; --generation-config "
                         "none: off)\n", applied.c_str());
  opts.max_request_bytes = http.max_body_bytes;
  if (opts.served_model_name.empty()) {
    std::string dir = config.model_dir;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    const size_t slash = dir.rfind('/');
    opts.served_model_name = slash == std::string::npos ? dir : dir.substr(slash + 1);
  }
  DI_CHECK(http.max_body_bytes > 0, "--max-request-bytes: must be > 0");
  DI_CHECK(opts.max_queued_requests >= 0, "--max-queued-requests: must be >= 0");

  // Signals go to this thread only (sigwait below); every thread started after inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  if (process_rank() != 0) {  // several processes: rank 0 serves, the others run its steps
    Engine follower(config);
    follower.follow();
    return kExitOk;
  }
  server::EngineLoop loop(config, step_log);
  server::Server srv(opts, loop);
  std::unique_ptr<server::HttpServer> listener;
  try {
    listener = std::make_unique<server::HttpServer>(
        http, [&srv](server::HttpRequest&& r, std::shared_ptr<server::Reply> reply) { srv.handle(std::move(r), reply); });
  } catch (const std::exception& e) {
    fail(e.what());
  }
  // Step outputs go to the replies from an I/O thread: the engine thread only moves them.
  loop.set_output_executor([l = listener.get()](std::function<void()> f) { l->post_serial(std::move(f)); });
  listener->start();
  std::fprintf(stderr, "deepinfer serve: listening on http://%s:%d (model %s as '%s')\n", http.host.c_str(),
               listener->port(), config.model_dir.c_str(), opts.served_model_name.c_str());
  std::fflush(stderr);
  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "deepinfer serve: %s: draining %d in-flight requests (up to %d s)\n",
               sig == SIGTERM ? "SIGTERM" : "SIGINT", srv.num_in_flight(), drain_timeout_s);
  srv.start_draining();
  listener->stop_accepting();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(drain_timeout_s);
  while (srv.num_in_flight() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int left = srv.num_in_flight();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the last replies' bytes
  listener->stop();
  loop.stop();
  if (left > 0) std::fprintf(stderr, "deepinfer serve: %d requests still running at the drain timeout\n", left);
  std::fprintf(stderr, "deepinfer serve: stopped\n");
  return 0;
}
#endif

}  // namespace deepinfer::app
