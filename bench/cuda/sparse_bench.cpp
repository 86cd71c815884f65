// DeepSeek-V3.2 decode attention of one layer at full width on CUDA: the dense absorbed MLA
// over the whole context (what V3 runs) against V3.2's sparse path (indexer scores over the
// paged key cache, top-k, MLA over the chosen positions), per op and in total, for batch x
// context. Full-width shapes: 128 heads x row 576 (latent 512 + rope 64), indexer 64 heads x
// 128, index_topk 2048, block size 64. Each op set is captured once as a CUDA graph and
// replayed (launch overhead excluded, as decode runs graphed). Inputs are random (fill_random):
// the kernels' time does not depend on the values.
// Bytes read per step (the roofline): dense B * ctx * 576 * 2; sparse B * ctx * 128 * 2 (keys)
// + B * ctx * 4 * 6 (scores written once, read by 4 radix passes and the final pass) +
// B * topk * 576 * 2 (chosen latent rows).
//
// Usage: deepinfer_sparse_bench [--batches 1,8,32,64] [--contexts 4096,32768,131072]
//                               [--reps 20] [--gbps 4800] [--out results.jsonl]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench/cuda/bench_util.h"
#include "core/error.h"

namespace deepinfer {
namespace {

using bench::parse_list;
using bench::upload_i32;

constexpr int kHeads = 128, kRow = 576, kLatent = 512, kIdxHeads = 64, kIdxDim = 128, kTopk = 2048;
constexpr int kBlock = 64;

// Milliseconds per run of `ops`, captured as one graph and replayed `reps` times.
double time_graph(Backend& b, const std::function<void()>& ops, int reps) {
  ops();  // eager first: grows every workspace
  b.synchronize();
  b.graph_capture_begin();
  ops();
  const int graph = b.graph_capture_end();
  b.graph_replay(graph);
  b.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) b.graph_replay(graph);
  b.synchronize();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
  b.graph_release(graph);
  return ms;
}

Tensor random_tensor(Backend& b, std::vector<DeviceBuffer>& keep, DType dtype, std::vector<int64_t> dims,
                     uint64_t seed) {
  keep.push_back(b.alloc(dtype, dims));
  Tensor t = keep.back().tensor();
  b.fill_random(t, seed, 1.0f);
  return t;
}

int run(int argc, char** argv) {
  std::vector<int> batches = {1, 8, 32, 64}, contexts = {4096, 32768, 131072};
  int reps = 20;
  double gbps = 4800;
  const char* out_path = nullptr;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--batches")) batches = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--contexts")) contexts = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--gbps")) gbps = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--out")) out_path = argv[i + 1];
    else fail("sparse_bench: unknown flag ", argv[i]);
  }
  BackendOptions options;
  std::unique_ptr<Backend> b = make_cuda_backend(options);
  DI_CHECK(b != nullptr, "sparse_bench: built without CUDA");
  FILE* out = out_path ? std::fopen(out_path, "a") : nullptr;
  std::printf("%5s %7s | %9s | %9s %9s %9s %9s | %6s | %8s %8s\n", "batch", "context", "dense ms", "scores",
              "topk", "sparse", "V3.2 ms", "ratio", "dense%rf", "v32%rf");
  for (int ctx : contexts) {
    for (int B : batches) {
      std::vector<DeviceBuffer> keep;
      const int64_t blocks_per_seq = (ctx + kBlock - 1) / kBlock, num_blocks = B * blocks_per_seq;
      std::vector<int32_t> tables(static_cast<size_t>(num_blocks)), lens(B, ctx), qs(B + 1);
      for (int64_t i = 0; i < num_blocks; ++i) tables[i] = static_cast<int32_t>(i);
      for (int s = 0; s <= B; ++s) qs[s] = s;
      PagedKV kv;
      kv.cache = random_tensor(*b, keep, DType::BF16, {num_blocks, kBlock, kRow}, 1);
      kv.block_tables = upload_i32(*b, keep, tables, {B, blocks_per_seq});
      kv.seq_lens = upload_i32(*b, keep, lens, {B});
      kv.query_start = upload_i32(*b, keep, qs, {B + 1});
      kv.num_seqs = B;
      kv.max_query_len = 1;
      kv.max_seq_len = ctx;
      PagedKV keys = kv;
      keys.cache = random_tensor(*b, keep, DType::BF16, {num_blocks, kBlock, kIdxDim}, 2);
      Tensor q = random_tensor(*b, keep, DType::BF16, {B, kHeads, kRow}, 3);
      Tensor qi = random_tensor(*b, keep, DType::BF16, {B, kIdxHeads, kIdxDim}, 4);
      Tensor w = random_tensor(*b, keep, DType::F32, {B, kIdxHeads}, 5);
      keep.push_back(b->alloc(DType::F32, {B, ctx}));
      Tensor scores = keep.back().tensor();
      keep.push_back(b->alloc(DType::I32, {B, kTopk}));
      Tensor idx = keep.back().tensor();
      keep.push_back(b->alloc(DType::BF16, {B, kHeads, kLatent}));
      Tensor o = keep.back().tensor();
      const float scale = 1.0f / 13.856f, iscale = 1.0f / 8.0f / 11.3137f;
      const double dense = time_graph(*b, [&] { b->mla_attention_paged(q, kv, scale, kLatent, o); }, reps);
      const double t_scores = time_graph(*b, [&] { b->indexer_scores(qi, w, keys, iscale, scores); }, reps);
      const double t_topk = time_graph(*b, [&] { b->indexer_topk(scores, keys, idx); }, reps);
      const double t_sparse =
          time_graph(*b, [&] { b->mla_attention_paged_sparse(q, kv, idx, scale, kLatent, o); }, reps);
      const double total = time_graph(*b, [&] {
        b->indexer_scores(qi, w, keys, iscale, scores);
        b->indexer_topk(scores, keys, idx);
        b->mla_attention_paged_sparse(q, kv, idx, scale, kLatent, o);
      }, reps);
      const double dense_bytes = double(B) * ctx * kRow * 2;
      const double sparse_bytes = double(B) * ctx * kIdxDim * 2 + double(B) * ctx * 4 * 6 +
                                  double(B) * std::min(ctx, kTopk) * kRow * 2;
      const double dense_rf = dense_bytes / (gbps * 1e6) / dense, v32_rf = sparse_bytes / (gbps * 1e6) / total;
      std::printf("%5d %7d | %9.3f | %9.3f %9.3f %9.3f %9.3f | %6.2f | %7.1f%% %7.1f%%\n", B, ctx, dense, t_scores,
                  t_topk, t_sparse, total, dense / total, 100 * dense_rf, 100 * v32_rf);
      if (out) {
        std::fprintf(out,
                     "{\"bench\":\"v32_decode_attention\",\"batch\":%d,\"context\":%d,\"heads\":%d,\"index_heads\":%d,"
                     "\"index_topk\":%d,\"dense_ms\":%.4f,\"indexer_scores_ms\":%.4f,\"indexer_topk_ms\":%.4f,"
                     "\"sparse_mla_ms\":%.4f,\"v32_total_ms\":%.4f,\"dense_bytes\":%.0f,\"v32_bytes\":%.0f,"
                     "\"roofline_gbps\":%.0f}\n",
                     B, ctx, kHeads, kIdxHeads, kTopk, dense, t_scores, t_topk, t_sparse, total, dense_bytes,
                     sparse_bytes, gbps);
        std::fflush(out);
      }
    }
  }
  if (out) std::fclose(out);
  return 0;
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) { return deepinfer::bench::main_guarded("sparse_bench", deepinfer::run, argc, argv); }
