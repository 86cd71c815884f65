// Settings: every DEEPINFER_* environment variable, in one table (name, type,
// default, help), read once. `deepinfer info --env` prints the table with the
// values in effect. Modules never call getenv: the engine (or a bench/test
// main) reads env_settings() and passes options down (BackendOptions, ...).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace deepinfer {

enum class SettingType { Bool, Int, String };

struct SettingInfo {
  const char* name;           // "DEEPINFER_BATCH_INVARIANT"
  SettingType type;
  const char* default_value;  // "" = unset (the consumer's own default, described in help)
  const char* help;
};

// The table, in a fixed order.
const std::vector<SettingInfo>& setting_table();

// Parsed values of every table entry (the default where a variable is unset).
class Settings {
 public:
  // Bool: 1/0, true/false, on/off, yes/no (any case). Int: a decimal integer.
  // Throws Error naming the variable and the expected type for a bad value.
  static Settings from(const std::function<const char*(const char*)>& lookup);

  // Typed reads; throw Error for a name not in the table or read with the wrong type.
  bool get_bool(const char* name) const;
  int64_t get_int(const char* name) const;
  const std::string& get_string(const char* name) const;
  // True when the variable was set (non-empty) rather than defaulted.
  bool is_set(const char* name) const;

  // One line per table entry: name, type, value in effect (or "(unset)"), default, help.
  std::string describe() const;

 private:
  struct Value {
    std::string text;  // as read, or the default
    int64_t integer = 0;
    bool set = false;
  };
  const Value& value(const char* name, SettingType type) const;
  std::map<std::string, Value> values_;
};

// The process environment, read on the first call (thread-safe), then fixed.
const Settings& env_settings();

}  // namespace deepinfer
