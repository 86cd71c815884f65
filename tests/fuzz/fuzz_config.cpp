// libFuzzer target for the config reader and the JSON reading policy (core/json.h). The first
// input byte picks a mode:
//   0: the rest is config.json contents for parse_model_config;
//   1: the rest is spliced into the embedded tiny model's config.json at a position given by
//      the next two bytes (near-valid JSON reaches the field checks);
//   2: the rest goes to parse_json / parse_ordered_json: when accepted, the value must equal
//      nlohmann's own parse of the same text, and json_snippet must stay within its bound.
// Any deepinfer::Error is an accepted outcome; crashes, leaks, UB and hangs are not.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/error.h"
#include "core/json.h"
#include "core/mapped_file.h"
#include "model/config.h"

namespace {

const std::string& tiny_config() {
  static const std::string text =
      deepinfer::read_text_file(std::string(DEEPINFER_SOURCE_DIR) + "/models/deepseek-v3-tiny-code/config.json");
  return text;
}

void check_reader(std::string_view text) {
  nlohmann::json v;
  try {
    v = deepinfer::parse_json(text, "fuzz.json");
  } catch (const deepinfer::Error&) {
    return;
  }
  // Accepted: nlohmann must accept it too, with the same value (no duplicate keys here).
  const nlohmann::json reference = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (reference.is_discarded() || reference != v) std::abort();
  if (deepinfer::json_snippet(v, 64).size() > 67) std::abort();
  const nlohmann::ordered_json o = deepinfer::parse_ordered_json(text, "fuzz.json");
  if (o.dump() != nlohmann::ordered_json::parse(text.begin(), text.end()).dump()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    switch (data[0] % 3) {
      case 0:
        deepinfer::parse_model_config(rest, "fuzz/config.json");
        break;
      case 1: {
        if (rest.size() < 2) return 0;
        const std::string& base = tiny_config();
        const size_t at = (static_cast<uint8_t>(rest[0]) | (static_cast<uint8_t>(rest[1]) << 8)) % (base.size() + 1);
        std::string text = base.substr(0, at);
        text.append(rest.substr(2));
        text.append(base.substr(at));
        deepinfer::parse_model_config(text, "fuzz/config.json");
        break;
      }
      default:
        check_reader(rest);
    }
  } catch (const deepinfer::Error&) {
  }
  return 0;
}
