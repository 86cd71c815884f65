// A Tokenizer is shared by threads for const calls (the word cache is internally locked);
// copies share the loaded data.
#include <gtest/gtest.h>

#include <thread>

#include "tests/unit/tokenizer/fixture.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

TEST(TokenizerThreads, ConcurrentEncodeAgrees) {
  const Tokenizer tok = Tokenizer::from_dir(test::tiny_dir());
  const auto rows = test::read_jsonl_gz(test::tokenizer_data_dir() + "/tiny_fixture.jsonl.gz");
  std::vector<std::thread> threads;
  std::vector<size_t> num_wrong(4, 0);
  for (size_t t = 0; t < num_wrong.size(); ++t) {
    threads.emplace_back([&, t] {
      const Tokenizer copy = tok;  // cheap: shares data
      for (size_t i = t; i < rows.size(); i += 2) {
        if (copy.encode(rows[i]["text"].get<std::string>()) != rows[i]["ids"].get<std::vector<int32_t>>()) {
          ++num_wrong[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (size_t n : num_wrong) EXPECT_EQ(n, 0u);
}

}  // namespace
}  // namespace deepinfer
