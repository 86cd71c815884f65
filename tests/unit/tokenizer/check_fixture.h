// check_fixture: compares a tokenizer with an HF `tokenizers` fixture (make_fixture.py).
#pragma once
#include <gtest/gtest.h>

#include "tests/unit/tokenizer/fixture.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::test {

inline std::string show(const std::vector<int32_t>& ids) { return nlohmann::json(ids).dump(); }

inline void check_fixture(const Tokenizer& tok, const std::string& fixture_path, size_t min_rows) {
  const auto rows = test::read_jsonl_gz(fixture_path);
  ASSERT_GE(rows.size(), min_rows);
  size_t num_mismatches = 0, num_special_checked = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto text = rows[i]["text"].get<std::string>();
    const auto expected = rows[i]["ids"].get<std::vector<int32_t>>();
    const auto ids = tok.encode(text, false);
    if (ids != expected && ++num_mismatches <= 5) {
      ADD_FAILURE() << "string " << i << " " << nlohmann::json(text).dump() << "\n  ours: " << show(ids)
                    << "\n  HF:   " << show(expected);
    }
    EXPECT_EQ(tok.decode(expected), text) << "string " << i;
    if (rows[i].contains("ids_special")) {
      ++num_special_checked;
      EXPECT_EQ(tok.encode(text, true), rows[i]["ids_special"].get<std::vector<int32_t>>()) << "string " << i;
      EXPECT_EQ(tok.decode(rows[i]["ids_special"].get<std::vector<int32_t>>(), true),
                rows[i]["decoded_skip"].get<std::string>())
          << "string " << i;
    }
  }
  EXPECT_EQ(num_mismatches, 0u) << "of " << rows.size() << " strings";
  EXPECT_GT(num_special_checked, rows.size() / 20);
}

}  // namespace deepinfer::test
