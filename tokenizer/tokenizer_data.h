// TokenizerData: everything a loaded tokenizer holds; immutable after load_tokenizer_json
// (the BPE word cache is internally synchronised). Internal to the tokenizer module.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pre_tokenizer.h"

namespace deepinfer::tokenizer_detail {

struct TokenizerData {
  std::string path;  // tokenizer.json, for messages

  // Indexed by id, size vocab_size: the token's string in tokenizer.json, the raw bytes it
  // decodes to, and flags.
  std::vector<std::string> token_strings;
  std::vector<std::string> token_bytes;
  std::vector<uint8_t> present;  // 0 for gaps in the id range
  std::vector<uint8_t> special;
  StringMap<int32_t> string_to_id;  // added tokens take precedence, as HF's token_to_id

  AddedTokenMatcher non_normalized_tokens;  // matched first, in the raw text
  AddedTokenMatcher normalized_tokens;      // then in the text between those
  PreTokenizer pre_tokenizer;
  BpeModel bpe;

  // From tokenizer_config.json.
  int32_t bos_id = -1, eos_id = -1;
  bool add_bos_token = false, add_eos_token = false;
  std::string chat_template;
};

// Parses tokenizer.json text; `path` names it in errors. Throws Error naming the JSON path.
void load_tokenizer_json(std::string_view json_text, const std::string& path, TokenizerData& data);
// Applies tokenizer_config.json (text) to loaded data.
void load_tokenizer_config(std::string_view json_text, const std::string& path, TokenizerData& data);

}  // namespace deepinfer::tokenizer_detail
