// Safetensors checkpoints: one file (SafetensorsFile) or a directory with
// `model.safetensors` or shards named by `model.safetensors.index.json`
// (CheckpointReader). Files are memory-mapped; tensor() returns a zero-copy
// view into the mapping, valid while the reader (or file) lives. Views are
// read-only by convention even though Tensor::data is a plain void*.
//
// File format (https://github.com/huggingface/safetensors):
//   [u64 little-endian N][N bytes JSON header][data]
//   header: {"__metadata__": {str: str}, "<name>": {"dtype": "BF16",
//            "shape": [d0, ...], "data_offsets": [begin, end]}, ...}
//   offsets are relative to the start of data (8 + N).
// Everything is validated when a file is opened: header length within the
// file, JSON object, known dtype, shape entries >= 0 without overflow,
// 0 <= begin <= end <= data size, end - begin == numel * dtype size, no two
// tensors overlapping, no duplicate names, and data aligned for the dtype
// (the reference writer sorts tensors by dtype size so this always holds).
// Errors name the file, the tensor and what was expected.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"
#include "core/tensor.h"

namespace deepinfer {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t data_begin = 0;  // byte offsets relative to the file's data section
  uint64_t data_end = 0;
  std::string file;  // path of the file holding it (for error messages)

  int64_t numel() const;
  uint64_t num_bytes() const { return data_end - data_begin; }
};

// The parsed header of one safetensors file, without the data. Used by
// SafetensorsFile and, on its own, by the fuzzer.
struct SafetensorsHeader {
  uint64_t data_offset = 0;  // 8 + header length: where the data section starts
  std::vector<TensorInfo> tensors;  // in header order
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// Parses and validates the header of a safetensors file image `bytes[0, size)`.
// `path` is only used in error messages. Throws Error on any inconsistency.
SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size,
                                           const std::string& path);

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws Error naming the file and tensor.
  explicit SafetensorsFile(const std::string& path);
  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;

  const std::string& path() const { return file_.path(); }
  bool has(std::string_view name) const;
  // Throws Error naming the file and tensor when absent.
  const TensorInfo& info(std::string_view name) const;
  // Zero-copy CPU view of the tensor's bytes in the mapping.
  Tensor tensor(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  uint64_t data_bytes() const;  // sum of tensor byte sizes
  // The whole mapping (for touching pages to prefetch).
  const uint8_t* mapping() const { return file_.data(); }
  size_t mapping_size() const { return file_.size(); }

 private:
  MappedFile file_;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> header_.tensors index
};

// (bytes done, bytes total) progress callback with a user pointer, as in LoadOptions.
using ProgressFn = void (*)(uint64_t done, uint64_t total, void* user);

class CheckpointReader {
 public:
  // `path` is a directory holding model.safetensors or
  // model.safetensors.index.json (+ its shards), or a single .safetensors file.
  // Index checks: every shard exists and is valid, every tensor the index maps
  // to a shard is in that shard, no tensor appears in two shards.
  static CheckpointReader open(const std::string& path);

  CheckpointReader(CheckpointReader&&) noexcept = default;
  CheckpointReader& operator=(CheckpointReader&&) noexcept = default;

  const std::string& path() const { return path_; }
  bool has(std::string_view name) const;
  // Throws Error naming the checkpoint and tensor when absent.
  const TensorInfo& info(std::string_view name) const;
  Tensor tensor(std::string_view name) const;  // zero-copy mmapped view
  std::vector<std::string> names() const;      // sorted
  uint64_t total_bytes() const;                // sum of all tensors' bytes
  std::vector<std::string> files() const;      // shard paths in load order
  // Reads one byte per page of every tensor so later use does not stall on
  // page faults (and a truncated/unreadable file fails here, not mid-forward).
  // Reports progress in bytes of tensor data.
  void touch_all(ProgressFn progress = nullptr, void* user = nullptr) const;

 private:
  CheckpointReader() = default;
  const SafetensorsFile& file_of(std::string_view name) const;

  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t, std::less<>> owner_;  // tensor name -> files_ index
};

}  // namespace deepinfer
