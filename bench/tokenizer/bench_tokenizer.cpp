// bench_tokenizer TOKENIZER_DIR STRINGS.jsonl: single-threaded encode speed over a file of JSON
// strings (one per line), a cold pass (empty word cache) then a warm pass. Prints one JSON
// record; bench/tokenizer/bench_tokenizer.py runs it next to HF `tokenizers`.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: bench_tokenizer TOKENIZER_DIR STRINGS.jsonl\n");
    return 2;
  }
  try {
    const auto load_start = std::chrono::steady_clock::now();
    const auto tok = deepinfer::Tokenizer::from_dir(argv[1]);
    const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
    std::ifstream in(argv[2]);
    std::vector<std::string> texts;
    size_t num_bytes = 0;
    for (std::string line; std::getline(in, line);) {
      texts.push_back(nlohmann::json::parse(line).get<std::string>());
      num_bytes += texts.back().size();
    }
    nlohmann::json record = {{"impl", "deepinfer"}, {"num_strings", texts.size()}, {"num_bytes", num_bytes},
                             {"load_seconds", load_seconds}};
    for (const char* pass : {"cold", "warm"}) {
      size_t num_tokens = 0;
      const auto start = std::chrono::steady_clock::now();
      for (const auto& t : texts) num_tokens += tok.encode(t).size();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      record[std::string(pass)] = {{"seconds", seconds}, {"num_tokens", num_tokens},
                                   {"mb_per_s", num_bytes / seconds / 1e6}, {"tokens_per_s", num_tokens / seconds}};
    }
    std::cout << record.dump() << "\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
    return 1;
  }
  return 0;
}
