// HTTP/1.1 transport of `deepinfer serve` (Boost.Beast, only in http.cpp): keep-alive
// connections, whole or chunked (SSE) responses written from any thread, and a callback
// when the client goes away before its reply ended (a pending read sees the disconnect).
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deepinfer::server {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path, query string stripped
  Headers headers;     // names lower-cased
  std::string body;
  std::string header(std::string_view lower_name) const;  // "" when absent
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  Headers headers;
};

// The reply channel of one request. Thread-safe; after the client went away every call is a
// no-op. Either send() once, or start_stream(), write()..., end().
class Reply {
 public:
  virtual ~Reply() = default;
  virtual void send(HttpResponse response) = 0;
  virtual void start_stream(int status, std::string content_type, Headers headers) = 0;
  virtual void write(std::string data) = 0;  // one chunk of the chunked body
  virtual void end() = 0;
  // Runs `f` on the connection's I/O strand, after every write issued before it (so the work of
  // formatting a reply stays off the caller's thread: the engine thread only hands over data).
  // `f` runs even when the client is gone (its writes are then no-ops).
  virtual void run(std::function<void()> f) = 0;
  // `f` runs once (on an I/O thread) if the client disconnects before the reply ended; set it
  // before the reply can end. Runs at once if the client is already gone.
  virtual void on_disconnect(std::function<void()> f) = 0;
};

using Handler = std::function<void(HttpRequest&& request, std::shared_ptr<Reply> reply)>;

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                 // 0: any free port (see HttpServer::port)
  // I/O threads (HTTP parsing, the replies' JSON and writes). 0: a quarter of the cores, 1 to 4
  // (on the H200 host, 256 streams with one thread took TTFT p50 to 1.0 s against 0.34 s with 4).
  int num_threads = 0;
  size_t max_body_bytes = 1 << 20; // larger bodies get 413
  int idle_timeout_s = 60;         // keep-alive connections idle this long are closed
};

class HttpServer {
 public:
  // Binds and listens (throws Error when the address cannot be bound); serves after start().
  HttpServer(const HttpOptions& options, Handler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;       // the bound port
  void start();           // runs the I/O threads
  void stop_accepting();  // closes the listening socket; open connections go on
  void stop();            // closes every connection and joins the I/O threads
  // Runs `f` on an I/O thread; calls run in the order they were made, one at a time (a strand
  // of the server's own). Any thread. Nothing runs once stop() began.
  void post_serial(std::function<void()> f);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace deepinfer::server
