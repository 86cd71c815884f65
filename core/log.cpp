#include "core/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/settings.h"

namespace deepinfer {

namespace {
LogLevel threshold() {
  static const LogLevel level = [] {
    std::string env;
    try {
      env = env_settings().get_string("DEEPINFER_LOG");
    } catch (const Error&) {
      return LogLevel::Warn;  // a bad DEEPINFER_* value is reported where options are read
    }
    if (env == "debug") return LogLevel::Debug;
    if (env == "info") return LogLevel::Info;
    if (env == "error") return LogLevel::Error;
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
