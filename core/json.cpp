// parse_json / json_snippet: see json.h.
#include "core/json.h"

#include <cstdint>
#include <memory>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/error.h"

namespace deepinfer {

size_t find_invalid_utf8_offset(std::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t b = p[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    // Lead byte: sequence length and the allowed range of the second byte (Unicode Table 3-7).
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      lo = b == 0xE0 ? 0xA0 : 0x80;
      hi = b == 0xED ? 0x9F : 0xBF;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      lo = b == 0xF0 ? 0x90 : 0x80;
      hi = b == 0xF4 ? 0x8F : 0xBF;
    } else {
      return i;
    }
    if (n - i < len) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return i;
    i += len;
  }
  return std::string_view::npos;
}

namespace {

// Largest prefix length <= max_bytes of s that does not end inside a UTF-8 sequence.
size_t utf8_prefix(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s.size();
  size_t k = max_bytes;
  while (k > 0 && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) --k;
  return k;
}

}  // namespace

std::string line_and_column(std::string_view text, size_t offset) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return detail::concat("line ", line, ", column ", col);
}

namespace {

// Depth of arrays/objects at every point, tracking strings as the parser's lexer does. On
// text the parser accepts up to some point, this depth is exactly the parser's there, so
// refusing here means the parser never builds (nor later code walks) a deeper value.
void check_depth(std::string_view text, std::string_view what, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        fail(what, ": JSON nested deeper than the limit of ", max_depth, " arrays/objects at byte offset ", i, " (",
             line_and_column(text, i), ")");
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

// Builds the value from the parser's events with an explicit stack (no recursion), checking
// duplicate keys in linear time.
template <class J>
class Builder {
 public:
  using number_integer_t = typename J::number_integer_t;
  using number_unsigned_t = typename J::number_unsigned_t;
  using number_float_t = typename J::number_float_t;
  using string_t = typename J::string_t;
  using binary_t = typename J::binary_t;
  static constexpr bool kOrdered = std::is_same_v<J, nlohmann::ordered_json>;

  Builder(std::string_view what, bool allow_duplicates) : what_(what), allow_duplicates_(allow_duplicates) {}

  bool null() { return put(J(nullptr)); }
  bool boolean(bool v) { return put(J(v)); }
  bool number_integer(number_integer_t v) { return put(J(v)); }
  bool number_unsigned(number_unsigned_t v) { return put(J(v)); }
  bool number_float(number_float_t v, const string_t&) { return put(J(v)); }
  bool string(string_t& v) { return put(J(std::move(v))); }
  bool binary(binary_t&) { return put(J(nullptr)); }  // not produced by the JSON reader
  bool start_object(std::size_t) {
    J* o = place(J(J::value_t::object));
    stack_.push_back({o, nullptr});
    return true;
  }
  bool key(string_t& k) {
    Frame& f = stack_.back();
    auto& obj = f.value->template get_ref<typename J::object_t&>();
    if constexpr (kOrdered) {
      if (!f.keys) f.keys = std::make_unique<std::unordered_set<std::string>>();
      if (!f.keys->insert(k).second) {
        if (!allow_duplicates_) duplicate(k);
        for (auto& [name, value] : obj)
          if (name == k) slot_ = &value;
        return true;
      }
      auto& vec = static_cast<typename J::object_t::Container&>(obj);
      vec.emplace_back(std::move(k), J());
      slot_ = &vec.back().second;
    } else {
      auto [it, inserted] = obj.emplace(std::move(k), J());
      if (!inserted && !allow_duplicates_) duplicate(it->first);
      slot_ = &it->second;
    }
    return true;
  }
  bool end_object() {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    J* a = place(J(J::value_t::array));
    stack_.push_back({a, nullptr});
    return true;
  }
  bool end_array() {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) {
    error_position_ = position;
    error_ = ex.what();
    return false;
  }

  J root;
  std::string error_;
  size_t error_position_ = 0;

 private:
  struct Frame {
    J* value;
    std::unique_ptr<std::unordered_set<std::string>> keys;  // ordered objects: names seen
  };
  [[noreturn]] void duplicate(const std::string& k) const {
    fail(what_, ": key '", text_snippet(k), "' appears twice in one JSON object (keys must be unique)");
  }
  // Stores v where the next value goes; returns where it went (stable while it is open:
  // a container only grows at its back, and only while no child is open).
  J* place(J&& v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    J& top = *stack_.back().value;
    if (top.is_array()) {
      auto& arr = top.template get_ref<typename J::array_t&>();
      arr.push_back(std::move(v));
      return &arr.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }
  bool put(J&& v) {
    place(std::move(v));
    return true;
  }

  std::string_view what_;
  bool allow_duplicates_;
  std::vector<Frame> stack_;
  J* slot_ = nullptr;
};

template <class J>
J parse_impl(std::string_view text, std::string_view what, const JsonLimits& limits) {
  if (text.size() > limits.max_bytes)
    fail(what, ": ", text.size(), " bytes of JSON is over the limit of ", limits.max_bytes, " bytes");
  const size_t bad = find_invalid_utf8_offset(text);
  if (bad != std::string_view::npos)
    fail(what, ": not valid JSON: invalid UTF-8 at byte offset ", bad, " (", line_and_column(text, bad), ")");
  check_depth(text, what, limits.max_depth);
  Builder<J> b(what, limits.allow_duplicate_keys);
  const bool ok = J::sax_parse(text.data(), text.data() + text.size(), &b);
  if (!ok) {
    // nlohmann's message ends with the token read so far, which may be long: keep the start.
    std::string msg = b.error_;
    if (size_t p = msg.find("] "); msg.rfind("[json.exception", 0) == 0 && p != std::string::npos) msg.erase(0, p + 2);
    // Its lexer reads bytes, so the token it quotes can end inside a multi-byte character: the
    // message must stay valid UTF-8 (it is written into JSON result lines and HTTP bodies).
    for (size_t bad_byte; (bad_byte = find_invalid_utf8_offset(msg)) != std::string_view::npos;)
      msg[bad_byte] = '?';
    msg = text_snippet(msg, 160);
    fail(what, ": not valid JSON at byte offset ", b.error_position_, ": ", msg);
  }
  return std::move(b.root);
}

template <class J>
std::string snippet_impl(const J& v, size_t max_chars) {
  std::string out;
  // A string longer than the whole budget is cut before quoting (the result is cut anyway).
  auto quote = [&](std::string_view s) {
    out += J(std::string(s.substr(0, utf8_prefix(s, max_chars + 1)))).dump(-1, ' ', false, J::error_handler_t::replace);
  };
  auto scalar = [&](const J& x) {
    if (x.is_string()) {
      quote(x.template get_ref<const std::string&>());
    } else if (x.is_binary()) {
      out += "<binary>";
    } else {
      out += x.dump();
    }
  };
  struct Frame {
    const J* value;
    typename J::const_iterator it;
    bool first;
  };
  std::vector<Frame> stack;
  auto open = [&](const J& x) {
    if (x.is_structured()) {
      out += x.is_object() ? '{' : '[';
      stack.push_back({&x, x.cbegin(), true});
    } else {
      scalar(x);
    }
  };
  open(v);
  while (!stack.empty() && out.size() <= max_chars) {
    Frame& f = stack.back();
    if (f.it == f.value->cend()) {
      out += f.value->is_object() ? '}' : ']';
      stack.pop_back();
      continue;
    }
    if (!f.first) out += ',';
    f.first = false;
    const auto it = f.it++;
    if (f.value->is_object()) {
      quote(it.key());
      out += ':';
    }
    open(*it);  // may invalidate f
  }
  if (out.size() > max_chars) {
    out.resize(utf8_prefix(out, max_chars));
    out += "...";
  }
  return out;
}

}  // namespace

nlohmann::json parse_json(std::string_view text, std::string_view what, const JsonLimits& limits) {
  return parse_impl<nlohmann::json>(text, what, limits);
}

nlohmann::ordered_json parse_ordered_json(std::string_view text, std::string_view what, const JsonLimits& limits) {
  return parse_impl<nlohmann::ordered_json>(text, what, limits);
}

std::string json_snippet(const nlohmann::json& v, size_t max_chars) { return snippet_impl(v, max_chars); }
std::string json_snippet(const nlohmann::ordered_json& v, size_t max_chars) { return snippet_impl(v, max_chars); }

std::string text_snippet(std::string_view text, size_t max_chars) {
  if (text.size() <= max_chars) return std::string(text);
  return detail::concat(text.substr(0, utf8_prefix(text, max_chars)), "... (", text.size(), " bytes)");
}

}  // namespace deepinfer
