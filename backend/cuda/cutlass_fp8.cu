// Routed FP8 experts in prefill on CUTLASS's (4.2 wheel's headers) Hopper grouped GEMM with
// blockwise scaling: FP8 e4m3 x e4m3 on wgmma + TMA, warp-specialized persistent kernels, F32
// accumulation promoted per 128-wide K block with the activations' 1x128 scales (M-major,
// [kb, rows] per expert, what quantize_segments_kernel writes) and the weights' 128x128 scales
// read where they are (K-major [ceil(N/128), ceil(K/128)], the checkpoint's scale_inv):
//   x rows gathered and quantized 1x128 per expert (one kernel), gate | up as 2E groups
//   (expert e's gate and up write the two halves of its BF16 hidden rows), bf16(silu(g) * u)
//   quantized 1x128 (one kernel), down as E groups with F32 out for the combine.
// The same products as the CPU composition quantize_fp8_1x128 + gemm_fp8_1x128 per expert
// (Fp8Ops.MoeExpertsTakeFp8ActivationsForManyRows), summed in the tensor cores' order.
//
// No host sync and graph-capturable: problem sizes (rows per expert from the permutation's
// offsets), pointers and strides are written on the device by one setup kernel per call; the
// GEMM parameters only hold those arrays' addresses (allocated once per expert count).
// Not used in batch-invariant mode (each output element is one CTA's K loop, but the tile
// configuration follows the load).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cutlass_grouped.cuh"
#include "backend/cuda/fp8_quant.cuh"

#include "cutlass/detail/blockwise_scale_layout.hpp"

namespace deepinfer::cuda {
namespace {

using Shape3 = CutlassShape3;
using ElementAB = cutlass::float_e4m3_t;
// 1x128 activation scales (M-major), 128x128 weight scales (K-major: the checkpoint's layout).
using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::MN, cute::GMMA::Major::K>;
using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

// e4m3 x e4m3 operands with their blockwise scales: A row-major with its scale layout, B
// column-major (the [N, K] weights) with theirs.
struct Fp8BlockwiseOperands {
  static constexpr int kAlignAB = 16;
  template <class TileShape, class ClusterShape, int kEpilogueBytes, class Schedule>
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB,
      cute::tuple<cutlass::layout::RowMajor*, LayoutSFA*>, kAlignAB, ElementAB,
      cute::tuple<cutlass::layout::ColumnMajor*, LayoutSFB*>, kAlignAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<kEpilogueBytes>, Schedule>::CollectiveOp;
  template <class ML, class Arrays>
  static typename ML::Arguments mainloop_args(const Arrays& g, int first) {
    return {g.a + first, g.sa + first, g.b + first, g.sb + first, g.sfa + first, g.lsfa + first,
            g.sfb + first, g.lsfb + first};
  }
};

// Two tile configurations (compile time on 2 cores), K 128 (one scale block per K step), no
// cluster: 64x128 on 2 ping-pong consumer warpgroups (experts of few rows), 128x128 on 2
// cooperative ones.
struct Tile64 {
  using Shape = cute::Shape<cute::_64, cute::_128, cute::_128>;
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};
struct Tile128 {
  using Shape = cute::Shape<cute::_128, cute::_128, cute::_128>;
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};
template <class Tile, class ElementD>
using Grouped = CutlassGrouped<Fp8BlockwiseOperands, Tile, ElementD>;
using StrideA = Grouped<Tile64, float>::StrideA;
using StrideB = Grouped<Tile64, float>::StrideB;
using StrideD = Grouped<Tile64, float>::StrideD;

// Device arrays of the 3E groups: [0, 2E) gate | up (2e: gate, 2e + 1: up), [2E, 3E) down.
struct GroupArrays {
  Shape3* shapes;
  const ElementAB** a;
  const ElementAB** b;
  void** d;
  const float** sfa;
  const float** sfb;
  StrideA* sa;
  StrideB* sb;
  StrideD* sd;
  LayoutSFA* lsfa;
  LayoutSFB* lsfb;
};

// Expert table (ExpertTable::ptrs): [j * E + e] weight j of expert e (0 gate, 1 up, 2 down),
// [(3 + j) * E + e] its 128x128 scales. qx: x's quantized rows [P, H] with scales sx (expert
// e's [kbH, rows_e] at offsets[e] * kbH); qa / sa the same for the activations [P, I].
__global__ void cutlass_moe_fp8_setup_kernel(GroupArrays g, const int32_t* offsets, int E, int H, int I,
                                             const void* const* ptrs, const uint8_t* qx, const float* sx,
                                             bf16* hidden, const uint8_t* qa, const float* sa, float* y) {
  const int kbH = (H + kFp8Block - 1) / kFp8Block, kbI = (I + kFp8Block - 1) / kFp8Block;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < 3 * E; i += gridDim.x * blockDim.x) {
    const int e = i < 2 * E ? i / 2 : i - 2 * E;
    const int64_t r0 = offsets[e];
    const int rows = offsets[e + 1] - offsets[e];
    const int j = i < 2 * E ? i % 2 : 2;
    const int N = j < 2 ? I : H, K = j < 2 ? H : I;
    g.shapes[i] = Shape3{rows, N, K};
    g.a[i] = reinterpret_cast<const ElementAB*>(j < 2 ? qx + r0 * H : qa + r0 * I);
    g.b[i] = static_cast<const ElementAB*>(ptrs[static_cast<int64_t>(j) * E + e]);
    g.sfa[i] = j < 2 ? sx + r0 * kbH : sa + r0 * kbI;
    g.sfb[i] = static_cast<const float*>(ptrs[static_cast<int64_t>(3 + j) * E + e]);
    g.d[i] = j < 2 ? static_cast<void*>(hidden + r0 * 2 * I + j * I) : static_cast<void*>(y + r0 * H);
    g.sa[i] = StrideA{int64_t{K}, cute::Int<1>{}, cute::Int<0>{}};
    g.sb[i] = StrideB{int64_t{K}, cute::Int<1>{}, cute::Int<0>{}};
    g.sd[i] = StrideD{j < 2 ? int64_t{2} * I : int64_t{H}, cute::Int<1>{}, cute::Int<0>{}};
    g.lsfa[i] = ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(rows, N, K, 1));
    g.lsfb[i] = ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(rows, N, K, 1));
  }
}

}  // namespace

// Per expert count: the group arrays, the workspaces and both tile configurations' GEMMs.
struct CudaBackend::CutlassMoeFp8 {
  void* mem = nullptr;
  GroupArrays g{};
  CutlassTilePair<Grouped, Tile64, GroupArrays> t64;
  CutlassTilePair<Grouped, Tile128, GroupArrays> t128;
  ~CutlassMoeFp8() { cudaFree(mem); }
};

bool CudaBackend::cutlass_moe_fp8_fits(const std::vector<ExpertWeights>& experts) {
  const int64_t I = experts[0].gate.w.shape[0], H = experts[0].gate.w.shape[1];
  // TMA: 16-byte rows of q (H, I bytes) and of hidden's halves (I BF16 at a multiple of I).
  if (H % 16 || I % 16) return false;
  for (const ExpertWeights& e : experts)
    if (!fp8_scales_fit(e.gate) || !fp8_scales_fit(e.up) || !fp8_scales_fit(e.down)) return false;
  return true;
}

CudaBackend::CutlassMoeFp8& CudaBackend::cutlass_moe_fp8(int E) {
  auto it = cutlass_moe_fp8_.find(E);
  if (it != cutlass_moe_fp8_.end()) return *it->second;
  DI_CHECK(!capturing(), "moe_experts (cutlass fp8): the grouped GEMMs for ", E,
           " experts must be set up outside a graph capture; run the step once uncaptured first");
  auto s = std::make_shared<CutlassMoeFp8>();
  const size_t n = 3 * static_cast<size_t>(E);
  const size_t ws64 = CutlassTilePair<Grouped, Tile64, GroupArrays>::workspace_bytes(E, num_sms_, device_);
  const size_t ws128 = CutlassTilePair<Grouped, Tile128, GroupArrays>::workspace_bytes(E, num_sms_, device_);
  const size_t bytes = 256 * 13 + n * (sizeof(Shape3) + 5 * sizeof(void*) + sizeof(StrideA) + sizeof(StrideB) +
                                       sizeof(StrideD) + sizeof(LayoutSFA) + sizeof(LayoutSFB)) + ws64 + ws128;
  DI_CUDA(cudaMalloc(&s->mem, bytes), "moe_experts (cutlass fp8): group arrays and workspace of ", bytes, " bytes");
  DI_CUDA(cudaMemset(s->mem, 0, bytes), "moe_experts (cutlass fp8): group arrays");
  char* p = static_cast<char*>(s->mem);
  s->g.shapes = cutlass_carve<Shape3>(p, n);
  s->g.a = cutlass_carve<const ElementAB*>(p, n);
  s->g.b = cutlass_carve<const ElementAB*>(p, n);
  s->g.d = cutlass_carve<void*>(p, n);
  s->g.sfa = cutlass_carve<const float*>(p, n);
  s->g.sfb = cutlass_carve<const float*>(p, n);
  s->g.sa = cutlass_carve<StrideA>(p, n);
  s->g.sb = cutlass_carve<StrideB>(p, n);
  s->g.sd = cutlass_carve<StrideD>(p, n);
  s->g.lsfa = cutlass_carve<LayoutSFA>(p, n);
  s->g.lsfb = cutlass_carve<LayoutSFB>(p, n);
  char* w64 = cutlass_carve<char>(p, ws64);
  char* w128 = cutlass_carve<char>(p, ws128);
  s->t64.init(E, s->g, w64, num_sms_, device_, stream_);
  s->t128.init(E, s->g, w128, num_sms_, device_, stream_);
  return *cutlass_moe_fp8_.emplace(E, std::move(s)).first->second;
}

float* CudaBackend::moe_experts_cutlass_fp8(const void* x, int64_t ldx, int P, int E, int64_t H, int64_t I,
                                            const void* const* ptrs, const int32_t* row_token,
                                            const int32_t* offsets, const std::string& shapes) {
  CutlassMoeFp8& s = cutlass_moe_fp8(E);
  const int64_t kbH = (H + kFp8Block - 1) / kFp8Block, kbI = (I + kFp8Block - 1) / kFp8Block;
  const auto align = [](size_t v) { return (v + 255) / 256 * 256; };
  // q and its scales side by side in one slot (x's: [P, H] + [P * kbH]; the activations'
  // [P, I] + [P * kbI]); hidden BF16 [P, 2I]; y F32 [P, H].
  char* xs = static_cast<char*>(scratch(kSlotMoeGather, align(size_t(P) * H) + size_t{4} * P * kbH, "moe_experts"));
  char* as = static_cast<char*>(scratch(kSlotMoeAct, align(size_t(P) * I) + size_t{4} * P * kbI, "moe_experts"));
  bf16* hidden = static_cast<bf16*>(scratch(kSlotMoeHidden, size_t{2} * P * 2 * I, "moe_experts"));
  float* y = static_cast<float*>(scratch(kSlotMoeOut, size_t{4} * P * H, "moe_experts"));
  uint8_t* qx = reinterpret_cast<uint8_t*>(xs);
  float* sx = reinterpret_cast<float*>(xs + align(size_t(P) * H));
  uint8_t* qa = reinterpret_cast<uint8_t*>(as);
  float* sa = reinterpret_cast<float*>(as + align(size_t(P) * I));
  quantize_segments_kernel<false><<<ceil_div(int64_t{P} * kbH, 8), 256, 0, stream_>>>(
      static_cast<const bf16*>(x), ldx, row_token, 0, offsets, E, P, static_cast<int>(H), qx, sx);
  check_launch("moe_experts (cutlass fp8 quantize x)", shapes);
  cutlass_moe_fp8_setup_kernel<<<ceil_div(3 * E, 128), 128, 0, stream_>>>(
      s.g, offsets, E, static_cast<int>(H), static_cast<int>(I), ptrs, qx, sx, hidden, qa, sa, y);
  check_launch("moe_experts (cutlass fp8 setup)", shapes);
  // Tiles: 64x128 while the experts average fewer than 128 rows, else 128x128 (or as pinned
  // by CudaOptions::moe_cutlass_tile: 64, or 256 for the larger one).
  const bool small = moe_cutlass_tile_ == 64 || (moe_cutlass_tile_ == 0 && P < 128 * E);
  auto run_tile = [&](bool down) {
    const char* op = down ? "moe_experts (cutlass fp8 down)" : "moe_experts (cutlass fp8 gate|up)";
    const cutlass::Status st = small ? s.t64.run(down, stream_) : s.t128.run(down, stream_);
    DI_CHECK(st == cutlass::Status::kSuccess, op, ": ", cutlassGetStatusString(st), " for ", shapes,
             small ? " (64x128 tiles)" : " (128x128 tiles)");
    check_launch(op, shapes);
  };
  run_tile(false);
  quantize_segments_kernel<true><<<ceil_div(int64_t{P} * kbI, 8), 256, 0, stream_>>>(
      hidden, 2 * I, nullptr, I, offsets, E, P, static_cast<int>(I), qa, sa);
  check_launch("moe_experts (cutlass fp8 quantize swiglu)", shapes);
  run_tile(true);
  return y;
}

}  // namespace deepinfer::cuda
