// CheckpointReader: single file, sharded index, and broken indexes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "temp_dir.h"

namespace deepinfer {
namespace {

using testing::TempDir;

void write_f32(const std::string& path, const std::vector<std::pair<std::string, float>>& tensors) {
  SafetensorsWriter w;
  for (const auto& [name, value] : tensors) {
    std::vector<float> v(6, value);
    w.add_bytes(name, DType::F32, {2, 3}, v.data(), v.size() * 4);
  }
  w.write(path);
}

void expect_error(const std::string& path, const std::vector<std::string>& parts) {
  try {
    CheckpointReader::open(path);
    FAIL() << "expected an error opening " << path;
  } catch (const Error& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "'" << p << "' not in: " << e.what();
  }
}

const char* kIndex = R"({"metadata": {"total_size": 96}, "weight_map": {
  "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
  "c": "model-00002-of-00002.safetensors", "d": "model-00002-of-00002.safetensors"}})";

TEST(CheckpointReader, SingleFileDirectory) {
  TempDir dir;
  write_f32(dir.file("model.safetensors"), {{"x", 1.0f}, {"y", 2.0f}});
  CheckpointReader r = CheckpointReader::open(dir.path());
  EXPECT_EQ(r.names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(r.tensor("y").ptr<float>()[5], 2.0f);
  EXPECT_EQ(r.total_bytes(), 48u);
  EXPECT_EQ(r.info("x").file, dir.file("model.safetensors"));
  // A file path works too.
  EXPECT_TRUE(CheckpointReader::open(dir.file("model.safetensors")).has("x"));
}

TEST(CheckpointReader, ShardedIndex) {
  TempDir dir;
  write_f32(dir.file("model-00001-of-00002.safetensors"), {{"a", 1.0f}, {"b", 2.0f}});
  write_f32(dir.file("model-00002-of-00002.safetensors"), {{"c", 3.0f}, {"d", 4.0f}});
  dir.write("model.safetensors.index.json", kIndex);
  CheckpointReader r = CheckpointReader::open(dir.path());
  EXPECT_EQ(r.names(), (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(r.files().size(), 2u);
  EXPECT_EQ(r.tensor("a").ptr<float>()[0], 1.0f);
  EXPECT_EQ(r.tensor("d").ptr<float>()[3], 4.0f);
  EXPECT_EQ(r.info("c").file, dir.file("model-00002-of-00002.safetensors"));
  EXPECT_EQ(r.total_bytes(), 96u);
  EXPECT_FALSE(r.has("e"));
  try {
    r.tensor("e");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'e'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find(dir.path()), std::string::npos);
  }
}

TEST(CheckpointReader, TouchAllReportsProgressUpToTotal) {
  TempDir dir;
  write_f32(dir.file("model-00001-of-00002.safetensors"), {{"a", 1.0f}, {"b", 2.0f}});
  write_f32(dir.file("model-00002-of-00002.safetensors"), {{"c", 3.0f}, {"d", 4.0f}});
  dir.write("model.safetensors.index.json", kIndex);
  CheckpointReader r = CheckpointReader::open(dir.path());
  struct Seen {
    uint64_t calls = 0, last_done = 0, total = 0;
    bool monotonic = true;
  } seen;
  r.touch_all(
      [](uint64_t done, uint64_t total, void* user) {
        auto* s = static_cast<Seen*>(user);
        s->monotonic = s->monotonic && done >= s->last_done;
        s->calls++;
        s->last_done = done;
        s->total = total;
      },
      &seen);
  EXPECT_GT(seen.calls, 0u);
  EXPECT_TRUE(seen.monotonic);
  EXPECT_EQ(seen.last_done, 96u);
  EXPECT_EQ(seen.total, 96u);
}

TEST(CheckpointReader, IndexPointsToMissingShard) {
  TempDir dir;
  write_f32(dir.file("model-00001-of-00002.safetensors"), {{"a", 1.0f}, {"b", 2.0f}});
  dir.write("model.safetensors.index.json", kIndex);
  expect_error(dir.path(), {"model.safetensors.index.json", "model-00002-of-00002.safetensors",
                            "does not exist"});
}

TEST(CheckpointReader, IndexNamesTensorMissingFromShard) {
  TempDir dir;
  write_f32(dir.file("model-00001-of-00002.safetensors"), {{"a", 1.0f}, {"b", 2.0f}});
  write_f32(dir.file("model-00002-of-00002.safetensors"), {{"c", 3.0f}});
  dir.write("model.safetensors.index.json", kIndex);
  expect_error(dir.path(), {"'d'", "model-00002-of-00002.safetensors", "no such tensor"});
}

TEST(CheckpointReader, TensorInTwoShards) {
  TempDir dir;
  write_f32(dir.file("model-00001-of-00002.safetensors"), {{"a", 1.0f}, {"b", 2.0f}, {"c", 9.0f}});
  write_f32(dir.file("model-00002-of-00002.safetensors"), {{"c", 3.0f}, {"d", 4.0f}});
  dir.write("model.safetensors.index.json", kIndex);
  expect_error(dir.path(), {"'c'", "in both"});
}

TEST(CheckpointReader, BadIndexAndEmptyDirectory) {
  TempDir dir;
  expect_error(dir.path(), {"no model.safetensors"});
  expect_error(dir.file("nope"), {"no such checkpoint"});
  dir.write("model.safetensors.index.json", "{\"weight_map\": [1]}");
  expect_error(dir.path(), {"weight_map"});
  dir.write("model.safetensors.index.json", "{\"weight_map\": {\"a\": \"../x.safetensors\"}}");
  expect_error(dir.path(), {"'a'", "inside the checkpoint directory"});
  dir.write("model.safetensors.index.json", "not json");
  expect_error(dir.path(), {"model.safetensors.index.json", "not valid JSON"});
}

TEST(CheckpointReader, CorruptShardNamesTheShard) {
  TempDir dir;
  write_f32(dir.file("model-00001-of-00002.safetensors"), {{"a", 1.0f}, {"b", 2.0f}});
  dir.write("model-00002-of-00002.safetensors", "garbage");
  dir.write("model.safetensors.index.json", kIndex);
  expect_error(dir.path(), {"model-00002-of-00002.safetensors", "too short"});
}

}  // namespace
}  // namespace deepinfer
