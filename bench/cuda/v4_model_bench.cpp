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
//
// --spec dspark (V4.1 with its DSpark drafter declared: num_nextn_predict_layers > 0; issue 19 item
// 6, bench/NOTES.md "v41spec19"): speculative decoding's parts instead of the plain decode records.
//  parts:  per batch B and context C, on the same caches: the plain decode step (1 token per
//          sequence at position C), the drafter's block (DeepseekV41Model::propose_blocks: the
//          block forward of block_size drafts, the Markov head's sequential argmax and the
//          confidence head, ids back on the host: what the engine's DsparkProposer runs) and the
//          verify step (1 + k tokens per sequence at positions C .. C + k, logits of every row, the
//          drafter's context rows written by the forward as in the engine's verify steps). With
//          per-position acceptance a_j = P(draft j accepted | drafts < j were), a verify step
//          emits E = 1 + a_1 + a_1 a_2 + ... + a_1..a_k tokens (i.i.d. a: (1 - a^(k+1)) / (1 - a))
//          in draft + verify ms against E plain steps: speedup = E * decode / (draft + verify);
//          records carry the speedup at a = 0, 0.5, 0.6, 0.7, 0.8, 0.9, 1 and at the measured E.
//  engine: (--spec-engine B1,B2,..) the engine itself (deepinfer/engine.h: its DsparkProposer,
//          exact greedy verification, its stats) on random weights of the same config, greedy,
//          with and without drafts: prompts of --spec-prompt tokens, --spec-tokens generated per
//          sequence; decode tokens/s with and without speculation (the time of max_tokens = N
//          less that of max_tokens = 1, prefix caching off), the drafter's measured acceptance
//          (per position, tokens per verify step) and the generated tokens of k drafts against
//          k = 0 (mismatched tokens: 0 where the kernels' rounding does not depend on a step's row
//          count, the CPU; the default CUDA kernels' may). --spec-check B: the same for B
//          sequences with the batch-invariant kernels, where speculation must give k = 0's tokens
//          exactly: exit status 4 if not. Runs before the bench's own model is built.
// Exit status 3 when any step's logits are not all finite.
//
// Usage: deepinfer_v4_model_bench --config CFG.json [--backend cuda|cpu] [--experts fp4|fp8]
//        [--batches 1,8,32,64] [--contexts 4096,32768] [--prefill 4096,32768] [--prefill-chunk 0]
//        [--keep 140] [--replay off,compact] [--reps 5] [--gbps 4800] [--peak-tflops 790]
//        [--graphs 0|1] [--rounds 3] [--out results.jsonl]
//        [--qgemm 0|1]  (routed FP4 / FP8 experts on the tensor-core grouped GEMM of moe_qgemm.cu:
//                        CudaOptions::moe_qgemm_fp4 and moe_qgemm_fp8; default: the options' defaults)
//        [--spec dspark] [--draft-k K (default: the block size)] [--tokens-per-verify E]
//        [--spec-engine 1,8] [--spec-prompt 512] [--spec-tokens 32]
//        [--spec-check 2] [--spec-check-prompt 160] [--spec-check-tokens 12]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/random.h"
#include "bench/cuda/bench_util.h"
#include "core/error.h"
#include "deepinfer/engine.h"
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
  // Per KV group: the host block tables [B, width] (the drafter reads its group's).
  std::vector<std::vector<int32_t>> tables;
  std::vector<int64_t> widths;
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

// The token of sequence i at position p in the benches' steps and prompts (ids 0 and 1, BOS and
// EOS in the configs here, never).
int32_t bench_token(int64_t i, int64_t p, int64_t vocab) {
  return static_cast<int32_t>(2 + (i * 7919 + p * 104729) % (vocab - 2));
}

// B sequences, each computing tokens [C - q + 1 .. C] (q = 1: decode at context C; B = 1 and
// q = C + 1: a prefill), every KV group laid out with the blocks it needs; replay_floor > 0: every
// sequence's StepBatch::host_replay_floor (V4.1's bounded replay). all_rows: logits of every row (a
// verify step), else of each sequence's last.
void make_step(Backend& b, const Model& m, const GroupFill& fill, int B, int64_t C, int64_t q, Step& st,
               int32_t replay_floor = 0, bool all_rows = false) {
  const std::vector<KvGroupSpec> groups = m.kv_groups();
  const int64_t end = C + 1, p0 = end - q;
  st.kv.assign(groups.size(), {});
  std::vector<std::vector<int32_t>>& tables = st.tables;
  std::vector<std::vector<int32_t>> slots(groups.size());
  std::vector<int64_t>& widths = st.widths;
  tables.assign(groups.size(), {});
  widths.assign(groups.size(), 0);
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
      ids.push_back(bench_token(i, p, mc.vocab_size));
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
  const int R = replay_floor > 0 && end - 1 < replay_floor ? 0 : all_rows ? static_cast<int>(T) : B;
  if (R > 0 && all_rows) {
    std::vector<int32_t> every(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) every[static_cast<size_t>(t)] = static_cast<int32_t>(t);
    batch.logits_indices = upload_i32(b, st.keep, every, {T});
  } else if (R > 0) {
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

// Mean ms of `reps` drafter blocks after one warm-up: DeepseekV41Model::propose_blocks as the engine's
// DsparkProposer runs it, one block per sequence anchored at position C (the token a decode step at
// C computes) reading the context rows before C from the step's "dspark_context" caches; the block
// forward, the Markov head's argmax steps and the confidence head, the drafts back on the host.
// drafts: their mean number per block.
double time_draft(Backend& b, DeepseekV41Model& m, Step& st, int B, int64_t C, int reps, double* drafts) {
  const size_t g = static_cast<size_t>(m.draft_kv_group());
  const int64_t width = st.widths[g];
  std::vector<DeepseekV41Model::BlockSeq> seqs(static_cast<size_t>(B));
  for (int i = 0; i < B; ++i) {
    DeepseekV41Model::BlockSeq& q = seqs[static_cast<size_t>(i)];
    q.anchor = bench_token(i, C, m.vocab_size());
    q.anchor_pos = C;
    q.block_ids = std::span<const int32_t>(st.tables[g]).subspan(static_cast<size_t>(i * width), static_cast<size_t>(width));
  }
  std::vector<DsparkDrafter::Output> out;
  m.propose_blocks(seqs, st.kv, m.vocab_size(), out);
  b.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) m.propose_blocks(seqs, st.kv, m.vocab_size(), out);
  b.synchronize();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
  double n = 0;
  for (const DsparkDrafter::Output& o : out) n += static_cast<double>(o.drafts.size());
  *drafts = B > 0 ? n / B : 0.0;
  return ms;
}

// Tokens a verify step of k drafts emits when each draft is accepted with probability a given the
// ones before it were: 1 + a + a^2 + ... + a^k.
double tokens_per_verify(double a, int k) {
  double e = 1, p = 1;
  for (int j = 0; j < k; ++j) e += (p *= a);
  return e;
}

// ---- The engine's speculative decoding on random weights (--spec-engine, --spec-check).

struct SpecEngineArgs {
  std::vector<int> batches;  // decode throughput and acceptance at these batches (default kernels)
  int prompt = 512, tokens = 32;
  int check = 0;  // batch of the batch-invariant equality check (0: none)
  int check_prompt = 160, check_tokens = 12;
};

// B prompts of `len` tokens (salt: other prompts per batch, nothing shared).
std::vector<Prompt> spec_prompts(int B, int len, int64_t vocab, int salt) {
  std::vector<Prompt> out;
  for (int i = 0; i < B; ++i) {
    std::vector<int32_t> ids(static_cast<size_t>(len));
    for (int p = 0; p < len; ++p) ids[static_cast<size_t>(p)] = bench_token(1000 * salt + i, p, vocab);
    out.push_back(Prompt::from_tokens(std::move(ids)));
  }
  return out;
}

EngineConfig spec_engine_config(const std::string& config, const std::string& backend, int k, bool invariant,
                                 int max_seqs, int max_len, int keep) {
  EngineConfig e;
  e.random_weights_config = config;
  e.random_weights_seed = 1;
  e.random_weights_dtype = "fp8";  // V4.1's formats: FP8 32x32 dense, FP4 experts (the drafter's too)
  e.backend = backend;
  e.batch_invariant = invariant;
  e.max_num_seqs = max_seqs;
  e.max_model_len = max_len;
  e.kv_cache_num_bytes = int64_t{2} << 30;  // capped at what max_num_seqs sequences of max_len need
  e.enable_prefix_caching = false;          // the timed generate recomputes the prompts as the first did
  e.prefill_truncation_mode = "compact";
  e.prefill_keep_tokens = keep;
  e.num_speculative_tokens = k;
  e.speculator = "mtp";  // V4.1 with its drafter: DsparkProposer
  e.spec_varlen = 0;     // every verify step k drafts (the block cut to k)
  return e;
}

SpecDecodeStats spec_minus(const SpecDecodeStats& a, const SpecDecodeStats& b) {
  SpecDecodeStats d;
  d.num_verify_steps = a.num_verify_steps - b.num_verify_steps;
  d.num_draft_tokens = a.num_draft_tokens - b.num_draft_tokens;
  d.num_accepted_tokens = a.num_accepted_tokens - b.num_accepted_tokens;
  d.num_emitted_tokens = a.num_emitted_tokens - b.num_emitted_tokens;
  d.accepted_per_position = a.accepted_per_position;
  d.drafts_per_position = a.drafts_per_position;
  for (size_t j = 0; j < b.accepted_per_position.size() && j < d.accepted_per_position.size(); ++j)
    d.accepted_per_position[j] -= b.accepted_per_position[j];
  for (size_t j = 0; j < b.drafts_per_position.size() && j < d.drafts_per_position.size(); ++j)
    d.drafts_per_position[j] -= b.drafts_per_position[j];
  return d;
}

struct EngineRun {
  double first_s = 0, total_s = 0;  // generate with max_tokens 1 (prefill and first token), then n
  std::vector<std::vector<int32_t>> tokens;
  SpecDecodeStats spec;  // of the n-token generate
};

EngineRun run_engine(Engine& e, const std::vector<Prompt>& prompts, int n) {
  SamplingParams p;
  p.temperature = 0;
  p.ignore_eos = true;
  EngineRun r;
  auto generate = [&](int tokens) {
    p.max_tokens = tokens;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<RequestOutput> out = e.generate(prompts, {p});
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const RequestOutput& o : out)
      DI_CHECK(o.error.empty() && o.outputs.size() == 1, "v4_model_bench --spec-engine: request ", o.request_id,
               " failed: ", o.error);
    return std::make_pair(s, std::move(out));
  };
  r.first_s = generate(1).first;
  const SpecDecodeStats before = e.stats().spec;
  auto [s, out] = generate(n);
  r.total_s = s;
  r.spec = spec_minus(e.stats().spec, before);
  for (const RequestOutput& o : out) r.tokens.push_back(o.outputs[0].token_ids);
  return r;
}

// Tokens of b that differ from a's at the same index (a missing one counts); compared: a's tokens.
int64_t mismatched(const std::vector<std::vector<int32_t>>& a, const std::vector<std::vector<int32_t>>& b,
                   int64_t* compared) {
  int64_t bad = 0;
  *compared = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t t = 0; t < a[i].size(); ++t) {
      ++*compared;
      bad += i >= b.size() || t >= b[i].size() || b[i][t] != a[i][t];
    }
  return bad;
}

std::string json_list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// Conditional acceptance per draft position: a_j = accepted at j / the verify steps that reached j (its
// draft verified, the ones before accepted: at most the accepted at j - 1 and the verified at j, the
// smaller, as steps near a request's max_tokens carry fewer drafts), 0 where nothing reached j.
std::vector<double> conditional_acceptance(const SpecDecodeStats& s) {
  std::vector<double> a;
  for (size_t j = 0; j < s.accepted_per_position.size() && j < s.drafts_per_position.size(); ++j) {
    const double verified = static_cast<double>(s.drafts_per_position[j]);
    const double reached = j == 0 ? verified : std::min(verified, static_cast<double>(s.accepted_per_position[j - 1]));
    a.push_back(reached > 0 ? static_cast<double>(s.accepted_per_position[j]) / reached : 0.0);
  }
  return a;
}

// The engine with and without k drafts (default kernels) at each batch, then the batch-invariant
// check. Returns the tokens per verify step over every batch (-1: no verify step), *exact: false when
// a comparison that must be exact was not (the check; every comparison on the CPU).
double spec_engine_phase(const std::string& config, const std::string& backend, int k, int keep,
                         const SpecEngineArgs& a, FILE* out, bool* exact) {
  *exact = true;
  const int64_t vocab = load_deepseek_v41_config(config).base.vocab_size;
  SpecDecodeStats pooled;
  if (!a.batches.empty()) {
    const int max_b = *std::max_element(a.batches.begin(), a.batches.end());
    const int max_len = a.prompt + a.tokens + k + 64;
    std::vector<EngineRun> plain, spec;
    double load_s[2] = {0, 0};
    for (int kk : {0, k}) {  // one engine at a time: each holds the whole model
      const auto t0 = std::chrono::steady_clock::now();
      Engine e(spec_engine_config(config, backend, kk, false, max_b, max_len, keep));
      load_s[kk > 0] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      run_engine(e, spec_prompts(1, 64, vocab, 99), 4);  // warm-up: first steps, lazy workspaces
      for (int B : a.batches) (kk ? spec : plain).push_back(run_engine(e, spec_prompts(B, a.prompt, vocab, B), a.tokens));
    }
    for (size_t i = 0; i < a.batches.size(); ++i) {
      const int B = a.batches[i];
      const EngineRun &p = plain[i], &s = spec[i];
      int64_t compared = 0;
      const int64_t bad = mismatched(p.tokens, s.tokens, &compared);
      if (backend == "cpu" && bad > 0) *exact = false;
      pooled.add(s.spec);
      const double decoded = static_cast<double>(B) * (a.tokens - 1);
      const double plain_tps = decoded / std::max(p.total_s - p.first_s, 1e-9);
      const double spec_tps = decoded / std::max(s.total_s - s.first_s, 1e-9);
      const std::vector<double> cond = conditional_acceptance(s.spec);
      std::string cond_s;
      for (double x : cond) cond_s += (cond_s.empty() ? "" : ",") + std::to_string(x);
      std::printf("spec engine batch %d (prompt %d, %d tokens, k=%d): decode %.2f tok/s plain, %.2f tok/s with "
                  "drafts (%.3fx); %lld verify steps, %lld drafts, %lld accepted (%.4f), %.4f tokens per verify, "
                  "acceptance per position [%s]; mismatched tokens %lld of %lld\n",
                  B, a.prompt, a.tokens, k, plain_tps, spec_tps, spec_tps / plain_tps,
                  static_cast<long long>(s.spec.num_verify_steps), static_cast<long long>(s.spec.num_draft_tokens),
                  static_cast<long long>(s.spec.num_accepted_tokens), s.spec.acceptance_rate(),
                  s.spec.tokens_per_verify_step(), cond_s.c_str(), static_cast<long long>(bad),
                  static_cast<long long>(compared));
      if (out) {
        std::fprintf(out,
                     "{\"bench\":\"v41_spec_engine\",\"config\":\"%s\",\"backend\":\"%s\",\"batch_invariant\":false,"
                     "\"batch\":%d,\"prompt\":%d,\"tokens\":%d,\"k\":%d,\"load_s\":[%.2f,%.2f],"
                     "\"plain_first_s\":%.4f,\"plain_total_s\":%.4f,\"plain_decode_tok_s\":%.3f,"
                     "\"spec_first_s\":%.4f,\"spec_total_s\":%.4f,\"spec_decode_tok_s\":%.3f,"
                     "\"num_verify_steps\":%lld,\"num_draft_tokens\":%lld,\"num_accepted_tokens\":%lld,"
                     "\"num_emitted_tokens\":%lld,\"acceptance_rate\":%.6f,\"tokens_per_verify\":%.6f,"
                     "\"accepted_per_position\":%s,\"drafts_per_position\":%s,\"conditional_acceptance\":[%s],"
                     "\"mismatched_tokens\":%lld,\"compared_tokens\":%lld}\n",
                     config.c_str(), backend.c_str(), B, a.prompt, a.tokens, k, load_s[0], load_s[1], p.first_s,
                     p.total_s, plain_tps, s.first_s, s.total_s, spec_tps,
                     static_cast<long long>(s.spec.num_verify_steps), static_cast<long long>(s.spec.num_draft_tokens),
                     static_cast<long long>(s.spec.num_accepted_tokens),
                     static_cast<long long>(s.spec.num_emitted_tokens), s.spec.acceptance_rate(),
                     s.spec.tokens_per_verify_step(), json_list(s.spec.accepted_per_position).c_str(),
                     json_list(s.spec.drafts_per_position).c_str(), cond_s.c_str(), static_cast<long long>(bad),
                     static_cast<long long>(compared));
        std::fflush(out);
      }
    }
  }
  const double tpv = pooled.num_verify_steps > 0 ? pooled.tokens_per_verify_step() : -1.0;
  if (!a.batches.empty())  // before the check: a script reads this line even if the check is cut short
    std::printf("spec engine: %.4f tokens per verify step over every batch%s\n", tpv,
                *exact ? "" : "; OUTPUTS DIFFER FROM NON-SPECULATIVE DECODING where they must not");
  std::fflush(stdout);
  if (a.check > 0) {  // the batch-invariant kernels: a verify row computes as a decode row does
    const int max_len = a.check_prompt + a.check_tokens + k + 64;
    std::vector<std::vector<int32_t>> got[2];
    SpecDecodeStats st;
    for (int kk : {0, k}) {
      Engine e(spec_engine_config(config, backend, kk, true, a.check, max_len, keep));
      EngineRun r = run_engine(e, spec_prompts(a.check, a.check_prompt, vocab, 7), a.check_tokens);
      got[kk > 0] = std::move(r.tokens);
      if (kk) st = r.spec;
    }
    int64_t compared = 0;
    const int64_t bad = mismatched(got[0], got[1], &compared);
    if (bad > 0) *exact = false;
    std::printf("spec check (batch-invariant kernels, batch %d, prompt %d, %d tokens, k=%d): %lld drafts, %lld "
                "accepted; mismatched tokens %lld of %lld\n",
                a.check, a.check_prompt, a.check_tokens, k, static_cast<long long>(st.num_draft_tokens),
                static_cast<long long>(st.num_accepted_tokens), static_cast<long long>(bad),
                static_cast<long long>(compared));
    if (out) {
      std::fprintf(out,
                   "{\"bench\":\"v41_spec_check\",\"config\":\"%s\",\"backend\":\"%s\",\"batch_invariant\":true,"
                   "\"batch\":%d,\"prompt\":%d,\"tokens\":%d,\"k\":%d,\"num_draft_tokens\":%lld,"
                   "\"num_accepted_tokens\":%lld,\"mismatched_tokens\":%lld,\"compared_tokens\":%lld}\n",
                   config.c_str(), backend.c_str(), a.check, a.check_prompt, a.check_tokens, k,
                   static_cast<long long>(st.num_draft_tokens), static_cast<long long>(st.num_accepted_tokens),
                   static_cast<long long>(bad), static_cast<long long>(compared));
      std::fflush(out);
    }
  }
  return tpv;
}

int run(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a log even when a time box kills the run
  std::vector<int> batches = {1, 8, 32, 64}, contexts = {4096, 32768}, prefills = {4096, 32768};
  int reps = 5, graphs = 0, rounds = 3, qgemm = -1, prefill_chunk = 0, keep = 140;
  double gbps = 4800, peak_tflops = 790;
  const char* out_path = nullptr;
  std::string config_path, experts = "fp4", backend_name = "cuda", replay = "off,compact", spec_mode;
  int draft_k = 0;
  double given_tpv = -1;  // --tokens-per-verify
  SpecEngineArgs engine_args;
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
    else if (!std::strcmp(argv[i], "--spec")) spec_mode = argv[i + 1];
    else if (!std::strcmp(argv[i], "--draft-k")) draft_k = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--tokens-per-verify")) given_tpv = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--spec-engine")) engine_args.batches = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--spec-prompt")) engine_args.prompt = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--spec-tokens")) engine_args.tokens = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--spec-check")) engine_args.check = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--spec-check-prompt")) engine_args.check_prompt = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--spec-check-tokens")) engine_args.check_tokens = std::atoi(argv[i + 1]);
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
  // --spec dspark: the config must declare V4.1's drafter; k drafts per verify step (1..block).
  const bool spec = !spec_mode.empty();
  DI_CHECK(!spec || spec_mode == "dspark", "v4_model_bench: --spec takes dspark (V4.1's drafter), got ", spec_mode);
  DI_CHECK(spec || (engine_args.batches.empty() && engine_args.check == 0 && draft_k == 0 && given_tpv < 0),
           "v4_model_bench: --draft-k, --tokens-per-verify, --spec-engine and --spec-check need --spec dspark");
  FILE* out = nullptr;
  double measured_tpv = given_tpv;
  bool spec_exact = true;
  if (spec) {
    const ModelConfig mc = load_model_config(config_path);
    DI_CHECK(mc.model_type == "deepseek_v41" || mc.model_type == "deepseek_v41_text", "v4_model_bench: --spec dspark ",
             "needs a deepseek_v41 config, ", config_path, " is ", mc.model_type);
    const DeepseekV41Config vc = load_deepseek_v41_config(config_path);
    DI_CHECK(vc.base.num_nextn_predict_layers > 0, "v4_model_bench: --spec dspark: ", config_path,
             " declares no DSpark drafter (field 'num_nextn_predict_layers' is 0)");
    if (draft_k == 0) draft_k = vc.dspark_block_size;
    DI_CHECK(draft_k >= 1 && draft_k <= vc.dspark_block_size, "v4_model_bench: --draft-k must be in [1, ",
             vc.dspark_block_size, "] (dspark_block_size), got ", draft_k);
    DI_CHECK(experts == "fp4", "v4_model_bench: --spec dspark runs V4.1's formats (--experts fp4; the engine's "
             "random weights have FP4 experts)");
    DI_CHECK(engine_args.prompt >= 1 && engine_args.tokens >= 2 && engine_args.check >= 0 &&
                 engine_args.check_prompt >= 1 && engine_args.check_tokens >= 1,
             "v4_model_bench: --spec-prompt >= 1, --spec-tokens >= 2, --spec-check >= 0, --spec-check-prompt >= 1 "
             "and --spec-check-tokens >= 1 expected");
    for (int B : engine_args.batches)
      DI_CHECK(B >= 1, "v4_model_bench: --spec-engine batches must be >= 1, got ", B);
    out = out_path ? std::fopen(out_path, "a") : nullptr;
    // The engine first, before this bench's own copy of the model exists (each holds all of it).
    if (!engine_args.batches.empty() || engine_args.check > 0) {
      const double tpv = spec_engine_phase(config_path, backend_name, draft_k, keep, engine_args, out, &spec_exact);
      if (given_tpv < 0) measured_tpv = tpv;
      if (!spec_exact) std::printf("spec engine: OUTPUTS DIFFER FROM NON-SPECULATIVE DECODING where they must not\n");
    }
    if (batches.empty() && contexts.empty() && prefills.empty()) {
      if (out) std::fclose(out);
      return spec_exact ? 0 : 4;
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
  DI_CHECK(!spec || (v41 != nullptr && v41->draft_block_size() > 0), "v4_model_bench: --spec dspark: ", config_path,
           " loaded without its DSpark drafter");
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
  if (!out && out_path) out = std::fopen(out_path, "a");
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
  if (spec) {
    // Speculation's parts per batch and context (the header comment): decode, draft, verify.
    static const double kAcceptance[] = {0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
    const int k = draft_k;
    std::printf("%5s %7s | %9s %9s %9s | %8s %8s | speedup at per-position acceptance a (E tokens per verify)%s\n",
                "batch", "context", "decode ms", "draft ms", "verify ms", "ver/dec", "E even",
                measured_tpv >= 0 ? " and at the measured E" : "");
    for (int ctx : contexts) {
      for (int B : batches) {
        double decode_ms = 0, draft_ms = 0, verify_ms = 0, drafts = 0, kv_alloc_per_token = 0;
        bool finite_decode = false, finite_verify = false;
        {
          Step st;
          make_step(*b, *model, fill, B, ctx, 1, st);
          decode_ms = time_forward(*b, *model, st, reps, &finite_decode);
          draft_ms = time_draft(*b, *v41, st, B, ctx, reps, &drafts);
          kv_alloc_per_token = st.kv_bytes / (static_cast<double>(B) * (ctx + 1));
        }
        {
          Step st;  // anchor at C, drafts at C + 1 .. C + k: positions C .. C + k, logits of every row
          make_step(*b, *model, fill, B, ctx + k, 1 + k, st, 0, /*all_rows=*/true);
          verify_ms = time_forward(*b, *model, st, reps, &finite_verify);
        }
        every_finite = every_finite && finite_decode && finite_verify;
        ++decode_records;
        const double cycle = draft_ms + verify_ms, even = cycle / decode_ms;
        std::string line, json = "[";
        for (double a : kAcceptance) {
          const double e = tokens_per_verify(a, k), speedup = e * decode_ms / cycle;
          char buf[96];
          std::snprintf(buf, sizeof buf, " a=%.1f %.2fx", a, speedup);
          line += buf;
          std::snprintf(buf, sizeof buf, "%s{\"a\":%.2f,\"tokens_per_verify\":%.4f,\"speedup\":%.4f}",
                        json.size() > 1 ? "," : "", a, e, speedup);
          json += buf;
        }
        json += "]";
        const double measured_speedup = measured_tpv >= 0 ? measured_tpv * decode_ms / cycle : -1.0;
        if (measured_tpv >= 0) {
          char buf[64];
          std::snprintf(buf, sizeof buf, " | measured E=%.3f %.3fx", measured_tpv, measured_speedup);
          line += buf;
        }
        std::printf("%5d %7d | %9.3f %9.3f %9.3f | %8.3f %8.3f |%s%s\n", B, ctx, decode_ms, draft_ms, verify_ms,
                    verify_ms / decode_ms, even, line.c_str(),
                    finite_decode && finite_verify ? "" : " LOGITS NOT FINITE");
        if (out) {
          std::fprintf(out,
                       "{\"bench\":\"v41_spec_step\",\"config\":\"%s\",\"backend\":\"%s\",\"experts\":\"%s\","
                       "\"qgemm\":%d,\"layers\":%d,\"batch\":%d,\"context\":%d,\"k\":%d,\"block_size\":%d,"
                       "\"decode_ms\":%.4f,\"draft_ms\":%.4f,\"verify_ms\":%.4f,\"drafts_per_block\":%.2f,"
                       "\"breakeven_tokens_per_verify\":%.4f,\"speedup_at\":%s,\"measured_tokens_per_verify\":%.4f,"
                       "\"measured_speedup\":%.4f,\"kv_alloc_bytes_per_token\":%.1f,\"reps\":%d,"
                       "\"logits_finite\":%s}\n",
                       config_path.c_str(), b->name().c_str(), experts.c_str(), qgemm, L, B, ctx, k,
                       v41->draft_block_size(), decode_ms, draft_ms, verify_ms, drafts, even, json.c_str(),
                       measured_tpv, measured_speedup, kv_alloc_per_token, reps,
                       finite_decode && finite_verify ? "true" : "false");
          std::fflush(out);
        }
      }
    }
    contexts.clear();  // the plain decode records below: the spec records carry decode_ms
  }
  if (!contexts.empty() && !batches.empty())
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
  return !every_finite ? 3 : !spec_exact ? 4 : 0;
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) { return deepinfer::bench::main_guarded("v4_model_bench", deepinfer::run, argc, argv); }
