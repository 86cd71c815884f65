// The check of the speculative-decoding tests: two runs' outputs are the same, token ids,
// finish reasons, text and logprobs bit for bit (tests/unit/spec).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "deepinfer/engine.h"

namespace deepinfer {

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Token ids, finish reasons, text and logprobs (bit for bit) of every sample.
inline void expect_same(const std::vector<RequestOutput>& a, const std::vector<RequestOutput>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].outputs.size(), b[i].outputs.size()) << what << " request " << i;
    for (size_t s = 0; s < a[i].outputs.size(); ++s) {
      const CompletionOutput &x = a[i].outputs[s], &y = b[i].outputs[s];
      ASSERT_EQ(x.token_ids, y.token_ids) << what << " request " << i << " sample " << s;
      EXPECT_EQ(x.text, y.text) << what << " request " << i;
      EXPECT_EQ(x.finish_reason, y.finish_reason) << what << " request " << i;
      ASSERT_EQ(x.logprobs.size(), y.logprobs.size()) << what << " request " << i;
      for (size_t t = 0; t < x.logprobs.size(); ++t) {
        ASSERT_EQ(x.logprobs[t].token_id, y.logprobs[t].token_id);
        ASSERT_EQ(bits(x.logprobs[t].logprob), bits(y.logprobs[t].logprob))
            << what << " request " << i << " token " << t;
        ASSERT_EQ(x.logprobs[t].top.size(), y.logprobs[t].top.size());
        for (size_t j = 0; j < x.logprobs[t].top.size(); ++j) {
          EXPECT_EQ(x.logprobs[t].top[j].first, y.logprobs[t].top[j].first);
          EXPECT_EQ(bits(x.logprobs[t].top[j].second), bits(y.logprobs[t].top[j].second));
        }
      }
    }
  }
}

}  // namespace deepinfer
