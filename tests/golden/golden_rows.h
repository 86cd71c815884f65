// Logits-row helpers shared by the paged golden tests (V4, V4.1): argmax, bit equality of rows,
// and several sequences stepped together in chunks that differ per sequence and step.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "paged_driver.h"

namespace deepinfer::test {

using Rows = std::vector<std::vector<float>>;

inline int32_t argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// Bit equality of logits rows (NaN included: a NaN row equals nothing, not even itself).
inline void expect_same_bits(const Rows& a, const Rows& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t r = 0; r < a.size(); ++r) {
    ASSERT_EQ(a[r].size(), b[r].size()) << what;
    for (size_t v = 0; v < a[r].size(); ++v)
      ASSERT_TRUE(a[r][v] == b[r][v])
          << what << ": row " << r << " col " << v << ": " << a[r][v] << " vs " << b[r][v];
  }
}

// Prompt-logit rows of `seqs` computed together on `driver`, in chunks that differ per
// sequence and step (1 to 11 tokens, decode included).
inline std::vector<Rows> batched_steps(PagedDriver& driver,
                                       const std::vector<std::vector<int32_t>>& seqs) {
  std::vector<int> ids;
  std::vector<size_t> done(seqs.size(), 0);
  std::vector<Rows> got(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) ids.push_back(driver.add_sequence());
  for (int step = 0;; ++step) {
    std::vector<PagedDriver::Chunk> chunks;
    std::vector<size_t> which;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const size_t len =
          std::min(seqs[i].size() - done[i], static_cast<size_t>(1 + (step * 5 + i * 3) % 11));
      if (len == 0) continue;
      chunks.push_back(
          {ids[i], {seqs[i].begin() + done[i], seqs[i].begin() + done[i] + len}, true});
      which.push_back(i);
      done[i] += len;
    }
    if (chunks.empty()) return got;
    const Rows rows = driver.step(chunks);
    size_t r = 0;
    for (size_t c = 0; c < chunks.size(); ++c)
      for (size_t k = 0; k < chunks[c].tokens.size(); ++k) got[which[c]].push_back(rows[r++]);
  }
}

}  // namespace deepinfer::test
