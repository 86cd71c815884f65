// GPT-2 byte-level alphabet; see byte_level.h.
#include "tokenizer/byte_level.h"

#include <array>
#include <cstdint>

#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer_detail {
namespace {

bool maps_to_itself(uint32_t b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Alphabet {
  std::array<uint32_t, 256> byte_to_code_point{};
  std::array<int16_t, 0x144> code_point_to_byte{};  // -1: not in the alphabet
  Alphabet() {
    code_point_to_byte.fill(-1);
    uint32_t next = 0x100;
    for (uint32_t b = 0; b < 256; ++b) {
      byte_to_code_point[b] = maps_to_itself(b) ? b : next++;
      code_point_to_byte[byte_to_code_point[b]] = static_cast<int16_t>(b);
    }
  }
};

// Constant after construction (no mutable global state).
const Alphabet& alphabet() {
  static const Alphabet kAlphabet;
  return kAlphabet;
}

}  // namespace

std::string byte_level_encode(std::string_view bytes) {
  const Alphabet& a = alphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_code_point(a.byte_to_code_point[static_cast<uint8_t>(c)], out);
  return out;
}

std::optional<std::string> byte_level_decode(std::string_view token) {
  const Alphabet& a = alphabet();
  std::string out;
  out.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    size_t num_bytes = 0;
    const uint32_t cp = decode_code_point(token, pos, num_bytes);
    if (cp >= a.code_point_to_byte.size() || a.code_point_to_byte[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(a.code_point_to_byte[cp]));
    pos += num_bytes;
  }
  return out;
}

}  // namespace deepinfer::tokenizer_detail
