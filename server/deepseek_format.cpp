#include "server/deepseek_format.h"

#include <algorithm>

namespace deepinfer::server {
namespace {

// Length of the longest suffix of `text` (from `from`) that is a proper prefix of `marker`.
size_t partial_suffix(std::string_view text, size_t from, std::string_view marker) {
  const size_t avail = text.size() - from;
  for (size_t len = std::min(avail, marker.size() - 1); len > 0; --len)
    if (text.substr(text.size() - len) == marker.substr(0, len)) return len;
  return 0;
}

bool parse_call(std::string_view s, ToolFormat format, ToolCall& call) {
  while (!s.empty() && (s.front() == '\n' || s.front() == ' ')) s.remove_prefix(1);
  if (s.substr(0, kToolCallBegin.size()) != kToolCallBegin) return false;
  s.remove_prefix(kToolCallBegin.size());
  const size_t sep = s.find(kToolSep);
  if (sep == std::string_view::npos) return false;
  if (format == ToolFormat::V31) {  // NAME<｜tool▁sep｜>ARGS
    call.name = std::string(s.substr(0, sep));
    call.arguments = std::string(s.substr(sep + kToolSep.size()));
    return !call.name.empty();
  }
  s.remove_prefix(sep + kToolSep.size());  // "function" (the type) before the separator
  const size_t nl = s.find('\n');
  call.name = std::string(s.substr(0, nl));
  if (nl == std::string_view::npos) return !call.name.empty();
  s.remove_prefix(nl + 1);
  constexpr std::string_view kFence = "```json\n";
  if (s.substr(0, kFence.size()) == kFence) s.remove_prefix(kFence.size());
  if (s.size() >= 4 && s.substr(s.size() - 4) == "\n```") s.remove_suffix(4);
  else if (s.size() >= 3 && s.substr(s.size() - 3) == "```") s.remove_suffix(3);
  call.arguments = std::string(s);
  return !call.name.empty();
}

}  // namespace

ToolFormat tool_format_of(const std::string& chat_format) {
  return chat_format == "deepseek_v31" ? ToolFormat::V31 : ToolFormat::V3;
}

ParsedDelta OutputParser::feed(const std::string& text, bool final) {
  ParsedDelta d;
  const std::string_view t(text);
  if (after_calls_) {
    consumed_ = t.size();
    return d;
  }
  for (;;) {
    if (in_reasoning_) {
      if (at_start_) {
        constexpr std::string_view kOpen = "<think>";
        if (t.size() - consumed_ < kOpen.size() && !final && kOpen.substr(0, t.size() - consumed_) == t.substr(consumed_))
          return d;  // might still become <think>
        if (t.substr(consumed_, kOpen.size()) == kOpen) consumed_ += kOpen.size();
        at_start_ = false;
      }
      constexpr std::string_view kClose = "</think>";
      const size_t pos = t.find(kClose, consumed_);
      if (pos != std::string_view::npos) {
        d.reasoning.append(t.substr(consumed_, pos - consumed_));
        consumed_ = pos + kClose.size();
        in_reasoning_ = false;
        continue;
      }
      const size_t safe = final ? t.size() : t.size() - partial_suffix(t, consumed_, kClose);
      d.reasoning.append(t.substr(consumed_, safe - consumed_));
      consumed_ = safe;
      return d;
    }
    if (!tools_) {
      d.content.append(t.substr(consumed_));
      consumed_ = t.size();
      return d;
    }
    if (!in_calls_) {
      const size_t pos = t.find(kToolCallsBegin, consumed_);
      if (pos != std::string_view::npos) {
        d.content.append(t.substr(consumed_, pos - consumed_));
        consumed_ = pos + kToolCallsBegin.size();
        in_calls_ = true;
        continue;
      }
      const size_t safe = final ? t.size() : t.size() - partial_suffix(t, consumed_, kToolCallsBegin);
      d.content.append(t.substr(consumed_, safe - consumed_));
      consumed_ = safe;
      return d;
    }
    // Inside the call list: complete calls, then the list's end.
    const size_t end = t.find(kToolCallEnd, consumed_);
    const size_t list_end = t.find(kToolCallsEnd, consumed_);
    if (end != std::string_view::npos && (list_end == std::string_view::npos || end < list_end)) {
      ToolCall call;
      if (parse_call(t.substr(consumed_, end - consumed_), format_, call)) {
        d.calls.push_back(std::move(call));
        ++num_calls_;
      }
      consumed_ = end + kToolCallEnd.size();
      continue;
    }
    if (list_end != std::string_view::npos) {  // as vLLM: nothing after the list is content
      consumed_ = t.size();
      in_calls_ = false;
      after_calls_ = true;
      return d;
    }
    if (final) {  // cut off inside a call: what was written is kept as content
      d.content.append(t.substr(consumed_));
      consumed_ = t.size();
    }
    return d;
  }
}

std::string render_tool_calls(const std::vector<ToolCall>& calls, ToolFormat format) {
  std::string out(kToolCallsBegin);
  for (size_t i = 0; i < calls.size(); ++i) {
    if (format == ToolFormat::V31) {
      out.append(kToolCallBegin).append(calls[i].name).append(kToolSep).append(calls[i].arguments).append(kToolCallEnd);
      continue;
    }
    if (i > 0) out += "\n";
    out.append(kToolCallBegin).append("function").append(kToolSep).append(calls[i].name);
    out.append("\n```json\n").append(calls[i].arguments).append("\n```").append(kToolCallEnd);
  }
  out.append(kToolCallsEnd);
  return out;
}

}  // namespace deepinfer::server
