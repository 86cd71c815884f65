// GPT-2 byte-level alphabet: each byte maps to one printable code point (bytes '!'..'~',
// 0xA1..0xAC, 0xAE..0xFF map to themselves; the other 68 bytes to U+0100..U+0143), so BPE
// vocabularies are strings like "Ġthe" (Ġ = U+0120 = byte 0x20).
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace deepinfer::tokenizer_detail {

// The byte-level string of raw bytes ("\x20the" -> "Ġthe").
std::string byte_level_encode(std::string_view bytes);
// The raw bytes of a byte-level string, or nullopt when a character is not in the alphabet
// (HF's ByteLevel decoder then keeps the token's own UTF-8 text). `token` must be valid UTF-8.
std::optional<std::string> byte_level_decode(std::string_view token);

}  // namespace deepinfer::tokenizer_detail
