// DeepSeek output formats for the chat route: reasoning (`<think>...</think>`, R1 style: text
// before `</think>` is reasoning even without the opening tag) and tool calls, in the checkpoint's
// format (ToolFormat, from Engine::chat_format()):
//   V3:   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
//         (further calls after "\n") <｜tool▁calls▁end｜>
//   V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>(chained)<｜tool▁calls▁end｜>
// parsed incrementally from a choice's growing text as vLLM's deepseek_v3 / deepseek_v31 tool
// parsers parse the whole text (content is the text before the call list; text after the list is
// dropped), except that arguments may span lines (vLLM's regexes drop such a call).
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

enum class ToolFormat { V3, V31 };
// "deepseek_v31" -> V31; anything else (deepseek_v3, "") -> V3.
ToolFormat tool_format_of(const std::string& chat_format);

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
  OutputParser(bool reasoning, bool tools, ToolFormat format = ToolFormat::V3)
      : in_reasoning_(reasoning), at_start_(reasoning), tools_(tools), format_(format) {}
  // `text` is the whole output so far (it only grows); `final`: no more text comes, so nothing is
  // held back. Returns what became certain since the last call.
  ParsedDelta feed(const std::string& text, bool final);
  bool saw_tool_calls() const { return num_calls_ > 0; }

 private:
  size_t consumed_ = 0;
  bool in_reasoning_;
  bool at_start_;  // an opening <think> may still come
  bool tools_;
  ToolFormat format_;
  bool in_calls_ = false;
  bool after_calls_ = false;  // the list ended: the rest is dropped
  int num_calls_ = 0;
};

// A call list as the model writes it in `format` (what the parser reads back).
std::string render_tool_calls(const std::vector<ToolCall>& calls, ToolFormat format = ToolFormat::V3);

}  // namespace deepinfer::server
