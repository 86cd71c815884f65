// DeepSeek-V4 family whole-model step times (issue 16 item 6, issue 19 item 6): a truncated
// V4-Flash or V4.1-Flash config at full width with random weights made on the device (V4:
// model/deepseek_v4/weights_random.cpp; V4.1: random_v41_weights through make_random_tensors, the
// same Backend::fill_random), FP8 dense (V4: 128x128 blocks, V4.1: 32x32 E8M0), routed experts FP4
// packed or FP8, through the model's forward directly: eager, or (--graphs 1, V4 only) eager and
// CUDA-graph replay of the same decode step interleaved over --rounds rounds (V4's decode steps
// build their row lists on the device, so one captured step replays).
//  decode: B sequences at context C each run one step (one new token at position C). Every KV
//          group is laid out as the block manager would hold it (window and pending groups
//          only their last window's blocks, table entries before them -1) and filled with
//          random values instead of a prefill (step time does not depend on them, but for the
//          indexer's choice, which random keys scatter). V4.1's packed caches (FP8 window rows,
//          FP4 entries and indexer keys, kv_layout.h) are filled by quantizing random rows into
//          them (Backend::store_packed_rows: valid codes and scales), its Engram token cache
//          with valid compressed ids;
//  prefill: one sequence of T tokens from position 0 in one forward, or (--prefill-chunk N) in
//           chunks of N, each a forward over its N tokens after the positions before it (held in
//           the cache, random like decode's): the step times summed, as the engine's chunked
//           prefill runs a prompt too long for one step's scratch. V4.1: each prompt twice, with
//           bounded replay off (every layer on every row) and compact (the layers above the last
//           KV source on the prompt's last --keep rows: StepBatch::host_replay_floor as the
//           engine sets it; model/deepseek_v41/truncation.h), with the prefill FLOPs of each
//           (v41_layer_prefill_flops).
// V4 is counted by the project's count (model/deepseek_v4/step_counts.h, also `deepinfer
// bench`'s): the decode floor is (weight bytes a step reads + the KV rows it attends and the
// indexer keys it scores, BF16 on CUDA) / --gbps, with the routed experts a step touches
// expected under uniform routing; prefill's floor is the larger of its FLOPs / --peak-tflops
// and its weight bytes / --gbps. V4.1 has no such count yet: its records carry the raw times,
// the device bytes and (prefill) the FLOPs.
// KV bytes per token: from the model's KV groups (rows of groups that keep every row, per token of
// context; window groups per sequence), and per decode step the bytes of the caches it allocated.
// --backend cpu runs the same on the CPU reference (a tiny config: CI keeps this bench working).
// Exit status 3 when any step's logits are not all finite.
//
// Usage: deepinfer_v4_model_bench --config CFG.json [--backend cuda|cpu] [--experts fp4|fp8]
//        [--batches 1,8,32,64] [--contexts 4096,32768] [--prefill 4096,32768] [--prefill-chunk 0]
//        [--keep 140] [--replay off,compact] [--reps 5] [--gbps 4800] [--peak-tflops 790]
//        [--graphs 0|1] [--rounds 3] [--out results.jsonl]
//        [--qgemm 0|1]  (routed FP4 / FP8 experts on the tensor-core grouped GEMM of moe_qgemm.cu:
//                        CudaOptions::moe_qgemm_fp4 and moe_qgemm_fp8; default: the options' defaults)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/random.h"
#include "bench/cuda/bench_util.h"
#include "core/error.h"
#include "model/deepseek_v4/model.h"
#include "model/deepseek_v4/step_counts.h"
#include "model/deepseek_v41/model.h"
#include "model/deepseek_v41/truncation.h"
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
  double kv_bytes = 0;  // the caches' allocation
};

// Fills layer cache `cache` ([blocks, kBlock, row]) of KV group g with random content, from seed.
using GroupFill = std::function<void(size_t g, Tensor& cache, uint64_t seed)>;

// V4.1's caches (kv_layout.h): packed groups get random activation rows quantized into every slot
// (store_packed_rows, in chunks), the pending compressor inputs random activations, the Engram
// token cache valid compressed ids.
void fill_v41_group(Backend& b, const DeepseekV41Model& m, size_t g, Tensor& cache, uint64_t seed) {
  const V41KvLayout& lay = m.kv_layout();
  const DeepseekV41Config& c = m.v41_config();
  const int gi = static_cast<int>(g);
  const int64_t rows = cache.size(0) * cache.size(1);
  if (gi == lay.engram) {
    HostBuffer ids(DType::F32, cache.dims());
    for (int64_t i = 0; i < rows; ++i)
      ids.ptr<float>()[i] = static_cast<float>((i * 7919 + static_cast<int64_t>(seed)) % c.engram_compressed_vocab_size);
    b.copy(ids.tensor(), cache);
    b.synchronize();
    return;
  }
  Backend::FakeQuant format = V41KvLayout::kWindowFormat;
  int64_t channels = c.head_dim;
  bool packed = gi == lay.window;
  for (const V41KvLayout::Ratio& r : lay.ratios) {
    if (gi == r.compressed) packed = true, format = V41KvLayout::kEntryFormat;
    if (gi == r.indexer_keys) packed = true, format = V41KvLayout::kKeyFormat, channels = c.index_head_dim;
  }
  if (!packed) {  // activation rows (pending compressor inputs)
    b.fill_random(cache, seed, 1.0f);
    return;
  }
  const int64_t chunk = std::min<int64_t>(rows, 1 << 16);
  DeviceBuffer src = b.alloc(b.activation_dtype(), {chunk, channels});
  std::vector<int32_t> slots;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    Tensor x = src.tensor().slice_rows(0, n);
    b.fill_random(x, random_hash(seed, static_cast<uint64_t>(r0)), 1.0f);
    slots.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) slots[static_cast<size_t>(i)] = static_cast<int32_t>(r0 + i);
    std::vector<DeviceBuffer> keep;
    PagedKV kv;
    kv.cache = cache;
    kv.slot_mapping = upload_i32(b, keep, slots, {n});
    b.store_packed_rows(x, format, kv);
    b.synchronize();
  }
}

// B sequences, each computing tokens [C - q + 1 .. C] (q = 1: decode at context C; B = 1 and
// q = C + 1: a prefill), every KV group laid out with the blocks it needs; replay_floor > 0: every
// sequence's StepBatch::host_replay_floor (V4.1's bounded replay).
void make_step(Backend& b, const Model& m, const GroupFill& fill, int B, int64_t C, int64_t q, Step& st,
               int32_t replay_floor = 0) {
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
      Tensor t = st.keep.back().tensor();
      fill(g, t, 1000 + 37 * g + l);
      st.kv[g].push_back(t);
      st.kv_bytes += static_cast<double>(t.numel()) * static_cast<double>(dtype_size(t.dtype));
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
  // A prefill chunk wholly below the replay floor computes no logits (as the engine's chunks before
  // a prompt's last do not).
  const int R = replay_floor > 0 && end - 1 < replay_floor ? 0 : B;
  if (R > 0) {
    batch.logits_indices = upload_i32(b, st.keep, rows, {B});
  } else {
    st.keep.push_back(b.alloc(DType::I32, {0}));
    batch.logits_indices = st.keep.back().tensor();
  }
  batch.host_query_start = qs;
  batch.host_seq_lens = lens;
  if (replay_floor > 0) batch.host_replay_floor.assign(static_cast<size_t>(B), replay_floor);
  for (size_t g = 0; g < groups.size(); ++g)
    batch.kv_groups.push_back({upload_i32(b, st.keep, tables[g], {B, widths[g]}), upload_i32(b, st.keep, slots[g], {T})});
  batch.block_tables = batch.kv_groups[0].block_tables;
  batch.slot_mapping = batch.kv_groups[0].slot_mapping;
  st.keep.push_back(b.alloc(DType::F32, {R, mc.vocab_size}));
  st.logits = st.keep.back().tensor();
}

bool all_finite(Backend& b, const Tensor& logits) {
  if (logits.numel() == 0) return true;
  HostBuffer h(DType::F32, logits.dims());
  b.copy(logits, h.tensor());
  bool finite = true;
  for (int64_t i = 0; i < h.tensor().numel(); ++i) finite = finite && std::isfinite(h.ptr<float>()[i]);
  return finite;
}

// Mean ms of `reps` forwards after one warm-up; whether the last logits are all finite.
double time_forward(Backend& b, Model& m, Step& st, int reps, bool* finite) {
  m.forward(st.batch, st.kv, st.logits);
  b.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) m.forward(st.batch, st.kv, st.logits);
  b.synchronize();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
  *finite = all_finite(b, st.logits);
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
  *finite = all_finite(b, st.logits);
  return ms;
}

int run(int argc, char** argv) {
  std::vector<int> batches = {1, 8, 32, 64}, contexts = {4096, 32768}, prefills = {4096, 32768};
  int reps = 5, graphs = 0, rounds = 3, qgemm = -1, prefill_chunk = 0, keep = 140;
  double gbps = 4800, peak_tflops = 790;
  const char* out_path = nullptr;
  std::string config_path, experts = "fp4", backend_name = "cuda", replay = "off,compact";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--config")) config_path = argv[i + 1];
    else if (!std::strcmp(argv[i], "--backend")) backend_name = argv[i + 1];
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
    else if (!std::strcmp(argv[i], "--keep")) keep = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--replay")) replay = argv[i + 1];
    else fail("v4_model_bench: unknown flag ", argv[i]);
  }
  DI_CHECK(!config_path.empty(), "v4_model_bench: --config CFG.json is required");
  DI_CHECK(experts == "fp4" || experts == "fp8", "v4_model_bench: --experts must be fp4 or fp8, got ", experts);
  DI_CHECK(backend_name == "cuda" || backend_name == "cpu", "v4_model_bench: --backend must be cuda or cpu, got ",
           backend_name);
  if (argc % 2 == 0) fail("v4_model_bench: flag ", argv[argc - 1], " has no value");
  std::vector<std::string> replays;
  {
    std::stringstream ss(replay);
    std::string item;
    while (std::getline(ss, item, ',')) {
      DI_CHECK(item == "off" || item == "compact", "v4_model_bench: --replay takes off and/or compact, got ", item);
      replays.push_back(item);
    }
  }
  BackendOptions backend_options;
  if (qgemm >= 0) backend_options.cuda.moe_qgemm_fp4 = backend_options.cuda.moe_qgemm_fp8 = qgemm != 0;
  std::unique_ptr<Backend> b =
      backend_name == "cpu" ? make_cpu_backend(backend_options) : make_cuda_backend(backend_options);
  DI_CHECK(b != nullptr, "v4_model_bench: built without CUDA (--backend cpu runs the CPU reference)");
  LoadOptions options;
  options.seed = 1;
  options.load_mtp = false;
  options.random_weight_dtype = DType::F8_E4M3;
  options.random_fp4_experts = experts == "fp4";
  // V4.1: the model is built with bounded replay on (compact); a step runs every layer on every row
  // unless its batch carries a replay floor, so both modes run on the same weights.
  options.prefill_truncation_mode = "compact";
  options.prefill_keep_tokens = keep;
  const Backend::MemoryInfo before = b->memory_info();
  const auto t_load = std::chrono::steady_clock::now();
  std::unique_ptr<Model> model = random_model(config_path, *b, options);
  b->synchronize();
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  const Backend::MemoryInfo after = b->memory_info();
  auto* v4 = dynamic_cast<DeepseekV4Model*>(model.get());
  auto* v41 = dynamic_cast<DeepseekV41Model*>(model.get());
  DI_CHECK(v4 != nullptr || v41 != nullptr, "v4_model_bench: ", config_path,
           " is not a deepseek_v4 or deepseek_v41 config");
  DI_CHECK(!graphs || (b->supports_graphs() && model->graph_capturable()), "v4_model_bench: --graphs 1 needs a ",
           "backend with graphs and a model whose decode steps can be captured (V4 on CUDA)");
  const V4FamilyConfig& c = v4 ? static_cast<const V4FamilyConfig&>(v4->v4_config()) : v41->v41_config();
  const char* family = v4 ? "v4" : "v41";
  const int L = c.num_layers();
  const GroupFill fill = [&](size_t g, Tensor& t, uint64_t seed) {
    if (v41) fill_v41_group(*b, *v41, g, t, seed);
    else b->fill_random(t, seed, 1.0f);
  };
  // The project's count of V4 (model/deepseek_v4/step_counts.h): FP8 dense, experts as loaded,
  // BF16 KV rows (the KV dtype on CUDA). V4.1: none yet (zeros, and no floor in its records).
  auto count = [&](StepKind kind, int batch, int tokens, double context) {
    if (!v4) return StepCounts{};
    StepQuery q;
    q.kind = kind;
    q.linear_bytes = 1.0;
    q.expert_bytes = experts == "fp4" ? 0.0 : 1.0;
    q.batch = batch;
    q.tokens_per_seq = tokens;
    q.logits_rows = kind == StepKind::Decode ? batch : 1;
    q.context = context;
    q.kv_bytes_per_value = 2.0;
    return count_v4_step(v4->v4_config(), q);
  };
  const double model_bytes = static_cast<double>(before.free_bytes - after.free_bytes);
  // KV bytes per token of context (groups that keep every row) and per sequence (window rings,
  // pending rows, Engram look-back).
  double kv_per_token = 0, kv_per_seq = 0;
  std::string kv_groups_json;
  for (const KvGroupSpec& g : model->kv_groups()) {
    const double row = static_cast<double>(g.num_layers * g.row_bytes(b->activation_dtype()));
    if (g.window == 0) kv_per_token += row / g.tokens_per_row;
    else kv_per_seq += row * g.window;
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s{\"name\":\"%s\",\"layers\":%d,\"row_bytes\":%lld,\"tokens_per_row\":%d,\"window\":%d}",
                  kv_groups_json.empty() ? "" : ",", g.name.c_str(), g.num_layers,
                  static_cast<long long>(g.row_bytes(b->activation_dtype())), g.tokens_per_row, g.window);
    kv_groups_json += buf;
  }
  const double v3_per_token_layer = 576.0 * 2;  // V3's latent + rope row, BF16, per layer
  std::printf("%s (deepseek_%s on %s, FP8 dense, %s experts): %d layers, hidden %lld, %lld heads x %lld, %lld experts "
              "top-%lld, loaded in %.1f s, %.2f GB on the device (%.2f GB per layer incl. embed/head)\n",
              config_path.c_str(), family, b->name().c_str(), experts.c_str(), L,
              static_cast<long long>(c.base.hidden_size), static_cast<long long>(c.base.num_attention_heads),
              static_cast<long long>(c.head_dim), static_cast<long long>(c.base.n_routed_experts),
              static_cast<long long>(c.base.num_experts_per_tok), load_s, model_bytes / 1e9, model_bytes / 1e9 / L);
  std::printf("KV (%s rows): %.1f B per token of context (%.1f per layer; V3: %.0f per layer), %.0f B per sequence"
              " in window rings; 64 x 32k tokens: %.2f GB per layer\n",
              v41 ? "V4.1's packed FP8 / FP4" : "BF16", kv_per_token, kv_per_token / L, v3_per_token_layer, kv_per_seq,
              (kv_per_token * 64 * 32768 + kv_per_seq * 64) / 1e9 / L);
  FILE* out = out_path ? std::fopen(out_path, "a") : nullptr;
  const std::string bench_name = std::string(family) + "_model";
  if (out) {
    std::fprintf(out,
                 "{\"bench\":\"%s\",\"config\":\"%s\",\"backend\":\"%s\",\"experts\":\"%s\",\"layers\":%d,\"load_s\":%.2f,"
                 "\"device_bytes\":%.0f,\"kv_bytes_per_token\":%.1f,\"kv_bytes_per_seq_window\":%.0f,"
                 "\"v3_kv_bytes_per_token_layer\":%.0f,\"kv_groups\":[%s]}\n",
                 bench_name.c_str(), config_path.c_str(), b->name().c_str(), experts.c_str(), L, load_s, model_bytes,
                 kv_per_token, kv_per_seq, v3_per_token_layer, kv_groups_json.c_str());
    std::fflush(out);
  }

  bool every_finite = true;
  int decode_records = 0, prefill_records = 0;
  std::printf("%5s %7s %5s %5s | %9s %8s | %9s %9s %9s | %7s %9s %s\n", "batch", "context", "mode", "round",
              "step ms", "ms/layer", "weight MB", "KV MB", "floor ms", "%roofl", "KV B/tok", "logits");
  for (int ctx : contexts) {
    for (int B : batches) {
      Step st;
      make_step(*b, *model, fill, B, ctx, 1, st);
      const StepCounts n = count(StepKind::Decode, B, 1, ctx);
      const double weights = n.weight_bytes, kv = n.kv_bytes;
      const double floor_ms = (weights + kv) / (gbps * 1e6);
      const double kv_alloc_per_token = st.kv_bytes / (static_cast<double>(B) * (ctx + 1));
      // Eager then graph replay, `rounds` times: each mode sees the same card state in turn.
      for (int round = 0; round < (graphs ? rounds : 1); ++round) {
        for (int graphed = 0; graphed <= (graphs ? 1 : 0); ++graphed) {
          bool finite = false;
          const double ms =
              graphed ? time_graph(*b, *model, st, reps, &finite) : time_forward(*b, *model, st, reps, &finite);
          every_finite = every_finite && finite;
          ++decode_records;
          std::printf("%5d %7d %5s %5d | %9.3f %8.3f | %9.1f %9.1f %9.3f | %6.1f%% %9.1f %s\n", B, ctx,
                      graphed ? "graph" : "eager", round, ms, ms / L, weights / 1e6, kv / 1e6, floor_ms,
                      floor_ms > 0 ? 100 * floor_ms / ms : 0.0, kv_alloc_per_token, finite ? "finite" : "NOT FINITE");
          if (out) {
            std::fprintf(out,
                         "{\"bench\":\"%s_decode_step\",\"config\":\"%s\",\"backend\":\"%s\",\"experts\":\"%s\",\"qgemm\":%d,"
                         "\"layers\":%d,\"batch\":%d,"
                         "\"context\":%d,\"step_ms\":%.4f,\"ms_per_layer\":%.4f,\"weight_bytes\":%.0f,"
                         "\"kv_bytes\":%.0f,\"kv_alloc_bytes\":%.0f,\"kv_alloc_bytes_per_token\":%.1f,\"roofline_gbps\":%.0f,"
                         "\"floor_ms\":%.4f,\"reps\":%d,\"graphs\":%s,\"round\":%d,\"logits_finite\":%s}\n",
                         family, config_path.c_str(), b->name().c_str(), experts.c_str(), qgemm, L, B, ctx, ms, ms / L,
                         weights, kv, st.kv_bytes, kv_alloc_per_token, gbps, floor_ms, reps, graphed ? "true" : "false",
                         round, finite ? "true" : "false");
            std::fflush(out);
          }
        }
      }
    }
  }
  // V4.1: each prompt with bounded replay off and / or compact (the floor the engine sets: rows
  // before the prompt's last `keep` skip the layers above the last KV source).
  const V41PrefillTruncation* trunc = v41 ? &v41->truncation() : nullptr;
  const std::vector<std::string> modes = v41 ? replays : std::vector<std::string>{"none"};
  for (int T : prefills) {
    for (const std::string& mode : modes) {
      const int32_t floor =
          mode == "compact" && trunc->active() && T > trunc->keep ? static_cast<int32_t>(T - trunc->keep) : 0;
      bool finite = true;
      double ms = 0;
      const int chunk = prefill_chunk > 0 && prefill_chunk < T ? prefill_chunk : T;
      for (int done = 0; done < T; done += chunk) {
        const int q = std::min(chunk, T - done);
        Step st;
        make_step(*b, *model, fill, 1, done + q - 1, q, st, floor);
        bool chunk_finite = false;
        ms += time_forward(*b, *model, st, T > 8192 ? 1 : 2, &chunk_finite);
        finite = finite && chunk_finite;
      }
      every_finite = every_finite && finite;
      ++prefill_records;
      double flops = 0, bytes = 0;
      if (v4) {
        const StepCounts n = count(StepKind::Prefill, 1, T, (T + 1) / 2.0);
        flops = n.flops;
        bytes = n.weight_bytes;
      } else {  // v41_layer_prefill_flops: the truncated layers over the kept rows only
        const int first = floor > 0 ? trunc->first_layer : L;
        for (int l = 0; l < L; ++l) flops += v41_layer_prefill_flops(v41->v41_config(), l, l < first ? T : T - floor, T);
      }
      const double floor_ms = v4 ? std::max(flops / (peak_tflops * 1e9), bytes / (gbps * 1e6)) : 0.0;
      std::printf("prefill %6d tokens (chunks of %d, replay %s, floor %d): %9.1f ms (%8.3f ms/layer), %9.0f tok/s, "
                  "%.4g TFLOP, %6.1f TFLOP/s, floor %.1f ms (%.1f%% of roofline), logits %s\n",
                  T, chunk, mode.c_str(), floor, ms, ms / L, T / (ms / 1e3), flops / 1e12, flops / (ms * 1e9), floor_ms,
                  floor_ms > 0 ? 100 * floor_ms / ms : 0.0, finite ? "finite" : "NOT FINITE");
      if (out) {
        std::fprintf(out,
                     "{\"bench\":\"%s_prefill\",\"config\":\"%s\",\"backend\":\"%s\",\"experts\":\"%s\",\"qgemm\":%d,"
                     "\"layers\":%d,\"tokens\":%d,\"chunk\":%d,\"replay\":\"%s\",\"keep\":%d,\"replay_floor\":%d,"
                     "\"ms\":%.3f,\"ms_per_layer\":%.4f,\"tok_s\":%.1f,\"flops\":%.0f,\"weight_bytes\":%.0f,"
                     "\"peak_tflops\":%.0f,\"roofline_gbps\":%.0f,\"floor_ms\":%.4f,\"logits_finite\":%s}\n",
                     family, config_path.c_str(), b->name().c_str(), experts.c_str(), qgemm, L, T, chunk, mode.c_str(),
                     v41 ? static_cast<int>(trunc->keep) : 0, floor, ms, ms / L, T / (ms / 1e3), flops, bytes,
                     peak_tflops, gbps, floor_ms, finite ? "true" : "false");
        std::fflush(out);
      }
    }
  }
  if (out) std::fclose(out);
  std::printf("%s: %d decode steps, %d prefills, logits %s\n", family, decode_records, prefill_records,
              every_finite ? "all finite" : "NOT ALL FINITE");
  return every_finite ? 0 : 3;
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) { return deepinfer::bench::main_guarded("v4_model_bench", deepinfer::run, argc, argv); }
