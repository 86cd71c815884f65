// DeepSeek chat encodings, written out from the chat_template texts of the checkpoints'
// tokenizer_config.json (no template engine): DeepSeek-V3's (also R1's tool format) and
// DeepSeek-V3.1's. Each branch below names the template state it mirrors (ns.is_tool, ...), so
// the output equals transformers' rendering byte for byte (tests/unit/tokenizer/data/*chat*).
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {
constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kEndOfSentence = "<｜end▁of▁sentence｜>";
constexpr std::string_view kToolCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kToolCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kToolCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kToolCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kToolSep = "<｜tool▁sep｜>";
constexpr std::string_view kToolOutputsBegin = "<｜tool▁outputs▁begin｜>";
constexpr std::string_view kToolOutputsEnd = "<｜tool▁outputs▁end｜>";
constexpr std::string_view kToolOutputBegin = "<｜tool▁output▁begin｜>";
constexpr std::string_view kToolOutputEnd = "<｜tool▁output▁end｜>";
constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

void check_role(const ChatMessage& m, size_t i) {
  if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool")
    fail("apply_chat_template: message ", i, ": unknown role '", m.role,
         "' (expected system, user, assistant or tool)");
}

std::string system_prompt(const std::vector<ChatMessage>& messages) {
  std::string out;
  bool first = true;
  for (const ChatMessage& m : messages) {
    if (m.role != "system") continue;
    if (!first) out += "\n\n";
    out += m.content;
    first = false;
  }
  return out;
}

// DeepSeek-V3's template. Its namespace flags: is_first (a call list was opened; never reset),
// is_tool (inside tool outputs), is_output_first (no tool output yet; never reset).
void render_v3(const std::vector<ChatMessage>& messages, const ChatOptions& options, std::string& out) {
  bool is_first = false, is_tool = false, is_output_first = true;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    check_role(m, i);
    if (m.role == "user") {
      is_tool = false;
      out.append(kUser).append(m.content);
    } else if (m.role == "assistant" && m.content_is_null) {
      is_tool = false;
      if (!m.tool_calls) continue;
      for (const ChatToolCall& call : *m.tool_calls) {
        // The first call the template ever writes opens the turn and the list; every later one
        // (this turn's or a later turn's) follows a "\n" and closes the list and the turn.
        const bool opens = !is_first;
        if (opens) out.append(kAssistant).append(kToolCallsBegin);
        else out.append("\n");
        out.append(kToolCallBegin).append(call.type).append(kToolSep).append(call.name);
        out.append("\n```json\n").append(call.arguments).append("\n```").append(kToolCallEnd);
        if (!opens) out.append(kToolCallsEnd).append(kEndOfSentence);
        is_first = true;
      }
    } else if (m.role == "assistant") {
      out.append(is_tool ? kToolOutputsEnd : kAssistant).append(m.content).append(kEndOfSentence);
      is_tool = false;
    } else if (m.role == "tool") {
      is_tool = true;
      if (is_output_first) {
        out.append(kToolOutputsBegin);
        is_output_first = false;
      } else {
        out.append("\n");
      }
      out.append(kToolOutputBegin).append(m.content).append(kToolOutputEnd);
    }
  }
  if (is_tool) out.append(kToolOutputsEnd);
  if (options.add_generation_prompt && !is_tool) out.append(kAssistant);
}

// DeepSeek-V3.1's template. Flags: is_first (a call of this turn was written), is_tool (after
// tool outputs), is_last_user (the last turn written was the user's).
void render_v31(const std::vector<ChatMessage>& messages, const ChatOptions& options, std::string& out) {
  bool is_tool = false, is_last_user = false;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    check_role(m, i);
    if (m.role == "user") {
      is_tool = false;
      is_last_user = true;
      out.append(kUser).append(m.content);
    } else if (m.role == "assistant" && m.tool_calls) {
      if (is_last_user) out.append(kAssistant).append(kThinkClose);
      is_last_user = false;
      is_tool = false;
      bool is_first = false;
      for (const ChatToolCall& call : *m.tool_calls) {
        if (!is_first) {
          if (!m.content_is_null) out.append(m.content);
          out.append(kToolCallsBegin);
          is_first = true;
        }
        out.append(kToolCallBegin).append(call.name).append(kToolSep).append(call.arguments).append(kToolCallEnd);
      }
      out.append(kToolCallsEnd).append(kEndOfSentence);
    } else if (m.role == "assistant") {
      if (is_last_user) out.append(kAssistant).append(kThinkClose);  // no `prefix` turns here
      is_last_user = false;
      if (is_tool) {
        out.append(m.content).append(kEndOfSentence);
        is_tool = false;
      } else {
        std::string_view content = m.content;
        const size_t close = content.find(kThinkClose);
        if (close != std::string_view::npos) content.remove_prefix(close + kThinkClose.size());
        out.append(content).append(kEndOfSentence);
      }
    } else if (m.role == "tool") {
      is_last_user = false;
      is_tool = true;
      out.append(kToolOutputBegin).append(m.content).append(kToolOutputEnd);
    }
  }
  if (options.add_generation_prompt && is_last_user && !is_tool)
    out.append(kAssistant).append(options.thinking ? kThinkOpen : kThinkClose);
}

}  // namespace

const char* to_string(ChatFormat format) {
  return format == ChatFormat::DeepSeekV31 ? "deepseek_v31" : "deepseek_v3";
}

ChatFormat chat_format_of_template(std::string_view chat_template) {
  return chat_template.find("<｜Assistant｜></think>") != std::string_view::npos ? ChatFormat::DeepSeekV31
                                                                                : ChatFormat::DeepSeekV3;
}

std::string apply_chat_template(ChatFormat format, std::string_view bos_text,
                                const std::vector<ChatMessage>& messages, const ChatOptions& options) {
  std::string out(bos_text);
  out += system_prompt(messages);
  if (format == ChatFormat::DeepSeekV31) render_v31(messages, options, out);
  else render_v3(messages, options, out);
  return out;
}

std::string apply_chat_template(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                                const ChatOptions& options) {
  const std::string bos = tokenizer.bos_id() >= 0 ? tokenizer.token_string(tokenizer.bos_id()) : std::string();
  return apply_chat_template(tokenizer.chat_format(), bos, messages, options);
}

std::string apply_chat_template(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) {
  ChatOptions options;
  options.add_generation_prompt = add_generation_prompt;
  return apply_chat_template(tokenizer, messages, options);
}

}  // namespace deepinfer
