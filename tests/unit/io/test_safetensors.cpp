// SafetensorsFile / SafetensorsWriter: round trips and every kind of corrupt file.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "temp_dir.h"

namespace deepinfer {
namespace {

using testing::safetensors_image;
using testing::TempDir;

// Opens `path` expecting an Error whose message contains every one of `parts`.
void expect_open_error(const std::string& path, std::vector<std::string> parts) {
  try {
    SafetensorsFile f(path);
    FAIL() << "expected an error opening " << path;
  } catch (const Error& e) {
    const std::string msg = e.what();
    parts.push_back(path);  // every message names the file
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

TEST(Safetensors, WriterRoundTripKeepsValuesDtypesAndAlignment) {
  TempDir dir;
  SafetensorsWriter w;
  std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -8.5f};
  std::vector<uint16_t> bf16 = {float_to_bf16(1.0f), float_to_bf16(-0.5f), float_to_bf16(3.0f)};
  std::vector<uint8_t> fp8 = {float_to_fp8_e4m3(1.0f), float_to_fp8_e4m3(-448.0f),
                              float_to_fp8_e4m3(0.125f)};
  std::vector<int64_t> i64 = {42, -7};
  w.add_bytes("a.bf16", DType::BF16, {3}, bf16.data(), bf16.size() * 2);  // odd size first by name
  w.add_bytes("b.f32", DType::F32, {2, 3}, f32.data(), f32.size() * 4);
  w.add_bytes("c.fp8", DType::F8_E4M3, {1, 3}, fp8.data(), fp8.size());
  w.add_bytes("d.i64", DType::I64, {2}, i64.data(), i64.size() * 8);
  w.add_bytes("e.empty", DType::F32, {0, 4}, nullptr, 0);
  w.set_metadata("format", "pt");
  const std::string path = dir.file("m.safetensors");
  w.write(path);

  SafetensorsFile f(path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a.bf16", "b.f32", "c.fp8", "d.i64", "e.empty"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  Tensor t = f.tensor("b.f32");
  EXPECT_EQ(t.dtype, DType::F32);
  EXPECT_EQ(t.dims(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 4, 0u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t.ptr<float>()[i], f32[i]);
  Tensor b = f.tensor("a.bf16");
  EXPECT_EQ(bf16_to_float(b.ptr<uint16_t>()[1]), -0.5f);
  Tensor q = f.tensor("c.fp8");
  EXPECT_EQ(fp8_e4m3_to_float(q.ptr<uint8_t>()[1]), -448.0f);
  EXPECT_EQ(f.tensor("d.i64").ptr<int64_t>()[0], 42);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.tensor("d.i64").data) % 8, 0u);
  EXPECT_EQ(f.tensor("e.empty").numel(), 0);
  EXPECT_EQ(f.data_bytes(), 6u * 4 + 3 * 2 + 3 + 2 * 8);
  EXPECT_EQ(f.info("b.f32").num_bytes(), 24u);
}

TEST(Safetensors, ZeroCopyViewPointsIntoTheMapping) {
  TempDir dir;
  SafetensorsWriter w;
  std::vector<float> v(16, 2.0f);
  w.add_bytes("x", DType::F32, {4, 4}, v.data(), 64);
  w.write(dir.file("m.safetensors"));
  SafetensorsFile f(dir.file("m.safetensors"));
  const auto* p = static_cast<const uint8_t*>(f.tensor("x").data);
  EXPECT_GE(p, f.mapping());
  EXPECT_LE(p + 64, f.mapping() + f.mapping_size());
}

TEST(Safetensors, MissingTensorNamesFileAndTensor) {
  TempDir dir;
  SafetensorsWriter w;
  float one = 1.0f;
  w.add_bytes("x", DType::F32, {1}, &one, 4);
  w.write(dir.file("m.safetensors"));
  SafetensorsFile f(dir.file("m.safetensors"));
  EXPECT_FALSE(f.has("y"));
  try {
    f.tensor("y");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'y'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(dir.file("m.safetensors")), std::string::npos);
  }
}

TEST(SafetensorsCorrupt, TooShortForLengthPrefix) {
  TempDir dir;
  expect_open_error(dir.write("t.safetensors", "abc"), {"too short"});
  expect_open_error(dir.write("empty.safetensors", ""), {"too short"});
}

TEST(SafetensorsCorrupt, HeaderLengthPastEndOfFile) {
  TempDir dir;
  expect_open_error(dir.write("t.safetensors", safetensors_image("{}", 0, 1000)),
                    {"header length 1000", "past the end"});
  expect_open_error(dir.write("huge.safetensors", safetensors_image("{}", 0, int64_t{1} << 62)),
                    {"exceeds"});
}

TEST(SafetensorsCorrupt, HeaderNotJson) {
  TempDir dir;
  expect_open_error(dir.write("t.safetensors", safetensors_image("{\"a\": [1, 2", 0)),
                    {"not valid JSON"});
  expect_open_error(dir.write("arr.safetensors", safetensors_image("[1, 2, 3]", 0)),
                    {"JSON object"});
  expect_open_error(
      dir.write("entry.safetensors", safetensors_image(R"({"w": 5})", 0)), {"'w'", "object"});
}

TEST(SafetensorsCorrupt, TruncatedData) {
  TempDir dir;
  // 2x2 F32 needs 16 bytes; the file holds 10.
  const std::string h = R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}})";
  expect_open_error(dir.write("t.safetensors", safetensors_image(h, 10)),
                    {"'w'", "[0, 16]", "past the end of the data section", "10 bytes"});
}

TEST(SafetensorsCorrupt, OffsetsEndBeforeBegin) {
  TempDir dir;
  const std::string h = R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})";
  expect_open_error(dir.write("t.safetensors", safetensors_image(h, 16)), {"'w'", "end before begin"});
}

TEST(SafetensorsCorrupt, OverlappingTensors) {
  TempDir dir;
  const std::string h = R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                            "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})";
  expect_open_error(dir.write("t.safetensors", safetensors_image(h, 16)), {"'a'", "'b'", "overlap"});
}

TEST(SafetensorsCorrupt, DtypeSizeTimesNumelDisagreesWithByteRange) {
  TempDir dir;
  const std::string h = R"({"w": {"dtype": "BF16", "shape": [3, 4], "data_offsets": [0, 16]}})";
  expect_open_error(dir.write("t.safetensors", safetensors_image(h, 32)),
                    {"'w'", "BF16[3, 4]", "needs 24 bytes", "hold 16"});
}

TEST(SafetensorsCorrupt, AbsurdShapes) {
  TempDir dir;
  expect_open_error(
      dir.write("neg.safetensors",
                safetensors_image(R"({"w": {"dtype": "F32", "shape": [-1, 4], "data_offsets": [0, 16]}})", 16)),
      {"'w'", "shape entry", "non-negative"});
  expect_open_error(
      dir.write("ovf.safetensors",
                safetensors_image(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296], "data_offsets": [0, 16]}})", 16)),
      {"'w'", "overflows"});
  expect_open_error(
      dir.write("float.safetensors",
                safetensors_image(R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 16]}})", 16)),
      {"'w'", "shape entry"});
  expect_open_error(
      dir.write("rank.safetensors",
                safetensors_image(R"({"w": {"dtype": "U8", "shape": [1,1,1,1,1,1], "data_offsets": [0, 1]}})", 8)),
      {"'w'", "rank 6"});
  expect_open_error(
      dir.write("noshape.safetensors",
                safetensors_image(R"({"w": {"dtype": "U8", "data_offsets": [0, 1]}})", 8)),
      {"'w'", "'shape'"});
}

TEST(SafetensorsCorrupt, UnknownDtype) {
  TempDir dir;
  const std::string h = R"({"w": {"dtype": "Q4_K", "shape": [4], "data_offsets": [0, 4]}})";
  expect_open_error(dir.write("t.safetensors", safetensors_image(h, 8)), {"'w'", "unknown dtype 'Q4_K'"});
}

TEST(SafetensorsCorrupt, DuplicateNames) {
  TempDir dir;
  const std::string h = R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                            "w": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})";
  expect_open_error(dir.write("t.safetensors", safetensors_image(h, 8)), {"'w'", "twice"});
}

TEST(SafetensorsCorrupt, DeeplyNestedHeaderIsRefusedNotACrash) {
  // A value nested 200,000 deep (built here): the reader used to build it and the error's
  // dump() of it overflowed the stack.
  TempDir dir;
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const std::string h = R"({"w": {"dtype": "U8", "shape": )" + deep + R"(, "data_offsets": [0, 1]}})";
  expect_open_error(dir.write("t.safetensors", safetensors_image(h, 8)), {"nested deeper than the limit of 256"});
  // Within the depth limit but the wrong type: the error prints a bounded snippet of it.
  const std::string d100 = std::string(100, '[') + std::string(100, ']');
  try {
    SafetensorsFile f(dir.write("d.safetensors", safetensors_image(R"({"w": )" + d100 + "}", 8)));
    FAIL() << "accepted a non-object entry";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'w': header entry must be an object, got [[[["), std::string::npos) << msg;
    EXPECT_LT(msg.size(), 400u) << msg;
  }
}

TEST(SafetensorsCorrupt, InvalidUtf8AndLongNamesInErrorsAreBounded) {
  TempDir dir;
  expect_open_error(dir.write("u.safetensors", safetensors_image("{\"w\xff\": 1}", 8)),
                    {"invalid UTF-8 at byte offset 3"});
  const std::string name(100000, 'n');
  const std::string h = "{\"" + name + R"(": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}})";
  try {
    SafetensorsFile f(dir.write("n.safetensors", safetensors_image(h, 8)));
    FAIL() << "accepted dtype Q4";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unknown dtype 'Q4'"), std::string::npos) << msg.substr(0, 400);
    EXPECT_NE(msg.find("(100000 bytes)"), std::string::npos) << msg.substr(0, 400);
    EXPECT_LT(msg.size(), 800u);
  }
}

TEST(Safetensors, ManyTensorsParseInLinearTime) {
  // 200,000 entries: nlohmann's callback parser rescanned the whole header object after each
  // entry (40,000 tensors took 24 s, 1,000,000 over 120 s). Now linear (~0.5 s here).
  std::string h = "{";
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    h += (i ? ",\"t" : "\"t") + std::to_string(i) + R"(":{"dtype":"U8","shape":[1],"data_offsets":[)" +
         std::to_string(i) + "," + std::to_string(i + 1) + "]}";
  }
  h += "}";
  TempDir dir;
  SafetensorsFile f(dir.write("many.safetensors", safetensors_image(h, n)));
  EXPECT_EQ(f.names().size(), static_cast<size_t>(n));
  EXPECT_EQ(f.info("t123456").data_begin, 123456u);
  EXPECT_EQ(f.data_bytes(), static_cast<uint64_t>(n));
}

TEST(SafetensorsCorrupt, MisalignedTensor) {
  TempDir dir;
  const std::string h = R"({"u": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                            "f": {"dtype": "F32", "shape": [1], "data_offsets": [1, 5]}})";
  expect_open_error(dir.write("t.safetensors", safetensors_image(h, 8)), {"'f'", "not aligned"});
}

TEST(SafetensorsCorrupt, BadMetadataAndOffsets) {
  TempDir dir;
  expect_open_error(dir.write("m.safetensors", safetensors_image(R"({"__metadata__": {"k": 1}})", 0)),
                    {"__metadata__"});
  expect_open_error(
      dir.write("o.safetensors",
                safetensors_image(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0]}})", 8)),
      {"'w'", "data_offsets"});
  expect_open_error(
      dir.write("n.safetensors",
                safetensors_image(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [-1, 0]}})", 8)),
      {"'w'", "data_offsets[0]"});
}

TEST(SafetensorsWriter, RejectsBadInput) {
  SafetensorsWriter w;
  float x[2] = {1, 2};
  w.add_bytes("x", DType::F32, {2}, x, 8);
  EXPECT_THROW(w.add_bytes("x", DType::F32, {2}, x, 8), Error);
  EXPECT_THROW(w.add_bytes("y", DType::F32, {3}, x, 8), Error);
  EXPECT_THROW(w.add_bytes("__metadata__", DType::F32, {2}, x, 8), Error);
  EXPECT_THROW(w.write("/nonexistent-dir/x.safetensors"), Error);
}

}  // namespace
}  // namespace deepinfer
