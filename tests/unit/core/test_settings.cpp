// The DEEPINFER_* settings table (core/settings.h): typed parsing, defaults, errors
// naming the variable, and the table's defaults equal to the option structs' defaults.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "core/error.h"
#include "core/settings.h"

namespace deepinfer {
namespace {

Settings from_map(const std::map<std::string, std::string>& env) {
  return Settings::from([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const std::map<std::string, std::string>& env) {
  try {
    from_map(env);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Settings, TableNamesAreUniqueAndPrefixed) {
  std::set<std::string> seen;
  for (const SettingInfo& s : setting_table()) {
    const std::string name = s.name;
    EXPECT_EQ(name.rfind("DEEPINFER_", 0), 0u) << name;
    EXPECT_TRUE(seen.insert(name).second) << name << " twice";
    EXPECT_NE(std::string(s.help), "") << name;
  }
  for (const char* required : {"DEEPINFER_BATCH_INVARIANT", "DEEPINFER_CUDA_SYNC",
                               "DEEPINFER_NUM_THREADS", "DEEPINFER_LOG"})
    EXPECT_TRUE(seen.count(required)) << required;
}

TEST(Settings, DefaultsWhenUnsetAndTypedValuesWhenSet) {
  const Settings none = from_map({});
  EXPECT_FALSE(none.get_bool("DEEPINFER_BATCH_INVARIANT"));
  EXPECT_FALSE(none.is_set("DEEPINFER_BATCH_INVARIANT"));
  EXPECT_FALSE(none.get_bool("DEEPINFER_CUDA_SYNC"));
  EXPECT_EQ(none.get_int("DEEPINFER_NUM_THREADS"), 0);
  EXPECT_EQ(none.get_string("DEEPINFER_LOG"), "warn");
  EXPECT_EQ(none.get_string("DEEPINFER_HF_MODEL_DIR"), "");

  const Settings set = from_map({{"DEEPINFER_BATCH_INVARIANT", "TRUE"},
                                 {"DEEPINFER_CUDA_SYNC", "on"},
                                 {"DEEPINFER_NUM_THREADS", "-3"},
                                 {"DEEPINFER_HF_MODEL_DIR", "/m"},
                                 {"DEEPINFER_USE_NEXTN_DECODE", ""}});  // empty = unset
  EXPECT_TRUE(set.get_bool("DEEPINFER_BATCH_INVARIANT"));
  EXPECT_TRUE(set.is_set("DEEPINFER_BATCH_INVARIANT"));
  EXPECT_TRUE(set.get_bool("DEEPINFER_CUDA_SYNC"));
  EXPECT_EQ(set.get_int("DEEPINFER_NUM_THREADS"), -3);
  EXPECT_EQ(set.get_string("DEEPINFER_HF_MODEL_DIR"), "/m");
  EXPECT_FALSE(set.is_set("DEEPINFER_USE_NEXTN_DECODE"));
}

TEST(Settings, BadValuesNameTheVariable) {
  const std::string b = error_of({{"DEEPINFER_BATCH_INVARIANT", "maybe"}});
  EXPECT_NE(b.find("DEEPINFER_BATCH_INVARIANT"), std::string::npos) << b;
  EXPECT_NE(b.find("'maybe'"), std::string::npos) << b;
  EXPECT_NE(b.find("bool"), std::string::npos) << b;
  for (const char* bad : {"12x", "x", "99999999999999999999", " 4"}) {
    const std::string i = error_of({{"DEEPINFER_NUM_THREADS", bad}});
    EXPECT_NE(i.find("DEEPINFER_NUM_THREADS"), std::string::npos) << i;
    EXPECT_NE(i.find("integer"), std::string::npos) << i;
  }
}

TEST(Settings, ReadsCheckNameAndType) {
  const Settings s = from_map({});
  EXPECT_THROW(s.get_bool("DEEPINFER_NO_SUCH_SWITCH"), Error);
  EXPECT_THROW(s.is_set("DEEPINFER_NO_SUCH_SWITCH"), Error);
  EXPECT_THROW(s.get_int("DEEPINFER_BATCH_INVARIANT"), Error);   // a bool
  EXPECT_THROW(s.get_string("DEEPINFER_NUM_THREADS"), Error);    // an int
}

TEST(Settings, DescribeListsEveryEntryWithItsValue) {
  const std::string text = from_map({{"DEEPINFER_CUDA_SYNC", "1"}}).describe();
  for (const SettingInfo& s : setting_table())
    EXPECT_NE(text.find(s.name), std::string::npos) << s.name;
  EXPECT_NE(text.find("DEEPINFER_CUDA_SYNC (bool) = 1"), std::string::npos) << text;
  EXPECT_NE(text.find("DEEPINFER_BATCH_INVARIANT (bool) = (unset)  [default: 0]"), std::string::npos)
      << text;
}

}  // namespace
}  // namespace deepinfer
