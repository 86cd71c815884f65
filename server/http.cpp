// Boost.Beast HTTP/1.1 server: one strand per connection; requests parsed by Beast with a body
// limit, responses serialized here (whole bodies with Content-Length, streams chunked) so that
// a Reply can be written from the engine thread by posting onto the connection's strand.
#include "server/http.h"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

namespace deepinfer::server {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::string HttpRequest::header(std::string_view lower_name) const {
  for (const auto& [k, v] : headers)
    if (k == lower_name) return v;
  return "";
}

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string status_line(int status) {
  const auto reason = http::obsolete_reason(static_cast<http::status>(status));
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason.data(), reason.size()) + "\r\n";
}

std::string header_block(const Headers& headers) {
  std::string out;
  for (const auto& [k, v] : headers) out += k + ": " + v + "\r\n";
  return out;
}

std::string chunk(std::string_view data) {
  char size[20];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  std::string out = size;
  out.append(data).append("\r\n");
  return out;
}

class Session;

class ReplyImpl final : public Reply {
 public:
  explicit ReplyImpl(std::shared_ptr<Session> session) : session_(std::move(session)) {}
  void send(HttpResponse response) override;
  void start_stream(int status, std::string content_type, Headers headers) override;
  void write(std::string data) override;
  void end() override;
  void run(std::function<void()> f) override;
  void on_disconnect(std::function<void()> f) override;

 private:
  std::shared_ptr<Session> session_;
};

}  // namespace

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  HttpOptions options;
  Handler handler;
  asio::io_context ioc;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  tcp::acceptor acceptor{ioc};
  asio::strand<asio::io_context::executor_type> serial{asio::make_strand(ioc)};  // post_serial
  std::vector<std::thread> threads;
  std::mutex sessions_mu;
  std::vector<std::weak_ptr<Session>> sessions;

  void accept();
};

namespace {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<HttpServer::Impl> server)
      : stream_(std::move(socket)), server_(std::move(server)) {}

  void start() { asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read(); }); }

  void close() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] { self->shut_down(); });
  }

  // --- called through ReplyImpl, from any thread ---
  void post_data(std::string data, bool last) {
    asio::post(stream_.get_executor(), [self = shared_from_this(), d = std::move(data), last]() mutable {
      if (self->closed_) return;
      self->out_.push_back(std::move(d));
      if (last) self->reply_ending_ = true;
      self->flush();
    });
  }
  void run_task(std::function<void()> f) {
    asio::post(stream_.get_executor(), [self = shared_from_this(), f = std::move(f)] { f(); });
  }
  void set_disconnect(std::function<void()> f) {
    asio::post(stream_.get_executor(), [self = shared_from_this(), f = std::move(f)]() mutable {
      if (self->closed_ || self->client_gone_) {
        if (f) f();
        return;
      }
      self->on_disconnect_ = std::move(f);
    });
  }
  bool keep_alive() const { return keep_alive_; }

 private:
  void read() {
    parser_.emplace();
    parser_->body_limit(server_->options.max_body_bytes);
    parser_->header_limit(64 * 1024);
    stream_.expires_after(std::chrono::seconds(server_->options.idle_timeout_s));
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (closed_) return;
    if (ec == http::error::body_limit) {
      keep_alive_ = false;
      respond_now(413, "{\"error\":{\"message\":\"request body is over the server's --max-request-bytes (" +
                           std::to_string(server_->options.max_body_bytes) +
                           " bytes)\",\"type\":\"BadRequestError\",\"param\":null,\"code\":413}}");
      return;
    }
    if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == asio::error::eof ||
        ec == asio::error::connection_reset || ec == asio::error::operation_aborted) {
      shut_down();
      return;
    }
    if (ec) {
      keep_alive_ = false;
      respond_now(400, "{\"error\":{\"message\":\"malformed HTTP request: " + ec.message() +
                           "\",\"type\":\"BadRequestError\",\"param\":null,\"code\":400}}");
      return;
    }
    stream_.expires_never();
    auto msg = parser_->release();
    keep_alive_ = msg.keep_alive();
    HttpRequest req;
    req.method = std::string(msg.method_string());
    std::string target(msg.target());
    if (auto q = target.find('?'); q != std::string::npos) target.resize(q);
    req.target = std::move(target);
    for (const auto& f : msg) req.headers.emplace_back(lower(f.name_string()), std::string(f.value()));
    req.body = std::move(msg.body());
    reply_ending_ = false;
    watch_disconnect();
    auto reply = std::make_shared<ReplyImpl>(shared_from_this());
    try {
      server_->handler(std::move(req), reply);
    } catch (const std::exception& e) {
      respond_now(500, std::string("{\"error\":{\"message\":\"internal error\",\"type\":"
                                   "\"InternalServerError\",\"param\":null,\"code\":500}}"));
    }
  }

  // Whole response written from the strand (transport-level errors).
  void respond_now(int status, std::string body) {
    std::string head = status_line(status) + "Content-Type: application/json\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
    keep_alive_ = false;
    out_.push_back(head + body);
    reply_ending_ = true;
    flush();
  }

  // While a reply is pending, a readable socket with nothing to read means the peer closed.
  void watch_disconnect() {
    const uint64_t gen = ++watch_gen_;
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), gen](beast::error_code ec) {
      if (gen != self->watch_gen_ || self->closed_) return;
      if (ec) return;  // cancelled: the reply ended
      beast::error_code aec;
      const size_t avail = self->stream_.socket().available(aec);
      if (aec || (avail == 0 && self->buffer_.size() == 0)) self->client_disconnected();
      // data (a pipelined request) waits for the next read
    });
  }

  void client_disconnected() {
    if (client_gone_) return;
    client_gone_ = true;
    if (auto f = std::move(on_disconnect_)) {
      on_disconnect_ = nullptr;
      f();
    }
    shut_down();
  }

  void flush() {
    if (writing_ || closed_) return;
    if (out_.empty()) {
      if (reply_ending_) reply_done();
      return;
    }
    writing_ = true;
    current_ = std::move(out_.front());
    out_.pop_front();
    asio::async_write(stream_, asio::buffer(current_), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->writing_ = false;
      if (ec) {
        self->client_disconnected();
        return;
      }
      self->flush();
    });
  }

  void reply_done() {
    reply_ending_ = false;
    on_disconnect_ = nullptr;
    ++watch_gen_;
    beast::error_code ec;
    stream_.socket().cancel(ec);  // the disconnect watch
    if (!keep_alive_) {
      shut_down();
      return;
    }
    read();
  }

  void shut_down() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
    if (auto f = std::move(on_disconnect_)) {
      on_disconnect_ = nullptr;
      client_gone_ = true;
      f();
    }
  }

  beast::tcp_stream stream_;
  std::shared_ptr<HttpServer::Impl> server_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::deque<std::string> out_;
  std::string current_;
  std::function<void()> on_disconnect_;
  uint64_t watch_gen_ = 0;
  bool writing_ = false;
  bool reply_ending_ = false;
  bool keep_alive_ = true;
  bool closed_ = false;
  bool client_gone_ = false;
};

void ReplyImpl::send(HttpResponse r) {
  std::string head = status_line(r.status) + "Content-Type: " + r.content_type +
                     "\r\nContent-Length: " + std::to_string(r.body.size()) + "\r\n" +
                     header_block(r.headers) +
                     (session_->keep_alive() ? "Connection: keep-alive\r\n" : "Connection: close\r\n") +
                     "\r\n";
  session_->post_data(head + r.body, true);
}

void ReplyImpl::start_stream(int status, std::string content_type, Headers headers) {
  std::string head = status_line(status) + "Content-Type: " + content_type +
                     "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n" + header_block(headers) +
                     (session_->keep_alive() ? "Connection: keep-alive\r\n" : "Connection: close\r\n") + "\r\n";
  session_->post_data(std::move(head), false);
}

void ReplyImpl::write(std::string data) {
  if (!data.empty()) session_->post_data(chunk(data), false);
}

void ReplyImpl::end() { session_->post_data("0\r\n\r\n", true); }

void ReplyImpl::run(std::function<void()> f) { session_->run_task(std::move(f)); }

void ReplyImpl::on_disconnect(std::function<void()> f) { session_->set_disconnect(std::move(f)); }

}  // namespace

void HttpServer::Impl::accept() {
  acceptor.async_accept(asio::make_strand(ioc), [self = shared_from_this()](beast::error_code ec, tcp::socket s) {
    if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
    if (!ec) {
      beast::error_code nec;
      s.set_option(tcp::no_delay(true), nec);
      auto session = std::make_shared<Session>(std::move(s), self);
      {
        std::lock_guard<std::mutex> lock(self->sessions_mu);
        auto& v = self->sessions;
        v.erase(std::remove_if(v.begin(), v.end(), [](const auto& w) { return w.expired(); }), v.end());
        v.push_back(session);
      }
      session->start();
    }
    self->accept();
  });
}

HttpServer::HttpServer(const HttpOptions& options, Handler handler) : impl_(std::make_shared<Impl>()) {
  impl_->options = options;
  impl_->handler = std::move(handler);
  beast::error_code ec;
  const auto address = asio::ip::make_address(options.host, ec);
  if (ec) throw std::runtime_error("--host: '" + options.host + "' is not an IP address: " + ec.message());
  if (options.port < 0 || options.port > 65535)
    throw std::runtime_error("--port: " + std::to_string(options.port) + " is outside [0, 65535]");
  const tcp::endpoint ep(address, static_cast<unsigned short>(options.port));
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    throw std::runtime_error("cannot listen on " + options.host + ":" + std::to_string(options.port) + ": " +
                             ec.message());
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::port() const {
  beast::error_code ec;
  return impl_->acceptor.local_endpoint(ec).port();
}

void HttpServer::start() {
  impl_->work.emplace(impl_->ioc.get_executor());
  impl_->accept();
  int n = impl_->options.num_threads;
  if (n <= 0) n = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 4, 1, 4);
  for (int i = 0; i < n; ++i)
    impl_->threads.emplace_back([impl = impl_] { impl->ioc.run(); });
}

void HttpServer::stop_accepting() {
  asio::post(impl_->ioc, [impl = impl_] {
    beast::error_code ec;
    impl->acceptor.close(ec);
  });
}

void HttpServer::post_serial(std::function<void()> f) { asio::post(impl_->serial, std::move(f)); }

void HttpServer::stop() {
  if (impl_->threads.empty()) return;
  stop_accepting();
  {
    std::lock_guard<std::mutex> lock(impl_->sessions_mu);
    for (auto& w : impl_->sessions)
      if (auto s = w.lock()) s->close();
  }
  impl_->work.reset();
  // Sessions close on their strands; then nothing is left to run.
  for (int i = 0; i < 100 && !impl_->ioc.stopped(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

}  // namespace deepinfer::server
