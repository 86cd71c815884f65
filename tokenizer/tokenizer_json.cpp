// Loads HF tokenizer.json and tokenizer_config.json into TokenizerData. Every malformed or
// unsupported field raises Error "<file>: <json path>: <what was expected>".
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_data.h"

namespace deepinfer::tokenizer_detail {
namespace {

using json = nlohmann::json;

// Ids are dense in real vocabularies (DeepSeek: 128,815); the cap keeps a hostile file from
// allocating gigabytes for a single huge id.
constexpr int64_t kMaxTokenId = (int64_t{1} << 21) - 1;

class Reader {
 public:
  explicit Reader(const std::string& file) : file_(file) {}

  [[noreturn]] void error(const std::string& path, const std::string& what) const {
    fail(file_, ": ", path.empty() ? "(root)" : path, ": ", what);
  }
  const json& member(const json& obj, const char* key, const std::string& path) const {
    if (!obj.is_object()) error(path, std::string("expected an object, got ") + obj.type_name());
    auto it = obj.find(key);
    if (it == obj.end()) error(join(path, key), "missing (required)");
    return *it;
  }
  // nullptr when absent or null.
  const json* optional(const json& obj, const char* key, const std::string& path) const {
    if (!obj.is_object()) error(path, std::string("expected an object, got ") + obj.type_name());
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  std::string string(const json& j, const std::string& path) const {
    if (!j.is_string()) error(path, std::string("expected a string, got ") + j.type_name());
    return j.get<std::string>();
  }
  bool boolean(const json& obj, const char* key, const std::string& path, bool fallback) const {
    const json* j = optional(obj, key, path);
    if (j == nullptr) return fallback;
    if (!j->is_boolean()) error(join(path, key), std::string("expected a boolean, got ") + j->type_name());
    return j->get<bool>();
  }
  int32_t token_id(const json& j, const std::string& path) const {
    if (!j.is_number_integer()) error(path, std::string("expected an integer id, got ") + j.type_name());
    const auto id = j.get<int64_t>();
    if (id < 0 || id > kMaxTokenId) error(path, "id " + std::to_string(id) + " out of range [0, 2^21)");
    return static_cast<int32_t>(id);
  }
  std::string where(const std::string& path) const { return file_ + ": " + path; }
  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }
  static std::string index(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

 private:
  const std::string& file_;
};

bool is_identity_normalizer(const Reader& r, const json& j, const std::string& path) {
  if (j.is_null()) return true;
  const std::string type = r.string(r.member(j, "type", path), Reader::join(path, "type"));
  if (type != "Sequence") return false;
  const json& list = r.member(j, "normalizers", path);
  const std::string list_path = Reader::join(path, "normalizers");
  if (!list.is_array()) r.error(list_path, std::string("expected an array, got ") + list.type_name());
  for (size_t i = 0; i < list.size(); ++i) {
    if (!is_identity_normalizer(r, list[i], Reader::index(list_path, i))) return false;
  }
  return true;
}

SplitBehavior parse_behavior(const Reader& r, const json& j, const std::string& path) {
  const std::string s = r.string(j, path);
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  r.error(path, "unknown split behavior '" + s + "'");
}

void parse_pre_tokenizer(const Reader& r, const json& j, const std::string& path,
                         std::vector<PreTokenizerStep>& steps) {
  const std::string type = r.string(r.member(j, "type", path), Reader::join(path, "type"));
  if (type == "Sequence") {
    const json& list = r.member(j, "pretokenizers", path);
    const std::string list_path = Reader::join(path, "pretokenizers");
    if (!list.is_array()) r.error(list_path, std::string("expected an array, got ") + list.type_name());
    for (size_t i = 0; i < list.size(); ++i) parse_pre_tokenizer(r, list[i], Reader::index(list_path, i), steps);
  } else if (type == "Split") {
    PreTokenizerStep step;
    step.kind = PreTokenizerStep::kSplit;
    const json& pattern = r.member(j, "pattern", path);
    const std::string pattern_path = Reader::join(path, "pattern");
    if (const json* regex = r.optional(pattern, "Regex", pattern_path)) {
      step.regex = std::make_unique<Regex>(r.string(*regex, pattern_path + ".Regex"), false,
                                           r.where(pattern_path + ".Regex"));
    } else if (const json* literal = r.optional(pattern, "String", pattern_path)) {
      step.regex = std::make_unique<Regex>(r.string(*literal, pattern_path + ".String"), true,
                                           r.where(pattern_path + ".String"));
    } else {
      r.error(pattern_path, "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    step.behavior = parse_behavior(r, r.member(j, "behavior", path), Reader::join(path, "behavior"));
    step.invert = r.boolean(j, "invert", path, false);
    steps.push_back(std::move(step));
  } else if (type == "ByteLevel") {
    PreTokenizerStep step;
    step.kind = PreTokenizerStep::kByteLevel;
    step.add_prefix_space = r.boolean(j, "add_prefix_space", path, true);
    if (r.boolean(j, "use_regex", path, true)) {
      step.regex = std::make_unique<Regex>(kGpt2Pattern, false, r.where(Reader::join(path, "use_regex")));
    }
    steps.push_back(std::move(step));
  } else {
    r.error(Reader::join(path, "type"),
            "unsupported pre-tokenizer type '" + type + "' (supported: Sequence, Split, ByteLevel)");
  }
}

void check_decoder(const Reader& r, const json& j, const std::string& path) {
  if (j.is_null()) r.error(path, "missing; a ByteLevel decoder is required");
  const std::string type = r.string(r.member(j, "type", path), Reader::join(path, "type"));
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json& list = r.member(j, "decoders", path);
    const std::string list_path = Reader::join(path, "decoders");
    if (!list.is_array() || list.empty()) r.error(list_path, "expected a non-empty array");
    for (size_t i = 0; i < list.size(); ++i) check_decoder(r, list[i], Reader::index(list_path, i));
    return;
  }
  r.error(Reader::join(path, "type"), "unsupported decoder type '" + type + "' (supported: ByteLevel)");
}

void ensure_size(TokenizerData& data, int32_t id) {
  if (static_cast<size_t>(id) < data.token_strings.size()) return;
  const size_t size = static_cast<size_t>(id) + 1;
  data.token_strings.resize(size);
  data.token_bytes.resize(size);
  data.present.resize(size, 0);
  data.special.resize(size, 0);
}

void parse_model(const Reader& r, const json& model, TokenizerData& data, StringMap<int32_t>& vocab) {
  const std::string path = "model";
  if (!model.is_object()) r.error(path, std::string("expected an object, got ") + model.type_name());
  if (const json* type = r.optional(model, "type", path)) {
    const std::string t = r.string(*type, "model.type");
    if (t != "BPE") r.error("model.type", "unsupported model type '" + t + "' (supported: BPE)");
  }
  const json& vocab_json = r.member(model, "vocab", path);
  if (!vocab_json.is_object()) r.error("model.vocab", std::string("expected an object, got ") + vocab_json.type_name());
  for (auto it = vocab_json.begin(); it != vocab_json.end(); ++it) {
    const std::string entry_path = "model.vocab[\"" + it.key() + "\"]";
    const int32_t id = r.token_id(it.value(), entry_path);
    ensure_size(data, id);
    if (data.present[static_cast<size_t>(id)]) {
      r.error(entry_path, "id " + std::to_string(id) + " is also used by '" +
                              data.token_strings[static_cast<size_t>(id)] + "'");
    }
    data.present[static_cast<size_t>(id)] = 1;
    data.token_strings[static_cast<size_t>(id)] = it.key();
    vocab.emplace(it.key(), id);
  }

  auto expect_null_or = [&](const char* key, auto&& ok) {
    if (const json* j = r.optional(model, key, path)) {
      if (!ok(*j)) r.error(Reader::join(path, key), "unsupported value " + json_snippet(*j, 200));
    }
  };
  expect_null_or("dropout", [](const json& j) { return j.is_number() && j.get<double>() == 0.0; });
  expect_null_or("continuing_subword_prefix", [](const json& j) { return j.is_string() && j.get<std::string>().empty(); });
  expect_null_or("end_of_word_suffix", [](const json& j) { return j.is_string() && j.get<std::string>().empty(); });
  if (r.boolean(model, "byte_fallback", path, false)) r.error("model.byte_fallback", "unsupported value true");
  data.bpe.fuse_unk = r.boolean(model, "fuse_unk", path, false);
  data.bpe.ignore_merges = r.boolean(model, "ignore_merges", path, false);
  if (const json* unk = r.optional(model, "unk_token", path)) {
    const std::string token = r.string(*unk, "model.unk_token");
    auto it = vocab.find(token);
    if (it == vocab.end()) r.error("model.unk_token", "token '" + token + "' is not in model.vocab");
    data.bpe.unk_id = it->second;
  }

  for (uint32_t b = 0; b < 256; ++b) {
    auto it = vocab.find(byte_level_encode(std::string(1, static_cast<char>(b))));
    data.bpe.byte_to_id[b] = it == vocab.end() ? -1 : it->second;
  }

  const json& merges = r.member(model, "merges", path);
  if (!merges.is_array()) r.error("model.merges", std::string("expected an array, got ") + merges.type_name());
  data.bpe.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string merge_path = Reader::index("model.merges", i);
    std::string left, right;
    if (merges[i].is_string()) {  // "left right"
      const std::string line = merges[i].get<std::string>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        r.error(merge_path, "expected \"left right\" (two tokens, one space), got '" + line + "'");
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (merges[i].is_array() && merges[i].size() == 2) {
      left = r.string(merges[i][0], merge_path + "[0]");
      right = r.string(merges[i][1], merge_path + "[1]");
    } else {
      r.error(merge_path, std::string("expected a string or a pair of strings, got ") + merges[i].type_name());
    }
    auto find = [&](const std::string& token) {
      auto it = vocab.find(token);
      if (it == vocab.end()) r.error(merge_path, "token '" + token + "' is not in model.vocab");
      return it->second;
    };
    const int32_t left_id = find(left), right_id = find(right), new_id = find(left + right);
    // A repeated pair keeps its last rank, as HF's map built in order.
    data.bpe.merges[BpeModel::pair_key(left_id, right_id)] = {static_cast<uint32_t>(i), new_id};
  }
}

void parse_added_tokens(const Reader& r, const json& list, TokenizerData& data,
                        std::vector<AddedToken>& added) {
  if (!list.is_array()) r.error("added_tokens", std::string("expected an array, got ") + list.type_name());
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = Reader::index("added_tokens", i);
    AddedToken token;
    token.id = r.token_id(r.member(list[i], "id", path), path + ".id");
    token.content = r.string(r.member(list[i], "content", path), path + ".content");
    token.special = r.boolean(list[i], "special", path, false);
    token.single_word = r.boolean(list[i], "single_word", path, false);
    token.lstrip = r.boolean(list[i], "lstrip", path, false);
    token.rstrip = r.boolean(list[i], "rstrip", path, false);
    token.normalized = r.boolean(list[i], "normalized", path, !token.special);
    ensure_size(data, token.id);
    const auto id = static_cast<size_t>(token.id);
    data.present[id] = 1;
    data.token_strings[id] = token.content;
    data.special[id] = token.special ? 1 : 0;
    added.push_back(std::move(token));
  }
}

}  // namespace

void load_tokenizer_json(std::string_view json_text, const std::string& path, TokenizerData& data) {
  data.path = path;
  const json root = parse_json(json_text, path);
  const Reader r(path);
  if (!root.is_object()) r.error("", std::string("expected a JSON object, got ") + root.type_name());

  StringMap<int32_t> vocab;
  parse_model(r, r.member(root, "model", ""), data, vocab);

  std::vector<AddedToken> added;
  if (const json* list = r.optional(root, "added_tokens", "")) parse_added_tokens(r, *list, data, added);

  if (const json* normalizer = r.optional(root, "normalizer", "")) {
    if (!is_identity_normalizer(r, *normalizer, "normalizer")) {
      r.error("normalizer", "unsupported normalizer " + json_snippet(*normalizer, 200) +
                                " (supported: null or an empty Sequence)");
    }
  }

  const json* pre = r.optional(root, "pre_tokenizer", "");
  if (pre == nullptr) r.error("pre_tokenizer", "missing; byte-level BPE needs a ByteLevel pre-tokenizer");
  parse_pre_tokenizer(r, *pre, "pre_tokenizer", data.pre_tokenizer.steps);
  const auto& steps = data.pre_tokenizer.steps;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].kind == PreTokenizerStep::kByteLevel && i + 1 != steps.size()) {
      r.error("pre_tokenizer", "ByteLevel must be the last pre-tokenizer");
    }
  }
  if (steps.empty() || steps.back().kind != PreTokenizerStep::kByteLevel) {
    r.error("pre_tokenizer", "must end with ByteLevel (only byte-level BPE is supported)");
  }
  check_decoder(r, root.contains("decoder") ? root["decoder"] : json(), "decoder");

  // Token tables: bytes per id (HF ByteLevel decoder rule), lookup by string.
  for (size_t id = 0; id < data.token_strings.size(); ++id) {
    if (!data.present[id]) continue;
    const std::string& s = data.token_strings[id];
    auto bytes = byte_level_decode(s);
    data.token_bytes[id] = bytes ? *bytes : s;
  }
  for (const AddedToken& t : added) data.string_to_id[t.content] = t.id;
  for (const auto& [token, id] : vocab) {
    data.string_to_id.emplace(token, id);
    if (auto bytes = byte_level_decode(token)) data.bpe.bytes_to_id.emplace(*bytes, id);
  }

  std::vector<AddedToken> normalized, non_normalized;
  for (AddedToken& t : added) (t.normalized ? normalized : non_normalized).push_back(std::move(t));
  data.non_normalized_tokens = AddedTokenMatcher(std::move(non_normalized));
  data.normalized_tokens = AddedTokenMatcher(std::move(normalized));
}

void load_tokenizer_config(std::string_view json_text, const std::string& path, TokenizerData& data) {
  const json root = parse_json(json_text, path);
  const Reader r(path);
  if (!root.is_object()) r.error("", std::string("expected a JSON object, got ") + root.type_name());
  data.add_bos_token = r.boolean(root, "add_bos_token", "", false);
  data.add_eos_token = r.boolean(root, "add_eos_token", "", false);
  auto resolve = [&](const char* key) -> int32_t {
    const json* j = r.optional(root, key, "");
    if (j == nullptr) return -1;
    // A string, or an AddedToken object {"content": ...}.
    const std::string token = j->is_object() ? r.string(r.member(*j, "content", key), std::string(key) + ".content")
                                             : r.string(*j, key);
    auto it = data.string_to_id.find(token);
    if (it == data.string_to_id.end()) r.error(key, "token '" + token + "' is not in the vocabulary");
    return it->second;
  };
  if (const json* t = r.optional(root, "chat_template", ""); t != nullptr && t->is_string())
    data.chat_template = t->get<std::string>();
  data.bos_id = resolve("bos_token");
  data.eos_id = resolve("eos_token");
  if (data.add_bos_token && data.bos_id < 0) r.error("add_bos_token", "true but bos_token is not set");
  if (data.add_eos_token && data.eos_id < 0) r.error("add_eos_token", "true but eos_token is not set");
}

}  // namespace deepinfer::tokenizer_detail
