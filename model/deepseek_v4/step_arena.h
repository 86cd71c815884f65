// Device memory of one forward's temporaries, bump-allocated from chunks the model keeps
// between steps: on CUDA every cudaMalloc / cudaFree pair costs a device synchronization, and
// V4's forward makes some ten temporaries per layer and sequence. Scopes (Mark / release) give
// a layer's temporaries back when it ends, so a step's peak is its largest layer's, not their
// sum. Reuse inside a step is safe because every op and copy runs in the backend's stream
// order (CUDA) or at once (CPU). A step that outgrows the chunk takes more; the next step
// starts from one chunk of the peak (epoch() changes then: graphs over the old chunk are stale).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace deepinfer {

class StepArena {
 public:
  explicit StepArena(Backend& backend) : be_(backend) {}
  struct Mark {
    size_t chunk = 0, offset = 0;
  };
  // Start of a step: everything given out before is free.
  void reset();
  DeviceBuffer alloc(DType dtype, const std::vector<int64_t>& dims);
  Mark mark() const { return {current_, offset_}; }
  void release(const Mark& m) {
    current_ = m.chunk;
    offset_ = m.offset;
  }
  uint64_t epoch() const { return epoch_; }
  size_t capacity_bytes() const;
  // Most bytes live at once since the step started (chunks before the current one counted whole).
  size_t peak_bytes() const { return peak_; }

 private:
  Backend& be_;
  std::vector<DeviceBuffer> chunks_;
  std::vector<size_t> sizes_;
  size_t current_ = 0, offset_ = 0;  // next free byte: chunk current_, offset offset_
  size_t peak_ = 0;                  // most bytes live at once this step (over all chunks)
  uint64_t epoch_ = 0;
};

// Host-built I32 lists (V4's row lists, slots, positions) sent to the device without a wait
// each: copied into a page-locked chunk (Backend::alloc_host) and issued with copy_async, into
// memory of a StepArena. Page-locked bytes of a copy that may still be in flight are never
// written: the offset only grows within a step; a full chunk waits for the stream once and
// starts over (or grows), and reset() waits once at the start of a step.
class UploadStage {
 public:
  UploadStage(Backend& backend, StepArena& device) : be_(backend), device_(device) {}
  void reset();
  DeviceBuffer upload(const std::vector<int32_t>& v);

 private:
  Backend& be_;
  StepArena& device_;
  DeviceBuffer host_;
  size_t capacity_ = 0, offset_ = 0;  // in int32 values
};

// Releases to the mark taken at construction when it goes out of scope.
class ArenaScope {
 public:
  explicit ArenaScope(StepArena& a) : a_(a), m_(a.mark()) {}
  ~ArenaScope() { a_.release(m_); }
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;

 private:
  StepArena& a_;
  StepArena::Mark m_;
};

}  // namespace deepinfer
