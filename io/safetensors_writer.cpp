#include "io/safetensors_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace deepinfer {

void SafetensorsWriter::add(const std::string& name, const Tensor& tensor) {
  DI_CHECK(tensor.device == Device::CPU && tensor.is_contiguous(), "SafetensorsWriter: tensor '",
           name, "' must be a contiguous CPU tensor, got ", tensor.describe());
  add_bytes(name, tensor.dtype, tensor.dims(), tensor.data, tensor.num_bytes());
}

void SafetensorsWriter::add_bytes(const std::string& name, DType dtype,
                                  const std::vector<int64_t>& shape, const void* bytes,
                                  size_t num_bytes) {
  DI_CHECK(name != "__metadata__", "SafetensorsWriter: '__metadata__' is not a tensor name");
  DI_CHECK(entries_.count(name) == 0, "SafetensorsWriter: tensor '", name, "' added twice");
  int64_t numel = 1;
  for (int64_t d : shape) {
    DI_CHECK(d >= 0, "SafetensorsWriter: tensor '", name, "' has negative dim in ",
             shape_string(shape));
    numel *= d;
  }
  DI_CHECK(static_cast<size_t>(numel) * dtype_size(dtype) == num_bytes, "SafetensorsWriter: tensor '",
           name, "' ", dtype_name(dtype), shape_string(shape), " needs ",
           static_cast<size_t>(numel) * dtype_size(dtype), " bytes, got ", num_bytes);
  Entry e{dtype, shape, {}};
  const auto* p = static_cast<const uint8_t*>(bytes);
  e.bytes.assign(p, p + num_bytes);
  entries_.emplace(name, std::move(e));
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

void SafetensorsWriter::write(const std::string& path) const {
  // Order: dtype size descending, then name, so every tensor stays aligned.
  std::vector<const std::pair<const std::string, Entry>*> order;
  for (const auto& kv : entries_) order.push_back(&kv);
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return dtype_size(a->second.dtype) > dtype_size(b->second.dtype);
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const auto* kv : order) {
    const Entry& e = kv->second;
    header[kv->first] = {{"dtype", std::string(dtype_name(e.dtype))},
                         {"shape", e.shape},
                         {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(text.size() >> (8 * i));

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  DI_CHECK(out.good(), path, ": cannot create: ", std::strerror(errno));
  out.write(reinterpret_cast<const char*>(len_bytes), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto* kv : order)
    out.write(reinterpret_cast<const char*>(kv->second.bytes.data()),
              static_cast<std::streamsize>(kv->second.bytes.size()));
  out.close();
  DI_CHECK(!out.fail(), path, ": write failed: ", std::strerror(errno));
}

}  // namespace deepinfer
