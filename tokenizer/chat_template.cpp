// DeepSeek-V3 chat encoding, written out from the chat_template in its tokenizer_config.json
// (no template engine): system prompts first (joined by "\n\n"), then the turns in order.
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {
constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kEndOfSentence = "<｜end▁of▁sentence｜>";
constexpr std::string_view kToolOutputsBegin = "<｜tool▁outputs▁begin｜>";
constexpr std::string_view kToolOutputsEnd = "<｜tool▁outputs▁end｜>";
constexpr std::string_view kToolOutputBegin = "<｜tool▁output▁begin｜>";
constexpr std::string_view kToolOutputEnd = "<｜tool▁output▁end｜>";
}  // namespace

std::string apply_chat_template(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) {
  std::string out;
  if (tokenizer.bos_id() >= 0) out += tokenizer.token_string(tokenizer.bos_id());
  bool first_system = true;
  for (const ChatMessage& m : messages) {
    if (m.role != "system") continue;
    if (!first_system) out += "\n\n";
    out += m.content;
    first_system = false;
  }
  bool in_tool_outputs = false;   // the template's ns.is_tool
  bool first_tool_output = true;  // ns.is_output_first: never reset, as in the template
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system") continue;
    if (m.role == "user") {
      in_tool_outputs = false;
      out.append(kUser).append(m.content);
    } else if (m.role == "assistant") {
      out.append(in_tool_outputs ? kToolOutputsEnd : kAssistant).append(m.content).append(kEndOfSentence);
      in_tool_outputs = false;
    } else if (m.role == "tool") {
      in_tool_outputs = true;
      if (first_tool_output) {
        out.append(kToolOutputsBegin).append(kToolOutputBegin);
        first_tool_output = false;
      } else {
        out.append("\n").append(kToolOutputBegin);
      }
      out.append(m.content).append(kToolOutputEnd);
    } else {
      fail("apply_chat_template: message ", i, ": unknown role '", m.role,
           "' (expected system, user, assistant or tool)");
    }
  }
  if (in_tool_outputs) out.append(kToolOutputsEnd);
  if (add_generation_prompt && !in_tool_outputs) out.append(kAssistant);
  return out;
}

}  // namespace deepinfer
