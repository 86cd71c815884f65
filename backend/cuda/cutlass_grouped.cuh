// Shared pieces of the CUTLASS grouped-GEMM files (moe_cutlass.cu: BF16 experts, cutlass_fp8.cu:
// FP8 blockwise-scaled experts and dense GEMMs): carving group arrays out of one allocation, and
// the pair of grouped GEMMs every set runs on the same group arrays (gate | up: 2E groups from
// group 0, BF16 out; down: E groups from group 2E, F32 out).
#pragma once
#include <cstddef>
#include <type_traits>

#include "backend/cuda/cuda_common.h"
#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"

namespace deepinfer::cuda {

// count T's at p, p moved on to the next 256-byte boundary.
template <class T>
T* cutlass_carve(char*& p, size_t count) {
  T* out = reinterpret_cast<T*>(p);
  p += (count * sizeof(T) + 255) / 256 * 256;
  return out;
}

// Grouped<Tile, ElementD>: Gemm (a GemmUniversalAdapter) and
// static Gemm::Arguments args(groups, arrays, first group, num_sms, device).
template <template <class, class> class Grouped, class Tile, class Arrays>
struct CutlassTilePair {
  using GateUp = Grouped<Tile, cutlass::bfloat16_t>;
  using Down = Grouped<Tile, float>;
  // The group arrays hold one stride type per operand: every GEMM on them must use it.
  template <class G>
  static constexpr bool kFits = std::is_same_v<typename G::StrideA*, decltype(Arrays::sa)> &&
                                std::is_same_v<typename G::StrideB*, decltype(Arrays::sb)> &&
                                std::is_same_v<typename G::StrideD*, decltype(Arrays::sd)>;
  static_assert(kFits<GateUp> && kFits<Down>, "one stride type per operand for every GEMM on the group arrays");
  typename GateUp::Gemm gate_up;
  typename Down::Gemm down;
  static size_t workspace_bytes(int E, int num_sms, int device) {
    const Arrays none{};
    return GateUp::Gemm::get_workspace_size(GateUp::args(2 * E, none, 0, num_sms, device)) +
           Down::Gemm::get_workspace_size(Down::args(E, none, 0, num_sms, device)) + 512;
  }
  void init(int E, const Arrays& g, char* workspace, int num_sms, int device, cudaStream_t stream) {
    const auto a1 = GateUp::args(2 * E, g, 0, num_sms, device);
    const auto a2 = Down::args(E, g, 2 * E, num_sms, device);
    char* ws2 = workspace + (GateUp::Gemm::get_workspace_size(a1) + 255) / 256 * 256;
    check(gate_up.can_implement(a1), "gate|up can_implement");
    check(down.can_implement(a2), "down can_implement");
    check(gate_up.initialize(a1, workspace, stream), "gate|up initialize");
    check(down.initialize(a2, ws2, stream), "down initialize");
  }
  static void check(cutlass::Status st, const char* what) {
    DI_CHECK(st == cutlass::Status::kSuccess, "cutlass grouped GEMM (", what, "): ", cutlassGetStatusString(st));
  }
};

}  // namespace deepinfer::cuda
