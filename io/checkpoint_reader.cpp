// CheckpointReader: a directory of safetensors shards seen as one name -> tensor map.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "io/safetensors.h"

namespace deepinfer {

namespace {

using json = nlohmann::json;

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

}  // namespace

CheckpointReader CheckpointReader::open(const std::string& path) {
  CheckpointReader reader;
  reader.path_ = path;
  auto add_file = [&reader](const std::string& file) -> size_t {
    reader.files_.push_back(std::make_unique<SafetensorsFile>(file));
    return reader.files_.size() - 1;
  };
  // Tensor name -> file index; a name in two files is an error.
  auto claim = [&reader](const std::string& name, size_t file_index) {
    auto [it, inserted] = reader.owner_.emplace(name, file_index);
    DI_CHECK(inserted, "tensor '", name, "' is in both ", reader.files_[it->second]->path(),
             " and ", reader.files_[file_index]->path());
  };

  if (!is_directory(path)) {
    DI_CHECK(is_file(path), path, ": no such checkpoint (expected a directory with "
                                  "model.safetensors or model.safetensors.index.json, or a "
                                  ".safetensors file)");
    size_t f = add_file(path);
    for (const auto& name : reader.files_[f]->names()) claim(name, f);
    return reader;
  }

  const std::string single = join(path, "model.safetensors");
  const std::string index_path = join(path, "model.safetensors.index.json");
  if (is_file(index_path)) {
    const json index = parse_json(read_text_file(index_path), index_path);
    DI_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
             index_path, ": expected an object with a 'weight_map' object {tensor: shard file}");
    // Open each distinct shard once, in first-mention order.
    std::map<std::string, size_t> shard_index;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      DI_CHECK(it.value().is_string(), index_path, ": weight_map['", text_snippet(it.key(), 200),
               "'] must be a file name, got ", json_snippet(it.value()));
      const std::string shard = it.value().get<std::string>();
      DI_CHECK(shard.find('/') == std::string::npos && shard != ".." && !shard.empty(), index_path,
               ": weight_map['", it.key(), "'] = '", shard,
               "' must be a file name inside the checkpoint directory");
      if (shard_index.count(shard) == 0) {
        const std::string shard_path = join(path, shard);
        DI_CHECK(is_file(shard_path), index_path, ": shard '", shard, "' (holding tensor '",
                 it.key(), "') does not exist at ", shard_path);
        shard_index[shard] = add_file(shard_path);
      }
    }
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      const size_t f = shard_index.at(it.value().get<std::string>());
      DI_CHECK(reader.files_[f]->has(it.key()), index_path, ": maps tensor '", it.key(), "' to ",
               reader.files_[f]->path(), " but that file has no such tensor");
      claim(it.key(), f);
    }
    // Tensors a shard holds but the index omits are still readable (HF
    // tolerates this), unless they collide with a tensor of another shard.
    for (size_t f = 0; f < reader.files_.size(); ++f) {
      for (const auto& name : reader.files_[f]->names()) {
        auto it = reader.owner_.find(name);
        if (it == reader.owner_.end()) {
          claim(name, f);
        } else {
          DI_CHECK(it->second == f, "tensor '", name, "' is in both ",
                   reader.files_[it->second]->path(), " and ", reader.files_[f]->path());
        }
      }
    }
    return reader;
  }
  DI_CHECK(is_file(single), path, ": no model.safetensors or model.safetensors.index.json");
  size_t f = add_file(single);
  for (const auto& name : reader.files_[f]->names()) claim(name, f);
  return reader;
}

const SafetensorsFile& CheckpointReader::file_of(std::string_view name) const {
  auto it = owner_.find(name);
  DI_CHECK(it != owner_.end(), path_, ": checkpoint has no tensor named '", name, "'");
  return *files_[it->second];
}

bool CheckpointReader::has(std::string_view name) const { return owner_.find(name) != owner_.end(); }

const TensorInfo& CheckpointReader::info(std::string_view name) const {
  return file_of(name).info(name);
}

Tensor CheckpointReader::tensor(std::string_view name) const { return file_of(name).tensor(name); }

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> out;
  out.reserve(owner_.size());
  for (const auto& [name, _] : owner_) out.push_back(name);
  return out;
}

uint64_t CheckpointReader::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, f] : owner_) n += files_[f]->info(name).num_bytes();
  return n;
}

std::vector<std::string> CheckpointReader::files() const {
  std::vector<std::string> out;
  for (const auto& f : files_) out.push_back(f->path());
  return out;
}

void CheckpointReader::touch_all(ProgressFn progress, void* user) const {
  const uint64_t total = total_bytes();
  const long page = std::max(4096L, ::sysconf(_SC_PAGESIZE));
  // Report about every 1/256 of the bytes so a callback printing percent stays cheap.
  const uint64_t report_every = std::max<uint64_t>(total / 256, 1);
  uint64_t done = 0, last_report = 0;
  volatile uint8_t sink = 0;
  for (const auto& [name, f] : owner_) {
    const TensorInfo& ti = files_[f]->info(name);
    const auto* p = static_cast<const uint8_t*>(files_[f]->tensor(name).data);
    for (uint64_t off = 0; off < ti.num_bytes(); off += static_cast<uint64_t>(page)) sink = sink ^ p[off];
    done += ti.num_bytes();
    if (progress != nullptr && (done - last_report >= report_every || done == total)) {
      progress(done, total, user);
      last_report = done;
    }
  }
  if (progress != nullptr && total == 0) progress(0, 0, user);
  (void)sink;
}

}  // namespace deepinfer
