// Fuzzes the JSONL request reader of `deepinfer generate --input`: the input is a whole
// JSONL file, split by JsonlReader (small line limit here) and each line parsed by
// parse_request_line; the same bytes are read as a generation_config.json. Anything may be
// refused with deepinfer::Error, with a message that quotes at most a few bytes of the input
// and is valid UTF-8 (it is written into a JSON result line); nothing may crash or hang.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "app/request_line.h"
#include "core/error.h"
#include "tokenizer/utf8.h"

namespace {
void check_message(const deepinfer::Error& e) {
  const std::string m = e.what();
  if (m.size() > 400 || deepinfer::tokenizer_detail::find_invalid_utf8(m) != std::string::npos) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deepinfer;
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::istringstream in(text);
  app::JsonlReader reader(in, 4096);
  SamplingParams defaults;
  while (auto line = reader.next()) {
    if (line->too_long) continue;
    try {
      app::parse_request_line(line->text, line->line_no, defaults);
    } catch (const Error& e) {
      check_message(e);
    }
  }
  try {
    app::parse_generation_config(text, "generation_config.json");
  } catch (const Error& e) {
    check_message(e);
  }
  return 0;
}
