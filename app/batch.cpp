#include "app/batch.h"

#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unordered_map>

#include "app/commands.h"
#include "core/error.h"

namespace deepinfer::app {

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) {
  if (g_stop_signal != 0) {  // a second signal: end at once
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_stop_signal = sig;
}
}  // namespace

int BatchJob::run_until_signalled(Engine& engine) {
  g_stop_signal = 0;
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  const int code = run(engine, [] { return static_cast<int>(g_stop_signal); });
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  return code;
}
namespace {

using nlohmann::json;

json completion_json(const CompletionOutput& c) {
  json o = {{"index", c.index}, {"text", c.text}, {"token_ids", c.token_ids},
            {"finish_reason", to_string(c.finish_reason)}};
  if (!c.stop_reason.empty()) o["stop_reason"] = c.stop_reason;
  if (!c.logprobs.empty()) {
    json lp = json::array();
    for (auto& t : c.logprobs) {
      json top = json::array();
      for (auto& [id, l] : t.top) top.push_back({id, l});
      lp.push_back({{"token_id", t.token_id}, {"logprob", t.logprob}, {"top", top}});
    }
    o["logprobs"] = lp;
  }
  return o;
}

constexpr size_t kMaxErrorBytes = 1024;

json output_json(size_t index, const RequestOutput& r) {
  if (!r.error.empty())
    return {{"index", index}, {"error", truncate_for_message(r.error, kMaxErrorBytes)}, {"finish_reason", "error"}};
  json o = completion_json(r.outputs[0]);
  o["index"] = index;
  o["usage"] = {{"prompt_tokens", r.num_prompt_tokens}, {"completion_tokens", r.num_output_tokens},
                {"cached_tokens", r.num_cached_tokens}};
  o["time_to_first_token_s"] = r.time_to_first_token_s;
  o["decode_tokens_per_s"] = r.decode_tokens_per_s;
  if (r.spec.num_verify_steps > 0) o["spec_decode"] = spec_json(r.spec);
  if (r.outputs.size() > 1) {
    o["outputs"] = json::array();
    for (auto& c : r.outputs) o["outputs"].push_back(completion_json(c));
  }
  return o;
}

class ProgressBar {
 public:
  explicit ProgressBar(size_t total) : total_(total), start_(clock::now()) {}
  void update(size_t done, int64_t tokens, bool force = false) {
    double t = std::chrono::duration<double>(clock::now() - start_).count();
    if (!force && t - last_ < 0.25) return;
    last_ = t;
    double rate = t > 0 ? tokens / t : 0.0;
    double eta = done > 0 ? t * (total_ - done) / done : 0.0;
    int width = 30, filled = total_ ? static_cast<int>(width * done / total_) : width;
    std::fprintf(stderr, "\r[%s%s] %zu/%zu requests  %.1f tok/s  ETA %.0fs ", std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), done, total_, rate, eta);
    if (force) std::fprintf(stderr, "\n");
  }

 private:
  using clock = std::chrono::steady_clock;
  size_t total_;
  clock::time_point start_;
  double last_ = -1.0;
};

const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

}  // namespace

std::set<size_t> finished_indices(const std::string& path) {
  std::set<size_t> done;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return done;
  uintmax_t keep = 0;  // bytes up to and including the last newline
  {
    std::ifstream in(path, std::ios::binary);
    DI_CHECK(in.good(), "--resume: cannot read ", path);
    JsonlReader reader(in);
    while (auto line = reader.next()) {
      if (line->too_long) continue;
      try {
        const json j = parse_request_json(line->text, path + ": line " + std::to_string(line->line_no));
        if (j.is_object() && j.contains("index") && j["index"].is_number_unsigned())
          done.insert(j["index"].get<size_t>());
      } catch (const Error&) {
        // Not one of our result lines (a partial line is cut below); it is left as it is.
      }
    }
    in.clear();
    in.seekg(0, std::ios::end);
    const auto size = static_cast<uintmax_t>(in.tellg());
    // Find the last newline by scanning back from the end.
    for (uintmax_t pos = size; pos > 0; --pos) {
      in.seekg(static_cast<std::streamoff>(pos - 1));
      if (in.get() == '\n') {
        keep = pos;
        break;
      }
    }
    if (keep == size) return done;
  }
  // A partial last line: a run was killed while writing it; its request runs again.
  std::filesystem::resize_file(path, keep, ec);
  DI_CHECK(!ec, "--resume: cannot cut the partial last line of ", path, ": ", ec.message());
  return done;
}

BatchJob::BatchJob(const BatchOptions& options, const SamplingParams& defaults) : options_(options) {
  std::ifstream in(options.input, std::ios::binary);
  DI_CHECK(in.good(), "--input: cannot read ", options.input);
  const std::set<size_t> done = options.resume ? finished_indices(options.output) : std::set<size_t>{};
  out_ = std::fopen(options.output.c_str(), options.resume ? "ab" : "wb");
  DI_CHECK(out_ != nullptr, "--output: cannot write ", options.output, ": ", std::strerror(errno));
  JsonlReader reader(in);
  while (auto line = reader.next()) {
    const size_t index = num_requests_++;
    if (done.count(index)) {
      ++skipped_;
      continue;
    }
    try {
      DI_CHECK(!line->too_long, "line ", line->line_no, ": longer than ", kMaxRequestLineBytes, " bytes");
      RequestLine request = parse_request_line(line->text, line->line_no, defaults);
      try {
        request.params.validate();
      } catch (const Error& e) {
        fail("line ", line->line_no, ": ", e.what());
      }
      pending_.push_back({index, line->line_no, std::move(request)});
    } catch (const Error& e) {
      write_error(index, e.what());
    }
  }
}

BatchJob::~BatchJob() {
  if (out_) std::fclose(out_);
}

void BatchJob::write_line(const json& line) {
  // Invalid UTF-8 (a cut multi-byte character in generated text) becomes U+FFFD, not an exception.
  const std::string text = line.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  const bool ok = std::fwrite(text.data(), 1, text.size(), out_) == text.size() && std::fflush(out_) == 0;
  DI_CHECK(ok, "--output: cannot write ", options_.output, ": ", std::strerror(errno));
  ++written_;
}

void BatchJob::write_error(size_t index, const std::string& message_in) {
  // Some engine messages quote their input (a regex, a schema): keep each line bounded.
  const std::string message = truncate_for_message(message_in, kMaxErrorBytes);
  std::fprintf(stderr, "deepinfer generate: %s: %s\n", options_.input.c_str(), message.c_str());
  write_line({{"index", index}, {"error", message}, {"finish_reason", "error"}});
  ++num_errors_;
}

int BatchJob::run(Engine& engine, const std::function<int()>& stop_signal) {
  std::unordered_map<std::string, size_t> index_of;
  for (Pending& p : pending_) {
    try {
      index_of[engine.add_request(p.request.prompt, p.request.params)] = p.index;
    } catch (const std::exception& e) {  // Error, or anything else one request's input provokes
      write_error(p.index, "line " + std::to_string(p.line_no) + ": " + e.what());
    }
  }
  const size_t total = pending_.size();
  pending_.clear();
  ProgressBar bar(total);
  size_t done = total - index_of.size();
  int64_t tokens = 0;
  int sig = 0;
  while (!index_of.empty() && engine.has_unfinished()) {
    if (stop_signal && (sig = stop_signal()) != 0) break;
    std::vector<RequestOutput> outputs;
    try {
      outputs = engine.step();
    } catch (const Error&) {
      std::fprintf(stderr, "\ndeepinfer generate: the run failed; %zu results are in %s, %zu requests remain\n",
                   skipped_ + written_, options_.output.c_str(), index_of.size());
      throw;
    }
    for (RequestOutput& r : outputs) {
      for (auto& c : r.outputs) tokens += static_cast<int64_t>(c.delta_token_ids.size());
      auto it = index_of.find(r.request_id);
      if (!r.finished || it == index_of.end()) continue;
      if (!r.error.empty()) {
        std::fprintf(stderr, "deepinfer generate: request %zu: %s\n", it->second,
                     truncate_for_message(r.error, kMaxErrorBytes).c_str());
        ++num_errors_;
      }
      write_line(output_json(it->second, r));
      index_of.erase(it);
      ++done;
    }
    if (options_.progress) bar.update(done, tokens);
  }
  if (options_.progress) bar.update(done, tokens, true);
  if (sig != 0) {
    for (const auto& [id, index] : index_of) engine.abort(id);
    std::fprintf(stderr,
                 "deepinfer generate: stopped by %s: %zu of %zu results are in %s; %zu requests remain "
                 "(run again with --resume to finish them)\n",
                 signal_name(sig), skipped_ + written_, num_requests_, options_.output.c_str(), index_of.size());
    return 128 + sig;
  }
  std::fprintf(stderr, "%zu requests, %d failed; wrote %s", num_requests_, num_errors_, options_.output.c_str());
  if (skipped_ > 0) std::fprintf(stderr, " (%zu were already there)", skipped_);
  std::fprintf(stderr, "\n");
  return num_errors_ == 0 ? kExitOk : kExitError;
}

}  // namespace deepinfer::app
