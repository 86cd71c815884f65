#include "core/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace deepinfer {

namespace {
LogLevel threshold() {
  static const LogLevel level = [] {
    const char* env = std::getenv("DEEPINFER_LOG");
    if (env == nullptr) return LogLevel::Warn;
    if (std::strcmp(env, "debug") == 0) return LogLevel::Debug;
    if (std::strcmp(env, "info") == 0) return LogLevel::Info;
    if (std::strcmp(env, "error") == 0) return LogLevel::Error;
    return LogLevel::Warn;
  }();
  return level;
}
}  // namespace

bool log_enabled(LogLevel level) { return level >= threshold(); }

void log_message(LogLevel level, const std::string& message) {
  static const char* names[] = {"debug", "info", "warn", "error"};
  std::fprintf(stderr, "[deepinfer %s] %s\n", names[static_cast<int>(level)], message.c_str());
}

}  // namespace deepinfer
