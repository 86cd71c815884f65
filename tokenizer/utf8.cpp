// UTF-8 validation and lossy decoding; see utf8.h.
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer_detail {
namespace {

// Result of looking at the sequence starting at bytes[pos].
struct Step {
  enum Kind { kValid, kInvalid, kIncomplete } kind;
  size_t num_bytes;  // valid: the character; invalid: the maximal invalid subpart (>= 1)
};

Step step_at(std::string_view bytes, size_t pos) {
  const auto b0 = static_cast<uint8_t>(bytes[pos]);
  if (b0 < 0x80) return {Step::kValid, 1};
  size_t len = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {Step::kInvalid, 1};
  }
  for (size_t k = 1; k < len; ++k) {
    if (pos + k >= bytes.size()) return {Step::kIncomplete, k};
    const auto b = static_cast<uint8_t>(bytes[pos + k]);
    const uint8_t min = k == 1 ? lo : 0x80, max = k == 1 ? hi : 0xBF;
    if (b < min || b > max) return {Step::kInvalid, k};
  }
  return {Step::kValid, len};
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

size_t find_invalid_utf8(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    // ASCII fast path.
    if (static_cast<uint8_t>(bytes[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Step s = step_at(bytes, pos);
    if (s.kind != Step::kValid) return pos;
    pos += s.num_bytes;
  }
  return std::string_view::npos;
}

size_t append_utf8_lossy(std::string_view bytes, bool final, std::string& out) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const Step s = step_at(bytes, pos);
    if (s.kind == Step::kValid) {
      out.append(bytes.data() + pos, s.num_bytes);
      pos += s.num_bytes;
    } else if (s.kind == Step::kInvalid) {
      out.append(kReplacement);
      pos += s.num_bytes;
    } else {  // incomplete at the end: wait for more bytes unless this is the end
      if (!final) return pos;
      out.append(kReplacement);
      pos = bytes.size();
    }
  }
  return pos;
}

uint32_t decode_code_point(std::string_view bytes, size_t pos, size_t& num_bytes) {
  const auto b0 = static_cast<uint8_t>(bytes[pos]);
  auto cont = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(bytes[pos + k]) & 0x3F); };
  if (b0 < 0x80) {
    num_bytes = 1;
    return b0;
  }
  if (b0 < 0xE0) {
    num_bytes = 2;
    return ((b0 & 0x1Fu) << 6) | cont(1);
  }
  if (b0 < 0xF0) {
    num_bytes = 3;
    return ((b0 & 0x0Fu) << 12) | (cont(1) << 6) | cont(2);
  }
  num_bytes = 4;
  return ((b0 & 0x07u) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
}

void append_code_point(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_unicode_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

}  // namespace deepinfer::tokenizer_detail
