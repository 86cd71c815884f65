// UTF-8 helpers for the tokenizer: validation, Rust-compatible lossy decoding (each maximal
// invalid subpart becomes one U+FFFD, as String::from_utf8_lossy, which HF's decoder uses) and
// the split point that keeps an incomplete trailing character back for streaming.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace deepinfer::tokenizer_detail {

// Byte offset of the first byte that is not part of valid UTF-8, or npos when all is valid.
size_t find_invalid_utf8(std::string_view bytes);

// Appends `bytes` to `out` with invalid subparts replaced by U+FFFD. When `final` is false an
// incomplete but so-far-valid character at the end is not consumed; returns the number of
// bytes consumed (bytes.size() when final).
size_t append_utf8_lossy(std::string_view bytes, bool final, std::string& out);

// Decodes the code point starting at bytes[pos] (valid UTF-8 assumed); sets num_bytes.
uint32_t decode_code_point(std::string_view bytes, size_t pos, size_t& num_bytes);
void append_code_point(uint32_t code_point, std::string& out);

// Unicode White_Space (as Rust regex's \s, used by HF for added-token lstrip/rstrip).
bool is_unicode_white_space(uint32_t code_point);

}  // namespace deepinfer::tokenizer_detail
