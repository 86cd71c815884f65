#include "model/deepseek_v4/step_arena.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace deepinfer {

namespace {
constexpr size_t kAlign = 256;
constexpr size_t kMinChunk = size_t{16} << 20;
}  // namespace

size_t StepArena::capacity_bytes() const {
  size_t total = 0;
  for (size_t s : sizes_) total += s;
  return total;
}

void StepArena::reset() {
  // Last step outgrew the first chunk: one chunk of its peak (not while a graph is being
  // captured: a capture follows an uncaptured step of its shape and keeps its chunks).
  if (chunks_.size() > 1 && !be_.capturing()) {
    const size_t bytes = peak_;  // chunks before the last counted whole: enough for its pattern
    chunks_.clear();
    sizes_.clear();
    chunks_.push_back(be_.alloc(DType::U8, {static_cast<int64_t>(bytes)}));
    sizes_.push_back(bytes);
    ++epoch_;
  }
  current_ = offset_ = 0;
  peak_ = 0;
}

DeviceBuffer StepArena::alloc(DType dtype, const std::vector<int64_t>& dims) {
  Tensor t(nullptr, dtype, dims, be_.device());
  const size_t bytes = std::max<size_t>(kAlign, (t.num_bytes() + kAlign - 1) / kAlign * kAlign);
  // The first chunk from current_ on with room (a released scope may leave later chunks free).
  while (current_ < chunks_.size() && offset_ + bytes > sizes_[current_]) {
    ++current_;
    offset_ = 0;
  }
  if (current_ == chunks_.size()) {
    DI_CHECK(!be_.capturing(), "step arena: must grow by ", bytes, " bytes during a graph capture (run the step's "
             "shape uncaptured first)");
    const size_t size = std::max({bytes, kMinChunk, capacity_bytes()});
    chunks_.push_back(be_.alloc(DType::U8, {static_cast<int64_t>(size)}));
    sizes_.push_back(size);
    ++epoch_;
  }
  t.data = static_cast<char*>(chunks_[current_].tensor().data) + offset_;
  offset_ += bytes;
  size_t live = offset_;
  for (size_t c = 0; c < current_; ++c) live += sizes_[c];  // chunks before are counted whole
  peak_ = std::max(peak_, live);
  return DeviceBuffer(t, nullptr);
}

void UploadStage::reset() {
  be_.synchronize();
  offset_ = 0;
}

DeviceBuffer UploadStage::upload(const std::vector<int32_t>& v) {
  const int64_t n = static_cast<int64_t>(v.size());
  DeviceBuffer dst = device_.alloc(DType::I32, {n});
  if (n == 0) return dst;
  const size_t take = (static_cast<size_t>(n) + 63) / 64 * 64;
  if (offset_ + take > capacity_) {
    be_.synchronize();  // every copy from the chunk is done
    offset_ = 0;
    if (take > capacity_) {
      capacity_ = std::max<size_t>({take, size_t{1} << 20, 2 * capacity_});
      host_ = be_.alloc_host(DType::I32, {static_cast<int64_t>(capacity_)});
    }
  }
  int32_t* h = host_.tensor().ptr<int32_t>() + offset_;
  std::memcpy(h, v.data(), sizeof(int32_t) * static_cast<size_t>(n));
  offset_ += take;
  Tensor src(h, DType::I32, {n}, Device::CPU);
  be_.copy_async(src, dst.tensor());
  return dst;
}

}  // namespace deepinfer
