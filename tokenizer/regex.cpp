// PCRE2 wrapper; see regex.h.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer_detail {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

// Bounds backtracking so a hostile pattern (tokenizer.json is input) fails instead of hanging.
constexpr uint32_t kMatchLimit = 10'000'000;

}  // namespace

MatchScratch::MatchScratch(const Regex& regex)
    : match_data_(pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(regex.code_), nullptr)) {
  if (match_data_ == nullptr) throw std::bad_alloc();
}

MatchScratch::~MatchScratch() { pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_)); }

Regex::Regex(const std::string& pattern, bool literal, const std::string& where) : where_(where) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0u);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                        &error_code, &error_offset, nullptr);
  if (code_ == nullptr) {
    fail(where, ": invalid regex '", pattern, "': ", pcre2_message(error_code), " at offset ",
         error_offset);
  }
  // JIT is an optimisation only; without it pcre2_match interprets.
  pcre2_jit_compile(static_cast<pcre2_code*>(code_), PCRE2_JIT_COMPLETE);
  match_context_ = pcre2_match_context_create(nullptr);
  pcre2_set_match_limit(static_cast<pcre2_match_context*>(match_context_), kMatchLimit);
}

Regex::~Regex() {
  pcre2_match_context_free(static_cast<pcre2_match_context*>(match_context_));
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

bool Regex::match_at(std::string_view subject, size_t start, MatchScratch& scratch, size_t& begin,
                     size_t& end) const {
  auto* code = static_cast<pcre2_code*>(code_);
  auto* data = static_cast<pcre2_match_data*>(scratch.match_data_);
  auto* context = static_cast<pcre2_match_context*>(match_context_);
  const auto* ptr = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = pcre2_match(code, ptr, subject.size(), start, PCRE2_NO_UTF_CHECK, data, context);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    // Long runs can outgrow the JIT's default stack; the interpreter uses the heap.
    rc = pcre2_match(code, ptr, subject.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data,
                     context);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) fail(where_, ": regex match failed: ", pcre2_message(rc));
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
  begin = ovector[0];
  end = ovector[1];
  return true;
}

void Regex::find_all(std::string_view subject, MatchScratch& scratch,
                     const std::function<void(size_t, size_t)>& on_match) const {
  size_t search_from = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (search_from <= subject.size()) {
    size_t begin = 0, end = 0;
    if (!match_at(subject, search_from, scratch, begin, end)) break;
    if (begin == end && have_last && last_match_end == end) {
      // Oniguruma's iterator: skip an empty match right after the previous match by one char.
      if (search_from >= subject.size()) break;
      size_t num_bytes = 1;
      decode_code_point(subject, search_from, num_bytes);
      search_from += num_bytes;
      continue;
    }
    search_from = end;
    have_last = true;
    last_match_end = end;
    on_match(begin, end);
    if (begin == end && end >= subject.size()) break;
  }
}

bool Regex::search(std::string_view subject, MatchScratch& scratch) const {
  size_t begin = 0, end = 0;
  return match_at(subject, 0, scratch, begin, end);
}

}  // namespace deepinfer::tokenizer_detail
