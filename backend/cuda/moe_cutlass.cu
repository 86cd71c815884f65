// MoE expert GEMMs in prefill on CUTLASS's (3.x API, the 4.2 wheel's headers) Hopper grouped
// GEMMs (wgmma + TMA, persistent warp-specialized kernels, BF16 in, F32 accumulate): gate | up as one grouped GEMM
// of 2E problems (expert e's gate and up are groups 2e and 2e + 1, writing the two halves of
// its hidden rows), SiLU-mul, down as one grouped GEMM of E problems (F32 out for the combine).
//
// No host sync per layer and graph-capturable: the problem sizes (rows per expert, read from
// the permutation's offsets) and the per-group pointers and strides are written on the device
// by one setup kernel each call; the kernels read them there (CUTLASS's device-side problem
// shapes: no host copy, the grid is one CTA per SM). The kernel parameters only hold the
// addresses of those arrays (allocated once per expert count), so they are built once.
//
// Not used in batch-invariant mode (the caller keeps the own kernels in that mode); each
// output element is one CTA's K loop in a fixed order (no split K).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_utils.cuh"

#include "backend/cuda/cutlass_grouped.cuh"

namespace deepinfer::cuda {
namespace {

using Shape3 = CutlassShape3;
using ElementAB = cutlass::bfloat16_t;

// BF16 x BF16 operands: A row-major (the permuted rows), B column-major (the [N, K] weights).
struct Bf16Operands {
  static constexpr int kAlignAB = 8;
  template <class TileShape, class ClusterShape, int kEpilogueBytes, class Schedule>
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, cutlass::layout::RowMajor*, kAlignAB,
      ElementAB, cutlass::layout::ColumnMajor*, kAlignAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<kEpilogueBytes>, Schedule>::CollectiveOp;
  template <class ML, class Arrays>
  static typename ML::Arguments mainloop_args(const Arrays& g, int first) {
    return {g.a + first, g.sa + first, g.b + first, g.sb + first};
  }
};

// Two tile configurations (compile time on 2 cores), no cluster (experts of few rows gain
// nothing from multicast along M): 128x256x64 tiles on 2 cooperative consumer warpgroups, and
// 64x128x64 tiles on 2 ping-pong consumer warpgroups (less padding for experts of few rows).
// H200 (bench/NOTES.md, cutlass): 64x128 wins prefill 512 (48 rows per expert) by 1.0-1.6%
// over 128x256 and 7% over 128x128; 128x256 wins 4096 (384 rows) by 1.9% over 128x128 and 2%
// over 64x128; 128x128 lost everywhere and was removed.
struct Tile128x256 {
  using Shape = cute::Shape<cute::_128, cute::_256, cute::_64>;
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};
struct Tile64 {
  using Shape = cute::Shape<cute::_64, cute::_128, cute::_64>;
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};
template <class Tile, class ElementD>
using Grouped = CutlassGrouped<Bf16Operands, Tile, ElementD>;
using StrideA = Grouped<Tile64, float>::StrideA;
using StrideB = Grouped<Tile64, float>::StrideB;
using StrideD = Grouped<Tile64, float>::StrideD;

// Device arrays of the 3E groups: [0, 2E) gate | up (2e: gate, 2e + 1: up), [2E, 3E) down.
struct GroupArrays {
  Shape3* shapes;
  const ElementAB** a;
  const ElementAB** b;
  void** d;
  StrideA* sa;
  StrideB* sb;
  StrideD* sd;
};

__global__ void cutlass_moe_setup_kernel(GroupArrays g, const int32_t* offsets, int E, int H, int I,
                                         const void* const* w_ptrs, const bf16* xg, bf16* hidden,
                                         const bf16* act, float* y) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < 3 * E; i += gridDim.x * blockDim.x) {
    const int e = i < 2 * E ? i / 2 : i - 2 * E;
    const int64_t r0 = offsets[e];
    const int rows = offsets[e + 1] - offsets[e];
    if (i < 2 * E) {
      const int j = i % 2;
      g.shapes[i] = Shape3{rows, I, H};
      g.a[i] = reinterpret_cast<const ElementAB*>(xg + r0 * H);
      g.b[i] = static_cast<const ElementAB*>(w_ptrs[static_cast<int64_t>(j) * E + e]);
      g.d[i] = hidden + r0 * 2 * I + j * I;
      g.sa[i] = StrideA{int64_t{H}, cute::Int<1>{}, cute::Int<0>{}};
      g.sb[i] = StrideB{int64_t{H}, cute::Int<1>{}, cute::Int<0>{}};
      g.sd[i] = StrideD{int64_t{2} * I, cute::Int<1>{}, cute::Int<0>{}};
    } else {
      g.shapes[i] = Shape3{rows, H, I};
      g.a[i] = reinterpret_cast<const ElementAB*>(act + r0 * I);
      g.b[i] = static_cast<const ElementAB*>(w_ptrs[int64_t{2} * E + e]);
      g.d[i] = y + r0 * H;
      g.sa[i] = StrideA{int64_t{I}, cute::Int<1>{}, cute::Int<0>{}};
      g.sb[i] = StrideB{int64_t{I}, cute::Int<1>{}, cute::Int<0>{}};
      g.sd[i] = StrideD{int64_t{H}, cute::Int<1>{}, cute::Int<0>{}};
    }
  }
}

// xg row p = x row row_token[p] for p < offsets[E] (the permuted rows; 16-byte copies).
__global__ void cutlass_moe_gather_kernel(const bf16* x, int64_t ldx, int64_t H, const int32_t* row_token,
                                          const int32_t* offsets, int E, bf16* xg) {
  const int64_t p = blockIdx.x;
  if (p >= offsets[E]) return;
  const uint4* src = reinterpret_cast<const uint4*>(x + row_token[p] * ldx);
  uint4* dst = reinterpret_cast<uint4*>(xg + p * H);
  for (int64_t c = threadIdx.x; c < H / 8; c += blockDim.x) dst[c] = src[c];
}

}  // namespace

// Per expert count: the group arrays, the workspaces and every tile configuration's GEMMs
// (their parameters point at those arrays, so they are built once).
struct CudaBackend::CutlassMoe {
  void* mem = nullptr;
  GroupArrays g{};
  CutlassTilePair<Grouped, Tile64, GroupArrays> t64;
  CutlassTilePair<Grouped, Tile128x256, GroupArrays> wide;
  ~CutlassMoe() { cudaFree(mem); }
};

bool CudaBackend::cutlass_moe_fits(int64_t H, int64_t I) { return H % 8 == 0 && I % 8 == 0; }

CudaBackend::CutlassMoe& CudaBackend::cutlass_moe(int E) {
  auto it = cutlass_moe_.find(E);
  if (it != cutlass_moe_.end()) return *it->second;
  DI_CHECK(!capturing(), "moe_experts (cutlass): the grouped GEMMs for ", E,
           " experts must be set up outside a graph capture; run the step once uncaptured first");
  auto s = std::make_shared<CutlassMoe>();
  const size_t n = 3 * static_cast<size_t>(E);
  const size_t ws64 = CutlassTilePair<Grouped, Tile64, GroupArrays>::workspace_bytes(E, num_sms_, device_);
  const size_t ws_wide = CutlassTilePair<Grouped, Tile128x256, GroupArrays>::workspace_bytes(E, num_sms_, device_);
  const size_t bytes = 256 * 9 + n * (sizeof(Shape3) + 3 * sizeof(void*) + sizeof(StrideA) + sizeof(StrideB) +
                                      sizeof(StrideD)) + ws64 + ws_wide;
  DI_CUDA(cudaMalloc(&s->mem, bytes), "moe_experts (cutlass): group arrays and workspace of ", bytes, " bytes");
  char* p = static_cast<char*>(s->mem);
  s->g.shapes = cutlass_carve<Shape3>(p, n);
  s->g.a = cutlass_carve<const ElementAB*>(p, n);
  s->g.b = cutlass_carve<const ElementAB*>(p, n);
  s->g.d = cutlass_carve<void*>(p, n);
  s->g.sa = cutlass_carve<StrideA>(p, n);
  s->g.sb = cutlass_carve<StrideB>(p, n);
  s->g.sd = cutlass_carve<StrideD>(p, n);
  char* w64 = cutlass_carve<char>(p, ws64);
  char* w_wide = cutlass_carve<char>(p, ws_wide);
  s->t64.init(E, s->g, w64, num_sms_, device_, stream_);
  s->wide.init(E, s->g, w_wide, num_sms_, device_, stream_);
  return *cutlass_moe_.emplace(E, std::move(s)).first->second;
}

float* CudaBackend::moe_experts_cutlass(const void* x, int64_t ldx, int P, int E, int64_t H, int64_t I,
                                        const void* const* w_ptrs, const int32_t* row_token,
                                        const int32_t* offsets, const std::string& shapes) {
  CutlassMoe& s = cutlass_moe(E);
  bf16* xg = static_cast<bf16*>(scratch(kSlotMoeGather, size_t{2} * P * H, "moe_experts"));
  bf16* hidden = static_cast<bf16*>(scratch(kSlotMoeHidden, size_t{2} * P * 2 * I, "moe_experts"));
  bf16* act = static_cast<bf16*>(scratch(kSlotMoeAct, size_t{2} * P * I, "moe_experts"));
  float* y = static_cast<float*>(scratch(kSlotMoeOut, size_t{4} * P * H, "moe_experts"));
  cutlass_moe_gather_kernel<<<static_cast<unsigned>(P), 256, 0, stream_>>>(
      static_cast<const bf16*>(x), ldx, H, row_token, offsets, E, xg);
  check_launch("moe_experts (cutlass gather)", shapes);
  cutlass_moe_setup_kernel<<<ceil_div(3 * E, 128), 128, 0, stream_>>>(s.g, offsets, E, static_cast<int>(H),
                                                                     static_cast<int>(I), w_ptrs, xg, hidden,
                                                                     act, y);
  check_launch("moe_experts (cutlass setup)", shapes);
  // Tiles: 64x128 while the experts average fewer than 128 rows, else 128x256 (or as chosen).
  const bool small = moe_cutlass_tile_ == 64 || (moe_cutlass_tile_ == 0 && P < 128 * E);
  auto run_tile = [&](bool down) {
    const char* op = down ? "moe_experts (cutlass down)" : "moe_experts (cutlass gate|up)";
    const cutlass::Status st = small ? s.t64.run(down, stream_) : s.wide.run(down, stream_);
    DI_CHECK(st == cutlass::Status::kSuccess, op, ": ", cutlassGetStatusString(st), " for ", shapes,
             small ? " (64x128 tiles)" : " (128x256 tiles)");
    check_launch(op, shapes);
  };
  run_tile(false);
  Tensor hid(hidden, DType::BF16, {P, 2 * I}, Device::CUDA);
  Tensor actt(act, DType::BF16, {P, I}, Device::CUDA);
  silu_mul(hid, actt);
  run_tile(true);
  return y;
}

}  // namespace deepinfer::cuda
