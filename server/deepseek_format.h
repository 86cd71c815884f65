// DeepSeek-V3 output formats for the chat route: reasoning (`<think>...</think>`, R1 style: text
// before `</think>` is reasoning even without the opening tag) and tool calls
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
//   (further calls after "\n") <｜tool▁calls▁end｜>
// parsed incrementally from a choice's growing text; and the same calls rendered back into an
// assistant turn (as the checkpoint's chat template writes them).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::server {

inline constexpr std::string_view kToolCallsBegin = "<｜tool▁calls▁begin｜>";
inline constexpr std::string_view kToolCallsEnd = "<｜tool▁calls▁end｜>";
inline constexpr std::string_view kToolCallBegin = "<｜tool▁call▁begin｜>";
inline constexpr std::string_view kToolCallEnd = "<｜tool▁call▁end｜>";
inline constexpr std::string_view kToolSep = "<｜tool▁sep｜>";

struct ToolCall {
  std::string name;
  std::string arguments;  // the JSON text as the model wrote it
};

// What a feed() added.
struct ParsedDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> calls;  // complete calls only
};

class OutputParser {
 public:
  OutputParser(bool reasoning, bool tools) : in_reasoning_(reasoning), at_start_(reasoning), tools_(tools) {}
  // `text` is the whole output so far (it only grows); `final`: no more text comes, so nothing is
  // held back. Returns what became certain since the last call.
  ParsedDelta feed(const std::string& text, bool final);
  bool saw_tool_calls() const { return num_calls_ > 0; }

 private:
  size_t consumed_ = 0;
  bool in_reasoning_;
  bool at_start_;  // an opening <think> may still come
  bool tools_;
  bool in_calls_ = false;
  int num_calls_ = 0;
};

// One call as the chat template renders it (the first call of a turn starts the call list).
std::string render_tool_calls(const std::vector<ToolCall>& calls);

}  // namespace deepinfer::server
