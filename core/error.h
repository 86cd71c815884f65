// Error: the one exception type deepinfer throws for bad input and failed
// operations. Messages name the file, tensor, field or request and what was
// expected; callers at the edge (CLI, engine per request) catch and report.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace deepinfer {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// Throws Error with the streamed message.
template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(detail::concat(std::forward<Args>(args)...));
}

}  // namespace deepinfer

// DI_CHECK(cond, "what", value, ...): throws deepinfer::Error when cond is false.
#define DI_CHECK(cond, ...)                   \
  do {                                        \
    if (!(cond)) ::deepinfer::fail(__VA_ARGS__); \
  } while (0)
