// TempDir: a fresh directory under $TMPDIR (or /tmp) removed with its files
// when the test ends; helpers to write raw files into it.
#pragma once
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace deepinfer::testing {

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base ? base : "/tmp") + "/deepinfer_io_XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    path_ = ::mkdtemp(buf.data()) ? std::string(buf.data()) : std::string();
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream out(file(name), std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return file(name);
  }

 private:
  std::string path_;
};

// A safetensors image with the given header text (not validated, padded with
// spaces to a multiple of 8 bytes) and `data_bytes` bytes of data;
// `header_len` overrides the length prefix when >= 0.
inline std::string safetensors_image(std::string header, size_t data_bytes,
                                     int64_t header_len = -1) {
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t len = header_len >= 0 ? static_cast<uint64_t>(header_len) : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  out += header;
  out.append(data_bytes, '\x01');
  return out;
}

}  // namespace deepinfer::testing
