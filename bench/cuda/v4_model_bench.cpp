// DeepSeek-V4 whole-model step times on CUDA (issue 16 item 6): a truncated V4-Flash config at
// full width with random weights (model/deepseek_v4/weights_random.cpp: FP8 dense, routed
// experts FP4 packed or FP8), through DeepseekV4Model::forward directly: eager, or (--graphs 1)
// eager and CUDA-graph replay of the same decode step interleaved over --rounds rounds (V4's
// decode steps build their row lists on the device, so one captured step replays).
//  decode: B sequences at context C each run one step (one new token at position C). Every KV
//          group is laid out as the block manager would hold it (window and pending groups
//          only their last window's blocks, table entries before them -1) and filled with
//          random values instead of a prefill (step time does not depend on them, but for the
//          indexer's choice, which random keys scatter);
//  prefill: one sequence of T tokens from position 0 in one forward, or (--prefill-chunk N) in
//           chunks of N, each a forward over its N tokens after the positions before it (held in
//           the cache, random like decode's): the step times summed, as the engine's chunked
//           prefill runs a prompt too long for one step's scratch.
// Counted by the project's count of V4 (model/deepseek_v4/step_counts.h, also `deepinfer
// bench`'s): the decode floor is (weight bytes a step reads + the KV rows it attends and the
// indexer keys it scores, BF16 on CUDA) / --gbps, with the routed experts a step touches
// expected under uniform routing; prefill's floor is the larger of its FLOPs / --peak-tflops
// and its weight bytes / --gbps.
//
// Usage: deepinfer_v4_model_bench --config CFG.json [--experts fp4|fp8] [--batches 1,8,32,64]
//        [--contexts 4096,32768] [--prefill 4096,32768] [--prefill-chunk 0] [--reps 5] [--gbps 4800]
//        [--peak-tflops 790] [--graphs 0|1] [--rounds 3] [--out results.jsonl]
//        [--qgemm 0|1]  (routed FP4 / FP8 experts on the tensor-core grouped GEMM of moe_qgemm.cu:
//                        CudaOptions::moe_qgemm_fp4 and moe_qgemm_fp8; default: the options' defaults)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "bench/cuda/bench_util.h"
#include "core/error.h"
#include "model/deepseek_v4/model.h"
#include "model/deepseek_v4/step_counts.h"
#include "model/model.h"

namespace deepinfer {
namespace {

using bench::parse_list;
using bench::upload_i32;

constexpr int kBlock = 64;

struct Step {
  StepBatch batch;
  KvCaches kv;
  std::vector<DeviceBuffer> keep;
  Tensor logits;
};

// B sequences, each computing tokens [C - q + 1 .. C] (q = 1: decode at context C; B = 1 and
// q = C + 1: a prefill), every KV group laid out with the blocks it needs.
void make_step(Backend& b, const DeepseekV4Model& m, int B, int64_t C, int64_t q, Step& st) {
  const std::vector<KvGroupSpec> groups = m.kv_groups();
  const int64_t end = C + 1, p0 = end - q;
  st.kv.assign(groups.size(), {});
  std::vector<std::vector<int32_t>> tables(groups.size()), slots(groups.size());
  std::vector<int64_t> widths(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const KvGroupSpec& s = groups[g];
    const int64_t rows = std::max<int64_t>(1, end / s.tokens_per_row);
    const int64_t width = (rows + kBlock - 1) / kBlock;
    // Held blocks: a windowed group only those of rows [p0 - W - 1, end) (prefill: all).
    const int64_t first = s.window > 0 ? std::max<int64_t>(0, p0 - s.window - 1) / kBlock : 0;
    const int64_t held = width - first;
    widths[g] = width;
    tables[g].assign(static_cast<size_t>(B * width), -1);
    for (int i = 0; i < B; ++i)
      for (int64_t j = first; j < width; ++j)
        tables[g][static_cast<size_t>(i * width + j)] = static_cast<int32_t>(i * held + (j - first));
    for (int l = 0; l < s.num_layers; ++l) {
      st.keep.push_back(b.alloc(s.row_dtype(b.activation_dtype()), {B * held, kBlock, s.row_dim}));
      b.fill_random(st.keep.back().tensor(), 1000 + 37 * g + l, 1.0f);
      st.kv[g].push_back(st.keep.back().tensor());
    }
    for (int i = 0; i < B; ++i)
      for (int64_t p = p0; p < end; ++p) {
        const int64_t n = s.tokens_per_row;
        int32_t slot = -1;
        if ((p + 1) % n == 0) {
          const int64_t row = (p + 1) / n - 1;
          slot = static_cast<int32_t>(tables[g][static_cast<size_t>(i * width + row / kBlock)] * kBlock + row % kBlock);
        }
        slots[g].push_back(slot);
      }
  }
  const ModelConfig& mc = m.config();
  const int64_t T = B * q;
  std::vector<int32_t> ids, pos, lens(B, static_cast<int32_t>(end)), qs(B + 1), rows(B);
  for (int i = 0; i < B; ++i) {
    for (int64_t p = p0; p < end; ++p) {
      ids.push_back(static_cast<int32_t>(2 + (i * 7919 + p * 104729) % (mc.vocab_size - 2)));
      pos.push_back(static_cast<int32_t>(p));
    }
    qs[i + 1] = static_cast<int32_t>((i + 1) * q);
    rows[i] = static_cast<int32_t>((i + 1) * q - 1);
  }
  StepBatch& batch = st.batch;
  batch.num_tokens = static_cast<int>(T);
  batch.num_seqs = B;
  batch.max_query_len = static_cast<int>(q);
  batch.max_seq_len = static_cast<int>(end);
  batch.token_ids = upload_i32(b, st.keep, ids, {T});
  batch.positions = upload_i32(b, st.keep, pos, {T});
  batch.query_start = upload_i32(b, st.keep, qs, {B + 1});
  batch.seq_lens = upload_i32(b, st.keep, lens, {B});
  batch.logits_indices = upload_i32(b, st.keep, rows, {B});
  batch.host_query_start = qs;
  batch.host_seq_lens = lens;
  for (size_t g = 0; g < groups.size(); ++g)
    batch.kv_groups.push_back({upload_i32(b, st.keep, tables[g], {B, widths[g]}), upload_i32(b, st.keep, slots[g], {T})});
  batch.block_tables = batch.kv_groups[0].block_tables;
  batch.slot_mapping = batch.kv_groups[0].slot_mapping;
  st.keep.push_back(b.alloc(DType::F32, {B, mc.vocab_size}));
  st.logits = st.keep.back().tensor();
}

// Mean ms of `reps` forwards after one warm-up; whether the last logits are all finite.
double time_forward(Backend& b, Model& m, Step& st, int reps, bool* finite) {
  m.forward(st.batch, st.kv, st.logits);
  b.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) m.forward(st.batch, st.kv, st.logits);
  b.synchronize();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
  HostBuffer h(DType::F32, st.logits.dims());
  b.copy(st.logits, h.tensor());
  *finite = true;
  for (int64_t i = 0; i < h.tensor().numel(); ++i) *finite = *finite && std::isfinite(h.ptr<float>()[i]);
  return ms;
}

// Mean ms of `reps` replays of a graph of one forward step, captured after two eager steps (the
// model's workspaces then have their size for this shape).
double time_graph(Backend& b, Model& m, Step& st, int reps, bool* finite) {
  auto epoch = [&] { return std::make_pair(b.workspace_epoch(), m.workspace_epoch()); };
  m.forward(st.batch, st.kv, st.logits);
  m.forward(st.batch, st.kv, st.logits);
  b.synchronize();
  const auto captured = epoch();
  b.graph_capture_begin();
  m.forward(st.batch, st.kv, st.logits);
  const int id = b.graph_capture_end();
  DI_CHECK(epoch() == captured, "v4_model_bench: a workspace moved during the capture");
  b.graph_replay(id);
  b.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) b.graph_replay(id);
  b.synchronize();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
  b.graph_release(id);
  HostBuffer h(DType::F32, st.logits.dims());
  b.copy(st.logits, h.tensor());
  *finite = true;
  for (int64_t i = 0; i < h.tensor().numel(); ++i) *finite = *finite && std::isfinite(h.ptr<float>()[i]);
  return ms;
}

int run(int argc, char** argv) {
  std::vector<int> batches = {1, 8, 32, 64}, contexts = {4096, 32768}, prefills = {4096, 32768};
  int reps = 5, graphs = 0, rounds = 3, qgemm = -1, prefill_chunk = 0;
  double gbps = 4800, peak_tflops = 790;
  const char* out_path = nullptr;
  std::string config_path, experts = "fp4";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--config")) config_path = argv[i + 1];
    else if (!std::strcmp(argv[i], "--experts")) experts = argv[i + 1];
    else if (!std::strcmp(argv[i], "--batches")) batches = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--contexts")) contexts = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--prefill")) prefills = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--gbps")) gbps = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--peak-tflops")) peak_tflops = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--out")) out_path = argv[i + 1];
    else if (!std::strcmp(argv[i], "--graphs")) graphs = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--qgemm")) qgemm = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--prefill-chunk")) prefill_chunk = std::atoi(argv[i + 1]);
    else fail("v4_model_bench: unknown flag ", argv[i]);
  }
  DI_CHECK(!config_path.empty(), "v4_model_bench: --config CFG.json is required");
  DI_CHECK(experts == "fp4" || experts == "fp8", "v4_model_bench: --experts must be fp4 or fp8, got ", experts);
  if (argc % 2 == 0) fail("v4_model_bench: flag ", argv[argc - 1], " has no value");
  BackendOptions backend_options;
  if (qgemm >= 0) backend_options.cuda.moe_qgemm_fp4 = backend_options.cuda.moe_qgemm_fp8 = qgemm != 0;
  std::unique_ptr<Backend> b = make_cuda_backend(backend_options);
  DI_CHECK(b != nullptr, "v4_model_bench: built without CUDA");
  LoadOptions options;
  options.seed = 1;
  options.load_mtp = false;
  options.random_weight_dtype = DType::F8_E4M3;
  options.random_fp4_experts = experts == "fp4";
  const Backend::MemoryInfo before = b->memory_info();
  const auto t_load = std::chrono::steady_clock::now();
  std::unique_ptr<Model> model = random_model(config_path, *b, options);
  b->synchronize();
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  const Backend::MemoryInfo after = b->memory_info();
  auto* v4 = dynamic_cast<DeepseekV4Model*>(model.get());
  DI_CHECK(v4 != nullptr, "v4_model_bench: ", config_path, " is not a deepseek_v4 config");
  const DeepseekV4Config& c = v4->v4_config();
  const int L = c.num_layers();
  // The project's count of V4 (model/deepseek_v4/step_counts.h): FP8 dense, experts as loaded,
  // BF16 KV rows (the KV dtype on CUDA).
  auto count = [&](StepKind kind, int batch, int tokens, double context) {
    StepQuery q;
    q.kind = kind;
    q.linear_bytes = 1.0;
    q.expert_bytes = experts == "fp4" ? 0.0 : 1.0;
    q.batch = batch;
    q.tokens_per_seq = tokens;
    q.logits_rows = kind == StepKind::Decode ? batch : 1;
    q.context = context;
    q.kv_bytes_per_value = 2.0;
    return count_v4_step(c, q);
  };
  const double model_bytes = static_cast<double>(before.free_bytes - after.free_bytes);
  // KV bytes per token of context (groups that keep every row) and per sequence (window rings).
  double kv_per_token = 0, kv_per_seq = 0;
  for (const KvGroupSpec& g : v4->kv_groups()) {
    const double row = static_cast<double>(g.num_layers * g.row_bytes(b->activation_dtype()));
    if (g.window == 0) kv_per_token += row / g.tokens_per_row;
    else kv_per_seq += row * g.window;
  }
  const double v3_per_token_layer = 576.0 * 2;  // V3's latent + rope row, BF16, per layer
  std::printf("%s (deepseek_v4, FP8 dense, %s experts): %d layers, hidden %lld, %lld heads x %lld, %lld experts top-%lld,"
              " loaded in %.1f s, %.2f GB on the device (%.2f GB per layer incl. embed/head)\n",
              config_path.c_str(), experts.c_str(), L, static_cast<long long>(c.base.hidden_size),
              static_cast<long long>(c.base.num_attention_heads), static_cast<long long>(c.head_dim),
              static_cast<long long>(c.base.n_routed_experts), static_cast<long long>(c.base.num_experts_per_tok), load_s,
              model_bytes / 1e9, model_bytes / 1e9 / L);
  std::printf("KV (BF16 rows): %.1f B per token of context (%.1f per layer; V3: %.0f per layer), %.0f B per sequence"
              " in window rings; 64 x 32k tokens: %.2f GB per layer\n",
              kv_per_token, kv_per_token / L, v3_per_token_layer, kv_per_seq,
              (kv_per_token * 64 * 32768 + kv_per_seq * 64) / 1e9 / L);
  FILE* out = out_path ? std::fopen(out_path, "a") : nullptr;
  if (out) {
    std::fprintf(out,
                 "{\"bench\":\"v4_model\",\"config\":\"%s\",\"experts\":\"%s\",\"layers\":%d,\"load_s\":%.2f,"
                 "\"device_bytes\":%.0f,\"kv_bytes_per_token\":%.1f,\"kv_bytes_per_seq_window\":%.0f,"
                 "\"v3_kv_bytes_per_token_layer\":%.0f}\n",
                 config_path.c_str(), experts.c_str(), L, load_s, model_bytes, kv_per_token, kv_per_seq,
                 v3_per_token_layer);
    std::fflush(out);
  }

  std::printf("%5s %7s %5s %5s | %9s %8s | %9s %9s %9s | %7s %s\n", "batch", "context", "mode", "round",
              "step ms", "ms/layer", "weight MB", "KV MB", "floor ms", "%roofl", "logits");
  for (int ctx : contexts) {
    for (int B : batches) {
      Step st;
      make_step(*b, *v4, B, ctx, 1, st);
      const StepCounts n = count(StepKind::Decode, B, 1, ctx);
      const double weights = n.weight_bytes, kv = n.kv_bytes;
      const double floor_ms = (weights + kv) / (gbps * 1e6);
      // Eager then graph replay, `rounds` times: each mode sees the same card state in turn.
      for (int round = 0; round < (graphs ? rounds : 1); ++round) {
        for (int graphed = 0; graphed <= (graphs ? 1 : 0); ++graphed) {
          bool finite = false;
          const double ms =
              graphed ? time_graph(*b, *model, st, reps, &finite) : time_forward(*b, *model, st, reps, &finite);
          std::printf("%5d %7d %5s %5d | %9.3f %8.3f | %9.1f %9.1f %9.3f | %6.1f%% %s\n", B, ctx,
                      graphed ? "graph" : "eager", round, ms, ms / L, weights / 1e6, kv / 1e6, floor_ms,
                      100 * floor_ms / ms, finite ? "finite" : "NOT FINITE");
          if (out) {
            std::fprintf(out,
                         "{\"bench\":\"v4_decode_step\",\"config\":\"%s\",\"experts\":\"%s\",\"qgemm\":%d,\"layers\":%d,\"batch\":%d,"
                         "\"context\":%d,\"step_ms\":%.4f,\"ms_per_layer\":%.4f,\"weight_bytes\":%.0f,"
                         "\"kv_bytes\":%.0f,\"roofline_gbps\":%.0f,"
                         "\"floor_ms\":%.4f,\"reps\":%d,\"graphs\":%s,\"round\":%d,\"logits_finite\":%s}\n",
                         config_path.c_str(), experts.c_str(), qgemm, L, B, ctx, ms, ms / L, weights, kv, gbps,
                         floor_ms, reps, graphed ? "true" : "false", round, finite ? "true" : "false");
            std::fflush(out);
          }
        }
      }
    }
  }
  for (int T : prefills) {
    bool finite = true;
    double ms = 0;
    const int chunk = prefill_chunk > 0 && prefill_chunk < T ? prefill_chunk : T;
    for (int done = 0; done < T; done += chunk) {
      const int q = std::min(chunk, T - done);
      Step st;
      make_step(*b, *v4, 1, done + q - 1, q, st);
      bool chunk_finite = false;
      ms += time_forward(*b, *model, st, T > 8192 ? 1 : 2, &chunk_finite);
      finite = finite && chunk_finite;
    }
    const StepCounts n = count(StepKind::Prefill, 1, T, (T + 1) / 2.0);
    const double flops = n.flops, bytes = n.weight_bytes;
    const double floor_ms = std::max(flops / (peak_tflops * 1e9), bytes / (gbps * 1e6));
    std::printf("prefill %6d tokens (chunks of %d): %9.1f ms (%8.3f ms/layer), %9.0f tok/s, %6.1f TFLOP/s, floor %.1f ms "
                "(%.1f%% of roofline), logits %s\n",
                T, chunk, ms, ms / L, T / (ms / 1e3), flops / (ms * 1e9), floor_ms, 100 * floor_ms / ms,
                finite ? "finite" : "NOT FINITE");
    if (out) {
      std::fprintf(out,
                   "{\"bench\":\"v4_prefill\",\"config\":\"%s\",\"experts\":\"%s\",\"qgemm\":%d,\"layers\":%d,\"tokens\":%d,\"chunk\":%d,"
                   "\"ms\":%.3f,\"ms_per_layer\":%.4f,\"tok_s\":%.1f,\"flops\":%.0f,\"weight_bytes\":%.0f,"
                   "\"peak_tflops\":%.0f,\"roofline_gbps\":%.0f,\"floor_ms\":%.4f,\"logits_finite\":%s}\n",
                   config_path.c_str(), experts.c_str(), qgemm, L, T, chunk, ms, ms / L, T / (ms / 1e3), flops, bytes, peak_tflops,
                   gbps, floor_ms, finite ? "true" : "false");
      std::fflush(out);
    }
  }
  if (out) std::fclose(out);
  return 0;
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) { return deepinfer::bench::main_guarded("v4_model_bench", deepinfer::run, argc, argv); }
