// Tokenizer: HF `tokenizer.json` byte-level BPE (DeepSeek-V3 and tokenizers trained the same
// way), exact-match with HF `tokenizers`; incremental detokenization; DeepSeek chat encoding.
//
// Pipeline of encode(text):
//   added/special tokens matched in the raw text (leftmost-longest, respecting lstrip/rstrip/
//   single_word; non-normalized tokens first, then normalized ones)
//   -> pre-tokenizer on the text between them (Split regexes via PCRE2 UTF+UCP, Sequence,
//      Digits, ByteLevel) -> pieces (byte ranges)
//   -> BPE on each piece's bytes (merges applied lowest rank first, leftmost among equals)
//   -> ids.
// A Tokenizer is immutable after loading apart from an internal, mutex-sharded word cache, so
// const calls are safe from many threads; copies and moves share the loaded data (cheap).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace deepinfer {

namespace tokenizer_detail {
struct TokenizerData;
}

enum class ChatFormat;

class Tokenizer {
 public:
  // Loads tokenizer.json. Throws Error naming the file and the JSON path of a malformed or
  // unsupported field (e.g. "tokenizer.json: model.type: unsupported model type 'Unigram'").
  static Tokenizer from_file(const std::string& tokenizer_json_path);
  // Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json (add_bos_token,
  // add_eos_token, bos_token, eos_token). Without a config: no BOS/EOS (ids -1).
  static Tokenizer from_dir(const std::string& dir);
  // Loads tokenizer.json contents held in memory; `source_name` names it in errors.
  static Tokenizer from_json(std::string_view tokenizer_json, const std::string& source_name = "tokenizer.json");

  // Text must be valid UTF-8 (Error otherwise, naming the byte offset). add_special_tokens adds
  // BOS (and EOS) as tokenizer_config's add_bos_token (add_eos_token) say, as transformers does.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // As HF `tokenizers` decode: unknown ids are dropped, bytes that do not form UTF-8 become
  // U+FFFD (maximal invalid subparts, as Rust's from_utf8_lossy).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  int32_t vocab_size() const;  // max id + 1 (model vocab and added tokens)
  // The raw bytes a token stands for (byte-level decoded; a token whose characters are not all
  // byte-level characters, e.g. "<｜User｜>", stands for its own UTF-8 text, as HF's decoder).
  // Throws Error for an id outside [0, vocab_size) or with no token.
  const std::string& token_bytes(int32_t id) const;
  // The token's string as written in tokenizer.json (byte-level characters, e.g. "Ġthe").
  const std::string& token_string(int32_t id) const;
  bool is_special(int32_t id) const;  // an added token marked "special"
  bool has_token(int32_t id) const;   // false for gaps in the id range
  std::optional<int32_t> token_to_id(std::string_view token) const;  // by token string
  int32_t bos_id() const;  // from tokenizer_config (-1 if none)
  int32_t eos_id() const;
  bool add_bos_token() const;
  bool add_eos_token() const;
  // tokenizer_config.json's chat_template ("" when absent) and the format it writes.
  const std::string& chat_template() const;
  ChatFormat chat_format() const;

 private:
  explicit Tokenizer(std::shared_ptr<const tokenizer_detail::TokenizerData> data);
  std::shared_ptr<const tokenizer_detail::TokenizerData> data_;
};

// Turns a stream of ids into text pieces that are always whole UTF-8: bytes of a character
// split across tokens are held back until complete. The concatenation of every push() and the
// final flush() equals Tokenizer::decode of all ids.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  std::string push(int32_t id);
  // Emits what is held back (an incomplete character becomes U+FFFD) and resets.
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::string pending_bytes_;  // an incomplete UTF-8 sequence, at most 3 bytes
};

// The chat formats of DeepSeek checkpoints (chosen from tokenizer_config's chat_template):
//   DeepSeekV3  (V3, R1): tool calls "<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```
//               <｜tool▁call▁end｜>" joined by "\n"; tool results in <｜tool▁outputs▁begin｜>...;
//   DeepSeekV31 (V3.1): "<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>" chained; tool
//               results as bare <｜tool▁output▁begin｜>...; the assistant turn opens with
//               "</think>" (non-thinking) or "<think>" (thinking).
enum class ChatFormat { DeepSeekV3, DeepSeekV31 };
const char* to_string(ChatFormat format);  // "deepseek_v3" | "deepseek_v31"
// Which format a chat_template text writes (V3.1's renders "<｜Assistant｜></think>"); an empty
// or unknown template is DeepSeek-V3's.
ChatFormat chat_format_of_template(std::string_view chat_template);

struct ChatToolCall {
  std::string type = "function";
  std::string name;
  std::string arguments;  // JSON text, written as given
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
  // The templates test `content is none` (an assistant turn that only calls tools).
  bool content_is_null = false;
  std::optional<std::vector<ChatToolCall>> tool_calls = std::nullopt;  // assistant turns
};

struct ChatOptions {
  bool add_generation_prompt = true;
  bool thinking = false;  // chat_template_kwargs.thinking (V3.1; V3's template has none)
};

// The checkpoint's chat format (Tokenizer::chat_format()) rendered exactly as transformers renders
// its tokenizer_config chat_template, quirks included (V3: the call list is closed only after a
// second call; V3.1: reasoning before "</think>" is dropped from history turns). BOS text, the
// system prompts joined by "\n\n", then the turns. Throws Error for an unknown role.
std::string apply_chat_template(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt);
std::string apply_chat_template(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                                const ChatOptions& options);
std::string apply_chat_template(ChatFormat format, std::string_view bos_text,
                                const std::vector<ChatMessage>& messages, const ChatOptions& options);

}  // namespace deepinfer
