// Tokenizer: loading, encode and decode; see tokenizer.h.
#include "tokenizer/tokenizer.h"

#include <filesystem>

#include "core/error.h"
#include "core/mapped_file.h"
#include "tokenizer/tokenizer_data.h"
#include "tokenizer/utf8.h"

namespace deepinfer {

using tokenizer_detail::Segment;
using tokenizer_detail::TokenizerData;

Tokenizer::Tokenizer(std::shared_ptr<const TokenizerData> data) : data_(std::move(data)) {}

Tokenizer Tokenizer::from_file(const std::string& tokenizer_json_path) {
  auto data = std::make_shared<TokenizerData>();
  tokenizer_detail::load_tokenizer_json(read_text_file(tokenizer_json_path), tokenizer_json_path, *data);
  return Tokenizer(std::move(data));
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, const std::string& source_name) {
  auto data = std::make_shared<TokenizerData>();
  tokenizer_detail::load_tokenizer_json(tokenizer_json, source_name, *data);
  return Tokenizer(std::move(data));
}

Tokenizer Tokenizer::from_dir(const std::string& dir) {
  const std::filesystem::path root(dir);
  const std::string json_path = (root / "tokenizer.json").string();
  const std::string config_path = (root / "tokenizer_config.json").string();
  if (!std::filesystem::exists(json_path)) fail(json_path, ": not found (tokenizer directory '", dir, "')");
  auto data = std::make_shared<TokenizerData>();
  tokenizer_detail::load_tokenizer_json(read_text_file(json_path), json_path, *data);
  if (std::filesystem::exists(config_path)) {
    tokenizer_detail::load_tokenizer_config(read_text_file(config_path), config_path, *data);
  }
  // transformers 5 saves the template next to the config instead of inside it.
  const std::string jinja_path = (root / "chat_template.jinja").string();
  if (data->chat_template.empty() && std::filesystem::exists(jinja_path)) data->chat_template = read_text_file(jinja_path);
  return Tokenizer(std::move(data));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const TokenizerData& d = *data_;
  const size_t invalid_at = tokenizer_detail::find_invalid_utf8(text);
  if (invalid_at != std::string_view::npos) {
    fail("Tokenizer::encode: text is not valid UTF-8 at byte ", invalid_at, " (of ", text.size(), ")");
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_special_tokens && d.add_bos_token) ids.push_back(d.bos_id);

  // Added tokens: non-normalized ones over the whole text, then normalized ones in between
  // (the normalizer is the identity; see tokenizer_json.cpp).
  std::vector<Segment> outer, segments;
  d.non_normalized_tokens.split(text, 0, text.size(), outer);
  for (const Segment& s : outer) {
    if (s.id >= 0) {
      segments.push_back(s);
    } else {
      d.normalized_tokens.split(text, s.begin, s.end, segments);
    }
  }

  tokenizer_detail::PreTokenizer::Scratch scratch(d.pre_tokenizer);
  const auto on_piece = [&](std::string_view piece) { d.bpe.encode_word(piece, ids); };
  for (const Segment& s : segments) {
    if (s.id >= 0) {
      ids.push_back(s.id);
    } else if (s.end > s.begin) {
      d.pre_tokenizer.split(text.substr(s.begin, s.end - s.begin), scratch, on_piece);
    }
  }
  if (add_special_tokens && d.add_eos_token) ids.push_back(d.eos_id);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const TokenizerData& d = *data_;
  std::string bytes;
  for (int32_t id : ids) {
    if (!has_token(id)) continue;  // HF drops ids it does not know
    if (skip_special_tokens && d.special[static_cast<size_t>(id)]) continue;
    bytes += d.token_bytes[static_cast<size_t>(id)];
  }
  std::string out;
  out.reserve(bytes.size());
  tokenizer_detail::append_utf8_lossy(bytes, /*final=*/true, out);
  return out;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(data_->token_strings.size()); }

bool Tokenizer::has_token(int32_t id) const {
  return id >= 0 && id < vocab_size() && data_->present[static_cast<size_t>(id)];
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  DI_CHECK(has_token(id), data_->path, ": token id ", id, " is not in the vocabulary (size ", vocab_size(), ")");
  return data_->token_bytes[static_cast<size_t>(id)];
}

const std::string& Tokenizer::token_string(int32_t id) const {
  DI_CHECK(has_token(id), data_->path, ": token id ", id, " is not in the vocabulary (size ", vocab_size(), ")");
  return data_->token_strings[static_cast<size_t>(id)];
}

bool Tokenizer::is_special(int32_t id) const { return has_token(id) && data_->special[static_cast<size_t>(id)]; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = data_->string_to_id.find(token);
  if (it == data_->string_to_id.end()) return std::nullopt;
  return it->second;
}

int32_t Tokenizer::bos_id() const { return data_->bos_id; }
int32_t Tokenizer::eos_id() const { return data_->eos_id; }
bool Tokenizer::add_bos_token() const { return data_->add_bos_token; }
const std::string& Tokenizer::chat_template() const { return data_->chat_template; }
ChatFormat Tokenizer::chat_format() const { return chat_format_of_template(data_->chat_template); }
bool Tokenizer::add_eos_token() const { return data_->add_eos_token; }

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDecoder::push(int32_t id) {
  if (!tokenizer_->has_token(id)) return {};
  if (skip_special_tokens_ && tokenizer_->is_special(id)) return {};
  pending_bytes_ += tokenizer_->token_bytes(id);
  std::string out;
  const size_t consumed = tokenizer_detail::append_utf8_lossy(pending_bytes_, /*final=*/false, out);
  pending_bytes_.erase(0, consumed);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out;
  tokenizer_detail::append_utf8_lossy(pending_bytes_, /*final=*/true, out);
  pending_bytes_.clear();
  return out;
}

}  // namespace deepinfer
