#include "model/deepseek_v4/step_ops.h"

#include <algorithm>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"
#include "model/layers/rope_table.h"

namespace deepinfer::v4_family {

std::vector<int32_t> host_i32(Backend& be, const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  if (v.empty()) return v;
  DI_CHECK(t.dtype == DType::I32 && t.is_contiguous(), "expected contiguous I32, got ",
           t.describe());
  Tensor h(v.data(), DType::I32, t.dims());
  be.copy(t, h);
  return v;
}

DeviceBuffer upload_i32(Backend& be, const std::vector<int32_t>& v) {
  DeviceBuffer b = be.alloc(DType::I32, {static_cast<int64_t>(v.size())});
  if (!v.empty()) {
    Tensor h(const_cast<int32_t*>(v.data()), DType::I32, {static_cast<int64_t>(v.size())});
    be.copy(h, b.tensor());
  }
  return b;
}

Tensor cache_rows(const Tensor& cache) {
  return cache.view({cache.size(0) * cache.size(1), cache.size(2)});
}

void DeviceUploader::tensor(Tensor& t) {
  if (!t.defined() || t.device == be_.device()) return;
  DI_CHECK(t.is_contiguous(), model_, ": cannot upload non-contiguous ", t.describe());
  auto buf = std::make_shared<DeviceBuffer>(be_.alloc(t.dtype, t.dims()));
  be_.copy(t, buf->tensor());
  t = buf->tensor();
  owners_.push_back(buf);
}

void DeviceUploader::linear(Weight& w) {
  if (!w.w.defined()) return;
  if (w.w.device != Device::CPU) {  // made on the device (random FP8 weights): its scales may not be
    tensor(w.scale_inv);
    return;
  }
  // FP8 stays FP8 with its F32 block scales: 128x128 (the FP8 GEMMs) or blocks whose K side is a
  // multiple of 16 (V4.1's 32x32: the scale folded into the GEMMs' weight tiles, kWeightFP8Fold);
  // other blocks are dequantized to BF16 here.
  const bool fp8_other_blocks =
      w.w.dtype == DType::F8_E4M3 &&
      !(w.scale_inv.dtype == DType::F32 && w.block_n > 0 && w.block_k > 0 &&
        ((w.block_n == 128 && w.block_k == 128) || w.block_k % 16 == 0));
  if (w.w.dtype == DType::F32 || fp8_other_blocks) {
    DI_CHECK(w.w.ndim == 2 && w.w.is_contiguous(), model_, ": cannot convert weight ", w.w.describe());
    const int64_t N = w.w.size(0), K = w.w.size(1);
    auto h = std::make_shared<HostBuffer>(DType::BF16, w.w.dims());
    uint16_t* o = h->ptr<uint16_t>();
    if (w.w.dtype == DType::F32) {
      for (int64_t i = 0; i < N * K; ++i) o[i] = float_to_bf16(w.w.ptr<const float>()[i]);
    } else {
      DI_CHECK(w.scale_inv.dtype == DType::F32 && w.scale_inv.ndim == 2 && w.scale_inv.is_contiguous() &&
                   w.scale_inv.size(0) == (N + w.block_n - 1) / w.block_n &&
                   w.scale_inv.size(1) == (K + w.block_k - 1) / w.block_k,
               model_, ": FP8 weight ", w.w.describe(), " with ", w.block_n, "x", w.block_k,
               " blocks needs F32 scales, got ", w.scale_inv.describe());
      const int64_t sk = w.scale_inv.size(1);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k)
          o[n * K + k] = float_to_bf16(fp8_e4m3_to_float(w.w.ptr<const uint8_t>()[n * K + k]) *
                                       w.scale_inv.ptr<const float>()[(n / w.block_n) * sk + k / w.block_k]);
      w.scale_inv = Tensor();
      w.block_n = w.block_k = 128;
    }
    w.w = h->tensor();
    owners_.push_back(h);
  }
  tensor(w.w);
  tensor(w.scale_inv);
}

void DeviceUploader::hc(V4HyperConnection& h) {
  tensor(h.fn);
  tensor(h.base);
  tensor(h.scale);
}

void store_rows(Backend& be, const Tensor& rows, const Tensor& cache, const Tensor& slot_mapping) {
  PagedKV kv;
  kv.cache = cache;
  kv.slot_mapping = slot_mapping;
  be.kv_store(rows, kv);
}

Tensor columns(const Tensor& rows, int64_t c0, int64_t n) {
  Tensor v = rows;
  v.data = static_cast<char*>(rows.data) + c0 * static_cast<int64_t>(dtype_size(rows.dtype));
  v.shape[1] = n;
  return v;
}

void check_step(const Backend& be, const std::vector<KvGroupSpec>& groups, DType act,
                const StepBatch& batch, const KvCaches& kv, int64_t max_positions,
                const char* model) {
  DI_CHECK(kv.size() == groups.size() && batch.kv_groups.size() == groups.size(),
           "forward: ", model, " needs its ", groups.size(), " KV groups, got ", kv.size(),
           " caches and ", batch.kv_groups.size(), " block tables");
  for (size_t g = 0; g < groups.size(); ++g) {
    DI_CHECK(static_cast<int>(kv[g].size()) >= groups[g].num_layers, "forward: ", model,
             " KV group '", groups[g].name, "' needs ", groups[g].num_layers, " layers, got ",
             kv[g].size());
    for (int l = 0; l < groups[g].num_layers; ++l) {
      const Tensor& c = kv[g][static_cast<size_t>(l)];
      const DType dt = groups[g].row_dtype(act);
      DI_CHECK(c.device == be.device() && c.dtype == dt && c.ndim == 3 && c.is_contiguous() &&
                   c.size(2) == groups[g].row_dim,
               "forward: ", model, " KV group '", groups[g].name, "' layer ", l, ": ", c.describe(),
               " must be ", dtype_name(dt), " [blocks, block_size, ", groups[g].row_dim,
               "] on the ", be.name(), " backend");
    }
  }
  check_positions(batch, max_positions, model);
}

void check_positions(const StepBatch& batch, int64_t max_positions, const char* model) {
  const int64_t S = batch.num_seqs;
  DI_CHECK(batch.num_tokens > 0 && static_cast<int64_t>(batch.host_query_start.size()) == S + 1 &&
               static_cast<int64_t>(batch.host_seq_lens.size()) == S &&
               batch.host_query_start[0] == 0 && batch.host_query_start[S] == batch.num_tokens,
           "forward: ", model, " step of ", batch.num_tokens,
           " tokens with inconsistent query starts / seq_lens for ", S, " sequences");
  const int32_t* pos =
      batch.positions.device == Device::CPU ? batch.positions.ptr<const int32_t>() : nullptr;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t t0 = batch.host_query_start[s], t1 = batch.host_query_start[s + 1],
                  end = batch.host_seq_lens[s];
    DI_CHECK(t0 <= t1 && end >= t1 - t0 && end <= max_positions, "forward: ", model, " sequence ",
             s, ": ", t1 - t0, " new tokens ending at ", end, " (max_position_embeddings ",
             max_positions, ")");
    for (int64_t t = t0; pos != nullptr && t < t1; ++t)
      DI_CHECK(pos[t] == end - (t1 - t), "forward: ", model, " sequence ", s, ": token ", t,
               " at position ", pos[t], ", expected ", end - (t1 - t));
  }
}

int32_t StepHost::Rows::slot(int64_t r) const {
  const int64_t i = r / block_size;
  const int32_t b = i < width ? table[i] : -2;
  DI_CHECK(b >= 0 && b < num_blocks, model, ": row ", r, " of KV group '", *group,
           "' has no block (table ", "entry ", i, " is ", b, ": freed, or a table too short)");
  return static_cast<int32_t>(b * block_size + r % block_size);
}

StepHost StepHost::read(Backend& be, const StepBatch& batch, int64_t vocab, const char* model) {
  StepHost sh;
  sh.model = model;
  sh.token_ids = host_i32(be, batch.token_ids);
  for (int32_t id : sh.token_ids)
    DI_CHECK(id >= 0 && id < vocab, model, ": token id ", id, " outside the vocabulary of ", vocab);
  for (const KvGroupTables& g : batch.kv_groups)
    sh.tables.push_back(
        {host_i32(be, g.block_tables), g.block_tables.ndim == 2 ? g.block_tables.size(1) : 0});
  return sh;
}

namespace {

// The same angles with sin negated: rotation by -position.
HostBuffer inverse_table(const HostBuffer& table) {
  const Tensor& t = table.tensor();
  HostBuffer inv(DType::F32, t.dims());
  const int64_t rows = t.size(0), dim = t.size(1), half = dim / 2;
  for (int64_t p = 0; p < rows; ++p)
    for (int64_t i = 0; i < dim; ++i)
      inv.ptr<float>()[p * dim + i] = (i < half ? 1.0f : -1.0f) * t.ptr<const float>()[p * dim + i];
  return inv;
}

}  // namespace

void RopeTables::grow(Backend& be, const V4FamilyConfig& c, int64_t num_positions) {
  if (rows >= num_positions) return;
  const int64_t n =
      std::min<int64_t>(std::max<int64_t>({num_positions, 2 * rows, 256}),
                        std::max<int64_t>(c.base.max_position_embeddings, num_positions));
  auto put = [&](const HostBuffer& h) {
    DeviceBuffer d = be.alloc(DType::F32, h.tensor().dims());
    be.copy(h.tensor(), d.tensor());
    return d;
  };
  const HostBuffer m = rope_cos_sin_table(c.main_rope_dims(), n);
  const HostBuffer cp = rope_cos_sin_table(c.compress_rope_dims(), n);
  main = put(m);
  compress = put(cp);
  main_inv = put(inverse_table(m));
  compress_inv = put(inverse_table(cp));
  rows = n;
}

void moe_site(Backend& be, StepArena& arena, DType act, const V4FamilyConfig& c, const Tensor& x, const Weight& gate,
              const Tensor& bias, const Tensor& hash_rows,
              const std::vector<ExpertWeights>& experts, const ExpertWeights& shared, Tensor& y) {
  const int64_t T = x.size(0), H = c.base.hidden_size, E = c.base.n_routed_experts,
                K = c.base.num_experts_per_tok;
  ArenaScope scope(arena);
  DeviceBuffer rl = arena.alloc(DType::F32, {T, E}), tw = arena.alloc(DType::F32, {T, K});
  DeviceBuffer tid = arena.alloc(DType::I32, {T, K});
  be.gemm(x, gate, rl.tensor());
  be.moe_routing_sqrt_softplus(
      rl.tensor(), hash_rows.defined() ? Tensor() : bias, hash_rows, static_cast<int>(K),
      static_cast<float>(c.base.routed_scaling_factor), tid.tensor(), tw.tensor());
  be.moe_experts_clamped(x, tid.tensor(), tw.tensor(), experts, static_cast<float>(c.swiglu_limit),
                         y);
  if (!shared.gate.w.defined()) return;
  const int64_t I = shared.gate.out_features();
  DeviceBuffer gu = arena.alloc(act, {T, 2 * I}), h = arena.alloc(act, {T, I}),
               sx = arena.alloc(act, {T, H});
  Tensor g = columns(gu.tensor(), 0, I), u = columns(gu.tensor(), I, I);
  be.gemm(x, shared.gate, g);
  be.gemm(x, shared.up, u);
  be.silu_mul_clamped(gu.tensor(),
                      c.clamp_shared_expert ? static_cast<float>(c.swiglu_limit)
                                            : std::numeric_limits<float>::infinity(),
                      h.tensor());
  be.gemm(h.tensor(), shared.down, sx.tensor());
  be.add(y, sx.tensor());
}

void grouped_output(Backend& be, StepArena& arena, DType act, const V4FamilyConfig& c, const Tensor& attn,
                    const Weight& wo_a, const Weight& wo_b, Tensor& out) {
  const int64_t T = attn.size(0), heads = c.base.num_attention_heads, D = c.head_dim,
                G = c.o_groups;
  const int64_t gin = heads * D / G, ol = c.o_lora_rank;
  ArenaScope scope(arena);
  DeviceBuffer grouped = arena.alloc(act, {T, G * ol});
  const bool fp8 = wo_a.scale_inv.defined();  // FP8: each group takes its rows of block scales
  DI_CHECK(!fp8 || (wo_a.block_n > 0 && ol % wo_a.block_n == 0), c.base.source, ": FP8 wo_a with ", wo_a.block_n,
           "-row scale blocks cannot be cut into groups of o_lora_rank = ", ol, " rows");
  for (int64_t g = 0; g < G; ++g) {
    Weight wg;
    wg.w = wo_a.w.slice_rows(g * ol, (g + 1) * ol);
    if (fp8) {
      wg.scale_inv = wo_a.scale_inv.slice_rows(g * ol / wo_a.block_n, (g + 1) * ol / wo_a.block_n);
      wg.block_n = wo_a.block_n;
      wg.block_k = wo_a.block_k;
    }
    Tensor og = columns(grouped.tensor(), g * ol, ol);
    be.gemm(columns(attn, g * gin, gin), wg, og);
  }
  be.gemm(grouped.tensor(), wo_b, out);
}

}  // namespace deepinfer::v4_family
