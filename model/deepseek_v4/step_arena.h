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

 private:
  Backend& be_;
  std::vector<DeviceBuffer> chunks_;
  std::vector<size_t> sizes_;
  size_t current_ = 0, offset_ = 0;  // next free byte: chunk current_, offset offset_
  size_t peak_ = 0;                  // most bytes live at once this step (over all chunks)
  uint64_t epoch_ = 0;
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
