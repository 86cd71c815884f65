// Test helpers: read gzip JSONL fixtures (made by tools/tokenizer/*.py with HF tokenizers /
// transformers) and locate tokenizer directories.
#pragma once
#include <zlib.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace deepinfer::test {

inline std::string tokenizer_data_dir() { return std::string(DEEPINFER_SOURCE_DIR) + "/tests/unit/tokenizer/data"; }
inline std::string deepseek_v3_dir() { return std::string(DEEPINFER_SHARED_DIR) + "/data/tokenizers/deepseek-v3"; }
inline std::string tiny_dir() { return tokenizer_data_dir() + "/tiny"; }
inline bool have_deepseek_v3() { return std::filesystem::exists(deepseek_v3_dir() + "/tokenizer.json"); }

inline std::vector<nlohmann::json> read_jsonl_gz(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) throw std::runtime_error("cannot open " + path);
  std::vector<nlohmann::json> rows;
  std::string line;
  char buffer[1 << 16];
  while (gzgets(file, buffer, sizeof(buffer)) != nullptr) {
    line += buffer;
    if (!line.empty() && line.back() == '\n') {
      rows.push_back(nlohmann::json::parse(line));
      line.clear();
    }
  }
  if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  gzclose(file);
  return rows;
}

}  // namespace deepinfer::test
