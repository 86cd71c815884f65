// libFuzzer target for the tokenizer. The first input byte picks a mode:
//   0: the rest is tokenizer.json contents (then, if it loads, encode a fixed text);
//   1: the rest is text for the tiny trained tokenizer: encode, decode, stream-decode, and check
//      decode(encode(s)) == s and streaming == whole decoding (abort on mismatch);
//   2: the rest is a Split regex placed in an otherwise valid tokenizer.json, then encode;
//   3: the rest is spliced into a valid tokenizer.json at a position given by the next two
//      bytes (near-valid JSON reaches the field checks).
// Any deepinfer::Error is an accepted outcome; crashes, leaks, UB and hangs are not.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "core/mapped_file.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace {

using nlohmann::json;

json template_tokenizer(const std::string& regex) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[deepinfer::tokenizer_detail::byte_level_encode(std::string(1, static_cast<char>(b)))] = b;
  vocab["ab"] = 256;
  vocab["Ġab"] = 257;
  return {{"added_tokens", json::array({{{"id", 258}, {"content", "<s>"}, {"special", true}, {"normalized", false},
                                         {"lstrip", true}, {"rstrip", true}, {"single_word", false}},
                                        {{"id", 259}, {"content", "<w>"}, {"special", false}, {"single_word", true}}})},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "Sequence"},
                             {"pretokenizers", json::array({{{"type", "Split"}, {"pattern", {{"Regex", regex}}},
                                                             {"behavior", "Isolated"}, {"invert", false}},
                                                            {{"type", "ByteLevel"}, {"add_prefix_space", false},
                                                             {"use_regex", true}}})}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a b", "Ġ ab"})}}}};
}

void exercise(const deepinfer::Tokenizer& tok, std::string_view text) {
  try {
    const auto ids = tok.encode(text, true);
    (void)tok.decode(ids, true);
  } catch (const deepinfer::Error&) {
  }
}

const deepinfer::Tokenizer& tiny() {
  static const deepinfer::Tokenizer kTiny =
      deepinfer::Tokenizer::from_dir(std::string(DEEPINFER_SOURCE_DIR) + "/tests/unit/tokenizer/data/tiny");
  return kTiny;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 4;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string_view sample = "ab <s> x<w>y <w> 12345 \xE4\xB8\x96 ab\r\n";
  try {
    if (mode == 0) {
      exercise(deepinfer::Tokenizer::from_json(rest, "fuzz.json"), sample);
    } else if (mode == 1) {
      const auto& tok = tiny();
      std::vector<int32_t> ids;
      try {
        ids = tok.encode(rest);
      } catch (const deepinfer::Error&) {
        return 0;  // not UTF-8
      }
      if (tok.decode(ids) != rest) std::abort();
      deepinfer::IncrementalDecoder decoder(tok);
      std::string streamed;
      for (int32_t id : ids) streamed += decoder.push(id);
      streamed += decoder.flush();
      if (streamed != rest) std::abort();
      // Arbitrary ids: drop unknown ones, never crash.
      std::vector<int32_t> raw;
      for (size_t i = 0; i + 1 < rest.size(); i += 2) raw.push_back(static_cast<int16_t>(rest[i] | (rest[i + 1] << 8)));
      (void)tok.decode(raw);
    } else if (mode == 2) {
      const std::string regex(rest);
      exercise(deepinfer::Tokenizer::from_json(template_tokenizer(regex).dump(), "fuzz.json"), sample);
    } else {
      if (rest.size() < 2) return 0;
      std::string text = template_tokenizer("\\p{N}{1,3}| ?\\p{L}+").dump();
      const size_t pos = (static_cast<uint8_t>(rest[0]) | (static_cast<uint8_t>(rest[1]) << 8)) % (text.size() + 1);
      text.insert(pos, rest.substr(2));
      exercise(deepinfer::Tokenizer::from_json(text, "fuzz.json"), sample);
    }
  } catch (const deepinfer::Error&) {
  } catch (const json::exception&) {
  }
  return 0;
}
