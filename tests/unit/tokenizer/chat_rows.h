// Rows of deepseek_chat_tools.jsonl.gz (tools/server/make_chat_tools_fixture.py: transformers'
// apply_chat_template of DeepSeek-V3's and V3.1's templates) as ChatMessage lists.
#pragma once
#include <nlohmann/json.hpp>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace deepinfer::test {

inline std::vector<ChatMessage> chat_messages(const nlohmann::json& list) {
  std::vector<ChatMessage> out;
  for (const auto& m : list) {
    ChatMessage c;
    c.role = m["role"].get<std::string>();
    c.content_is_null = m["content"].is_null();
    if (!c.content_is_null) c.content = m["content"].get<std::string>();
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      c.tool_calls.emplace();
      for (const auto& t : m["tool_calls"])
        c.tool_calls->push_back({t["type"].get<std::string>(), t["function"]["name"].get<std::string>(),
                                 t["function"]["arguments"].get<std::string>()});
    }
    out.push_back(std::move(c));
  }
  return out;
}

inline ChatOptions chat_options(const nlohmann::json& row) {
  ChatOptions o;
  o.add_generation_prompt = row["add_generation_prompt"].get<bool>();
  o.thinking = row["thinking"].get<bool>();
  return o;
}

}  // namespace deepinfer::test
