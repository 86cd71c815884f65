#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"

namespace deepinfer {

namespace {

using json = nlohmann::json;

// Largest header we accept: the format's own limit is 100 MB.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Reads a non-negative integer that fits uint64 from a JSON value, or fails.
uint64_t json_u64(const json& v, const std::string& path, const std::string& name,
                  const char* what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  fail(path, ": tensor '", name, "': ", what, " must be a non-negative integer, got ", json_snippet(v));
}

TensorInfo parse_entry(const std::string& path, const std::string& full_name, const json& entry,
                       uint64_t data_size) {
  const std::string name = text_snippet(full_name, 200);  // as errors show it
  DI_CHECK(entry.is_object(), path, ": tensor '", name, "': header entry must be an object, got ",
           json_snippet(entry));
  TensorInfo info;
  info.name = full_name;
  info.file = path;

  auto dtype_it = entry.find("dtype");
  DI_CHECK(dtype_it != entry.end() && dtype_it->is_string(), path, ": tensor '", name,
           "': missing string field 'dtype'");
  const std::string dtype_str = dtype_it->get<std::string>();
  DI_CHECK(parse_dtype(dtype_str, &info.dtype) && info.dtype != DType::BOOL, path, ": tensor '",
           name, "': unknown dtype '", dtype_str,
           "' (expected F32, F16, BF16, F8_E4M3, F8_E8M0, I64, I32, I16, I8 or U8)");

  auto shape_it = entry.find("shape");
  DI_CHECK(shape_it != entry.end() && shape_it->is_array(), path, ": tensor '", name,
           "': missing array field 'shape'");
  DI_CHECK(shape_it->size() <= static_cast<size_t>(kMaxDims), path, ": tensor '", name,
           "': rank ", shape_it->size(), " exceeds the supported ", kMaxDims);
  // numel * dtype size must fit in the data section, so bound the product as we go.
  uint64_t numel = 1;
  for (const auto& d : *shape_it) {
    uint64_t dim = json_u64(d, path, name, "every shape entry");
    DI_CHECK(dim <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), path,
             ": tensor '", name, "': shape entry ", dim, " is too large");
    info.shape.push_back(static_cast<int64_t>(dim));
    if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim) {
      fail(path, ": tensor '", name, "': shape ", shape_string(info.shape),
           "... overflows 64-bit element count");
    }
    numel *= dim;
  }
  const uint64_t elem_bytes = dtype_size(info.dtype);
  DI_CHECK(numel <= std::numeric_limits<uint64_t>::max() / elem_bytes, path, ": tensor '", name,
           "': shape ", shape_string(info.shape), " overflows 64-bit byte count");

  auto off_it = entry.find("data_offsets");
  DI_CHECK(off_it != entry.end() && off_it->is_array() && off_it->size() == 2, path,
           ": tensor '", name, "': 'data_offsets' must be [begin, end]");
  info.data_begin = json_u64((*off_it)[0], path, name, "data_offsets[0]");
  info.data_end = json_u64((*off_it)[1], path, name, "data_offsets[1]");
  DI_CHECK(info.data_begin <= info.data_end, path, ": tensor '", name, "': data_offsets [",
           info.data_begin, ", ", info.data_end, "] end before begin");
  DI_CHECK(info.data_end <= data_size, path, ": tensor '", name, "': data_offsets [",
           info.data_begin, ", ", info.data_end, "] past the end of the data section (",
           data_size, " bytes; file truncated?)");
  DI_CHECK(info.num_bytes() == numel * elem_bytes, path, ": tensor '", name, "': ",
           dtype_str, shape_string(info.shape), " needs ", numel * elem_bytes,
           " bytes but data_offsets [", info.data_begin, ", ", info.data_end, "] hold ",
           info.num_bytes());
  return info;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size,
                                           const std::string& path) {
  DI_CHECK(size >= 8, path, ": ", size,
           " bytes is too short for a safetensors file (needs an 8-byte header length)");
  const uint64_t header_len = read_u64_le(bytes);
  DI_CHECK(header_len <= kMaxHeaderBytes, path, ": header length ", header_len,
           " exceeds the 100 MB limit (not a safetensors file?)");
  DI_CHECK(header_len <= size - 8, path, ": header length ", header_len,
           " runs past the end of the file (", size, " bytes; truncated?)");
  SafetensorsHeader header;
  header.data_offset = 8 + header_len;
  const uint64_t data_size = size - header.data_offset;

  // The one JSON policy (core/json.h): bounded depth, UTF-8, duplicate names refused, linear
  // time (nlohmann's callback parser rescanned the whole object after every entry: 40,000
  // tensors took 24 s).
  JsonLimits limits;
  limits.max_bytes = kMaxHeaderBytes;
  const json root = parse_json(std::string_view(reinterpret_cast<const char*>(bytes) + 8, header_len),
                               path + " (safetensors header)", limits);
  DI_CHECK(root.is_object(), path, ": header must be a JSON object, got ", root.type_name());

  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__") {
      DI_CHECK(it.value().is_object(), path, ": __metadata__ must be an object of strings");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        DI_CHECK(m.value().is_string(), path, ": __metadata__['", text_snippet(m.key(), 200),
                 "'] must be a string, got ", json_snippet(m.value()));
        header.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    header.tensors.push_back(parse_entry(path, it.key(), it.value(), data_size));
  }

  // No two tensors may share bytes; sort by begin and compare neighbours.
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : header.tensors)
    if (t.num_bytes() > 0) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->data_begin < b->data_begin;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& a = *by_offset[i - 1];
    const TensorInfo& b = *by_offset[i];
    DI_CHECK(b.data_begin >= a.data_end, path, ": tensors '", text_snippet(a.name, 200), "' [", a.data_begin, ", ",
             a.data_end, ") and '", text_snippet(b.name, 200), "' [", b.data_begin, ", ", b.data_end,
             ") overlap in the data section");
  }
  // Views are typed pointers: each tensor must be aligned for its dtype.
  for (const auto& t : header.tensors) {
    const uint64_t align = dtype_size(t.dtype);
    DI_CHECK((header.data_offset + t.data_begin) % align == 0, path, ": tensor '", text_snippet(t.name, 200),
             "' starts at file byte ", header.data_offset + t.data_begin,
             ", not aligned to its dtype size ", align);
  }
  return header;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  header_ = parse_safetensors_header(file_.data(), file_.size(), path);
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_[header_.tensors[i].name] = i;
}

bool SafetensorsFile::has(std::string_view name) const { return index_.find(name) != index_.end(); }

const TensorInfo& SafetensorsFile::info(std::string_view name) const {
  auto it = index_.find(name);
  DI_CHECK(it != index_.end(), path(), ": no tensor named '", name, "'");
  return header_.tensors[it->second];
}

Tensor SafetensorsFile::tensor(std::string_view name) const {
  const TensorInfo& ti = info(name);
  // The mapping is read-only; Tensor is a plain view, so constness is by convention.
  auto* p = const_cast<uint8_t*>(file_.data()) + header_.data_offset + ti.data_begin;
  return Tensor(p, ti.dtype, ti.shape, Device::CPU);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, _] : index_) out.push_back(name);
  return out;
}

uint64_t SafetensorsFile::data_bytes() const {
  uint64_t n = 0;
  for (const auto& t : header_.tensors) n += t.num_bytes();
  return n;
}

}  // namespace deepinfer
