// SafetensorsWriter: writes a .safetensors file (tests, random checkpoints,
// tools). Tensors are laid out in the reference writer's order (dtype size
// descending, then name) so every tensor is aligned for its dtype, and the
// header is padded with spaces to a multiple of 8 bytes.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace deepinfer {

class SafetensorsWriter {
 public:
  // Copies the tensor's bytes (contiguous CPU tensor). Throws on duplicate name.
  void add(const std::string& name, const Tensor& tensor);
  // Raw form: `bytes` must hold numel(shape) * dtype_size(dtype) bytes.
  void add_bytes(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                 const void* bytes, size_t num_bytes);
  void set_metadata(const std::string& key, const std::string& value);
  // Writes the file; throws Error naming the path on I/O failure.
  void write(const std::string& path) const;
  size_t num_tensors() const { return entries_.size(); }

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace deepinfer
