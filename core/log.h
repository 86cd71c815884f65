// Minimal leveled logging to stderr (DEEPINFER_LOG=debug|info|warn|error).
#pragma once
#include <string>

#include "core/error.h"

namespace deepinfer {

enum class LogLevel { Debug, Info, Warn, Error };
bool log_enabled(LogLevel level);
void log_message(LogLevel level, const std::string& message);

template <typename... Args>
void log_info(Args&&... args) {
  if (log_enabled(LogLevel::Info)) log_message(LogLevel::Info, detail::concat(std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(Args&&... args) {
  if (log_enabled(LogLevel::Warn)) log_message(LogLevel::Warn, detail::concat(std::forward<Args>(args)...));
}
template <typename... Args>
void log_debug(Args&&... args) {
  if (log_enabled(LogLevel::Debug)) log_message(LogLevel::Debug, detail::concat(std::forward<Args>(args)...));
}

}  // namespace deepinfer
