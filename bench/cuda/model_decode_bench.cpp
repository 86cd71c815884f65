// Whole-model decode step time on CUDA for a config with random weights (V3, V3.2, ...):
// batch B sequences at context C each run one decode step (one new token per sequence) through
// Model::forward, captured once as a CUDA graph and replayed (launch overhead excluded, as the
// runner runs decode graphed). The KV caches of every group the model declares are filled with
// random values instead of being computed by a prefill: step time does not depend on their
// values, and a 128k-token prefill of B sequences at full width would cost minutes. (Sparse
// attention's selection does depend on the keys' values; random keys select scattered
// positions, the expensive case for the gather.)
// Roofline: the project's one count (app/bench_counts.h) of weight and KV bytes per decode step
// at the given bytes per linear parameter (FP8: 1), floor = bytes / --gbps.
//
// Usage: deepinfer_model_decode_bench --config CFG.json [--dtype fp8|bf16] [--batches 1,8,32]
//        [--contexts 4096,32768,131072] [--reps 10] [--gbps 4800] [--out results.jsonl]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "app/bench_counts.h"
#include "backend/backend.h"
#include "bench/cuda/bench_util.h"
#include "core/error.h"
#include "model/config.h"
#include "model/model.h"

namespace deepinfer {
namespace {

using bench::parse_list;
using bench::upload_i32;

constexpr int kBlock = 64;

int run(int argc, char** argv) {
  std::vector<int> batches = {1, 8, 32}, contexts = {4096, 32768, 131072};
  int reps = 10;
  double gbps = 4800;
  const char* out_path = nullptr;
  std::string config_path, dtype = "fp8";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--config")) config_path = argv[i + 1];
    else if (!std::strcmp(argv[i], "--dtype")) dtype = argv[i + 1];
    else if (!std::strcmp(argv[i], "--batches")) batches = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--contexts")) contexts = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--gbps")) gbps = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--out")) out_path = argv[i + 1];
    else fail("model_decode_bench: unknown flag ", argv[i]);
  }
  DI_CHECK(!config_path.empty(), "model_decode_bench: --config CFG.json is required");
  DI_CHECK(dtype == "fp8" || dtype == "bf16", "model_decode_bench: --dtype must be fp8 or bf16, got ", dtype);
  BackendOptions backend_options;
  std::unique_ptr<Backend> b = make_cuda_backend(backend_options);
  DI_CHECK(b != nullptr, "model_decode_bench: built without CUDA");
  LoadOptions options;
  options.seed = 1;
  options.load_mtp = false;
  options.random_weight_dtype = dtype == "fp8" ? DType::F8_E4M3 : DType::BF16;
  const auto t_load = std::chrono::steady_clock::now();
  std::unique_ptr<Model> model = random_model(config_path, *b, options);
  b->synchronize();
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  const ModelConfig& mc = model->config();
  const std::vector<KvGroupSpec> groups = model->kv_groups();
  std::printf("%s (%s, %s): %d layers, hidden %lld, %lld heads, %zu KV groups, loaded in %.1f s\n",
              config_path.c_str(), mc.model_type.c_str(), dtype.c_str(), mc.num_hidden_layers,
              static_cast<long long>(mc.hidden_size), static_cast<long long>(mc.num_attention_heads),
              groups.size(), load_s);
  std::printf("%5s %7s | %9s | %12s %12s | %7s\n", "batch", "context", "step ms", "weight MB", "KV MB", "%roofl");
  FILE* out = out_path ? std::fopen(out_path, "a") : nullptr;
  const double linear_bytes = dtype == "fp8" ? 1.0 : 2.0;
  for (int ctx : contexts) {
    for (int B : batches) {
      std::vector<DeviceBuffer> keep;
      // Every sequence holds ctx tokens and decodes token ctx (position ctx, seq_len ctx + 1).
      const int64_t blocks_per_seq = (ctx + 1 + kBlock - 1) / kBlock, num_blocks = B * blocks_per_seq;
      KvCaches kv(groups.size());
      for (size_t g = 0; g < groups.size(); ++g) {
        DI_CHECK(groups[g].tokens_per_row == 1 && groups[g].window == 0, "model_decode_bench: KV group '",
                 groups[g].name, "' is compressed or windowed; only full-attention groups are laid out");
        for (int l = 0; l < groups[g].num_layers; ++l) {
          keep.push_back(b->alloc(groups[g].row_dtype(b->activation_dtype()), {num_blocks, kBlock, groups[g].row_dim}));
          b->fill_random(keep.back().tensor(), 100 + 10 * g + l, 1.0f);
          kv[g].push_back(keep.back().tensor());
        }
      }
      std::vector<int32_t> tables(static_cast<size_t>(num_blocks)), slots(B), ids(B), pos(B, ctx), lens(B, ctx + 1),
          qs(B + 1), rows(B);
      for (int64_t i = 0; i < num_blocks; ++i) tables[i] = static_cast<int32_t>(i);
      for (int s = 0; s < B; ++s) {
        slots[s] = static_cast<int32_t>(s * blocks_per_seq * kBlock + ctx);
        ids[s] = 2 + (s * 7919) % static_cast<int>(mc.vocab_size - 2);
        rows[s] = s;
      }
      for (int s = 0; s <= B; ++s) qs[s] = s;
      StepBatch batch;
      batch.num_tokens = B;
      batch.num_seqs = B;
      batch.max_query_len = 1;
      batch.max_seq_len = ctx + 1;
      batch.token_ids = upload_i32(*b, keep, ids, {B});
      batch.positions = upload_i32(*b, keep, pos, {B});
      batch.query_start = upload_i32(*b, keep, qs, {B + 1});
      batch.seq_lens = upload_i32(*b, keep, lens, {B});
      batch.block_tables = upload_i32(*b, keep, tables, {B, blocks_per_seq});
      batch.slot_mapping = upload_i32(*b, keep, slots, {B});
      batch.logits_indices = upload_i32(*b, keep, rows, {B});
      batch.host_query_start = qs;
      batch.host_seq_lens = lens;
      for (size_t g = 0; g < groups.size(); ++g) batch.kv_groups.push_back({batch.block_tables, batch.slot_mapping});
      keep.push_back(b->alloc(DType::F32, {B, mc.vocab_size}));
      Tensor logits = keep.back().tensor();

      model->forward(batch, kv, logits);  // eager first: grows every workspace
      b->synchronize();
      b->graph_capture_begin();
      model->forward(batch, kv, logits);
      const int graph = b->graph_capture_end();
      b->graph_replay(graph);
      b->synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) b->graph_replay(graph);
      b->synchronize();
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
      b->graph_release(graph);

      const app::StepCounts counts = app::count_step(mc, app::StepKind::Decode, linear_bytes, 2.0, B, 1, B, ctx, 2.0);
      const double floor_ms = (counts.weight_bytes + counts.kv_bytes) / (gbps * 1e6);
      std::printf("%5d %7d | %9.3f | %12.1f %12.1f | %6.1f%%\n", B, ctx, ms, counts.weight_bytes / 1e6,
                  counts.kv_bytes / 1e6, 100 * floor_ms / ms);
      if (out) {
        std::fprintf(out,
                     "{\"bench\":\"model_decode_step\",\"config\":\"%s\",\"model_type\":\"%s\",\"dtype\":\"%s\","
                     "\"layers\":%d,\"batch\":%d,\"context\":%d,\"step_ms\":%.4f,\"weight_bytes\":%.0f,"
                     "\"kv_bytes\":%.0f,\"flops\":%.0f,\"roofline_gbps\":%.0f,\"floor_ms\":%.4f,\"reps\":%d}\n",
                     config_path.c_str(), mc.model_type.c_str(), dtype.c_str(), mc.num_hidden_layers, B, ctx, ms,
                     counts.weight_bytes, counts.kv_bytes, counts.flops, gbps, floor_ms, reps);
        std::fflush(out);
      }
    }
  }
  if (out) std::fclose(out);
  return 0;
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) { return deepinfer::bench::main_guarded("model_decode_bench", deepinfer::run, argc, argv); }
