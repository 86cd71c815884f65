// Shared pieces of the CUTLASS grouped-GEMM files (moe_cutlass.cu: BF16 experts, cutlass_fp8.cu:
// FP8 blockwise-scaled experts): the grouped GEMM type both build (Hopper, device-side problem
// shapes, no cluster, D = accumulator in ElementD) from a file's mainloop traits, carving group
// arrays out of one allocation, and the pair of grouped GEMMs every set runs on the same group
// arrays (gate | up: 2E groups from group 0, BF16 out; down: E groups from group 2E, F32 out).
#pragma once
#include <cstddef>
#include <type_traits>

#include "backend/cuda/cuda_common.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_types.h"

namespace deepinfer::cuda {

using CutlassProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;  // (M, N, K)
using CutlassShape3 = CutlassProblemShape::UnderlyingProblemShape;

// One grouped GEMM: Tile gives the tile shape (Shape) and the kernel and epilogue schedules
// (Kernel, Epilogue); Traits the operands: Traits::Mainloop<TileShape, ClusterShape, epilogue
// shared-memory bytes, kernel schedule> (the collective mainloop) and
// Traits::mainloop_args<Mainloop>(arrays, first group) (its arguments from the group arrays).
template <class Traits, class Tile, class ElementD>
struct CutlassGrouped {
  using TileShape = typename Tile::Shape;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  static constexpr int kAlignD = 16 / sizeof(ElementD);
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor*,
      kAlignD, ElementD, cutlass::layout::RowMajor*, kAlignD, typename Tile::Epilogue,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float>>::CollectiveOp;
  using Mainloop = typename Traits::template Mainloop<TileShape, ClusterShape,
                                                      static_cast<int>(sizeof(typename Epilogue::SharedStorage)),
                                                      typename Tile::Kernel>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<CutlassProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  // Arguments of `groups` groups from group `first` of the arrays g.
  template <class Arrays>
  static typename Gemm::Arguments args(int groups, const Arrays& g, int first, int num_sms, int device) {
    cutlass::KernelHardwareInfo hw;
    hw.device_id = device;
    hw.sm_count = num_sms;
    typename Gemm::Arguments out{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {groups, g.shapes + first, nullptr},
        Traits::template mainloop_args<Mainloop>(g, first),
        {{}, nullptr, nullptr, reinterpret_cast<typename Epilogue::ElementD**>(g.d + first), g.sd + first},
        hw};
    out.epilogue.thread.alpha = 1.0f;
    out.epilogue.thread.beta = 0.0f;
    return out;
  }
};

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
  // gate | up (down false) or down on `stream`.
  cutlass::Status run(bool down_gemm, cudaStream_t stream) {
    return down_gemm ? down.run(stream) : gate_up.run(stream);
  }
  static void check(cutlass::Status st, const char* what) {
    DI_CHECK(st == cutlass::Status::kSuccess, "cutlass grouped GEMM (", what, "): ", cutlassGetStatusString(st));
  }
};

}  // namespace deepinfer::cuda
