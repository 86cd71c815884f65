#include "model/parallel.h"

#include <cstring>
#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "model/eplb.h"

namespace deepinfer {
namespace {

using Owners = std::vector<std::shared_ptr<const void>>;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The block size of a shard [begin, begin + count) of a dimension of `size` cut in blocks of
// `block`: the block itself when the cut falls on block edges, else gcd(block, begin, count).
int64_t shard_block(int64_t block, int64_t begin, int64_t count, int64_t size, bool aligned,
                    const std::string& what) {
  if (begin % block == 0 && (count % block == 0 || begin + count == size)) return block;
  DI_CHECK(!aligned, what, ": the shard [", begin, ", ", begin + count, ") cuts FP8 blocks of ", block,
           " (this backend's FP8 GEMMs take ", block, "-wide blocks); choose a --tp/--ep that divides "
           "the dimension into multiples of ", block);
  return std::gcd(block, std::gcd(begin, count));
}

HostBuffer* new_buffer(DType dtype, std::vector<int64_t> dims, Owners& owners) {
  auto b = std::make_shared<HostBuffer>(dtype, std::move(dims));
  HostBuffer* raw = b.get();
  owners.push_back(std::move(b));
  return raw;
}

void check_host(const Weight& w, const std::string& what) {
  DI_CHECK(w.w.defined() && w.w.ndim == 2 && w.w.device == Device::CPU && w.w.stride[1] == 1 &&
               (!w.scale_inv.defined() || w.scale_inv.device == Device::CPU),
           what, ": sharding needs a host-readable 2-D weight, got ", w.w.describe());
}

}  // namespace

ParallelPlan make_parallel_plan(const ModelConfig& c, int tp, int ep, int dp, int rank, int world,
                                int extra_experts) {
  DI_CHECK(tp >= 1 && ep >= 1 && dp >= 1, "--tp ", tp, ", --ep ", ep, ", --dp ", dp, ": each must be >= 1");
  ParallelPlan p;
  if (world == 1) {
    const int n = std::max(tp * dp, ep);
    DI_CHECK(tp == 1 && ep == 1 && dp == 1, "--tp ", tp, " --ep ", ep, " --dp ", dp, ": one process; start ", n,
             " with mpirun -np ", n, " (or torchrun's RANK/WORLD_SIZE)");
    return p;
  }
  DI_CHECK(c.model_type == "deepseek_v3" || c.model_type == "deepseek_v2", "--tp/--ep: several processes run "
           "deepseek_v3 / deepseek_v2 models so far; ", c.source, " is ", c.model_type);
  DI_CHECK(ep == 1 || ep == world, "--ep ", ep, ": experts split over all ", world, " processes (--ep ", world,
           ") or none (--ep 1: every expert's intermediate split)");
  DI_CHECK(tp * dp == world || (tp == 1 && dp == 1 && ep == world), "--tp ", tp, " x --dp ", dp,
           " must equal the ", world, " processes (or --tp 1 --dp 1 --ep ", world,
           ": attention replicated, experts split)");
  DI_CHECK(c.num_attention_heads % tp == 0, "--tp ", tp, ": num_attention_heads ", c.num_attention_heads,
           " of ", c.source, " is not divisible by it");
  if (c.first_k_dense_replace > 0 || c.n_routed_experts == 0)
    DI_CHECK(c.intermediate_size % tp == 0, "--tp ", tp, ": intermediate_size ", c.intermediate_size, " of ",
             c.source, " is not divisible by it");
  p.tp_size = tp;
  p.tp_rank = rank % tp;
  p.dp_size = dp;
  p.dp_rank = rank / tp;
  if (c.n_routed_experts > 0) {
    p.moe_size = world;
    p.moe_rank = rank;
    if (ep > 1) {
      const int n = c.n_routed_experts;
      p.experts_split = true;
      p.num_extra_experts = eplb_num_extra_experts(n, ep, extra_experts);
      p.num_local_experts = (n + p.num_extra_experts) / ep;
      for (int e = 0; e < n + p.num_extra_experts; ++e) p.physical_to_logical.push_back(e % n);
    } else {
      DI_CHECK(c.moe_intermediate_size % world == 0, "--ep 1 over ", world, " processes: moe_intermediate_size ",
               c.moe_intermediate_size, " of ", c.source, " is not divisible by ", world,
               " (use --ep ", world, ")");
      DI_CHECK(c.shared_intermediate_size() % world == 0, "--tp/--ep over ", world, " processes: the shared "
               "experts' intermediate ", c.shared_intermediate_size(), " is not divisible by ", world);
    }
  }
  return p;
}

Weight shard_weight_rows(const Weight& w, int64_t begin, int64_t count, bool aligned, const std::string& what,
                         Owners& owners) {
  check_host(w, what);
  const int64_t N = w.out_features();
  DI_CHECK(begin >= 0 && count > 0 && begin + count <= N, what, ": rows [", begin, ", ", begin + count,
           ") outside ", w.w.describe());
  Weight out = w;
  out.w = w.w.slice_rows(begin, begin + count);
  if (!w.scale_inv.defined()) return out;
  const int64_t bn = shard_block(w.block_n, begin, count, N, aligned, what);
  if (bn == w.block_n) {
    out.scale_inv = w.scale_inv.slice_rows(begin / bn, ceil_div(begin + count, bn));
    return out;
  }
  const int64_t kb = w.scale_inv.size(1), rows = ceil_div(count, bn);
  HostBuffer* s = new_buffer(DType::F32, {rows, kb}, owners);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < kb; ++j)
      s->ptr<float>()[i * kb + j] =
          w.scale_inv.ptr<float>()[((begin + i * bn) / w.block_n) * w.scale_inv.stride[0] + j * w.scale_inv.stride[1]];
  out.scale_inv = s->tensor();
  out.block_n = static_cast<int>(bn);
  return out;
}

Weight shard_weight_cols(const Weight& w, int64_t begin, int64_t count, bool aligned, const std::string& what,
                         Owners& owners) {
  check_host(w, what);
  const int64_t N = w.out_features(), K = w.in_features();
  DI_CHECK(begin >= 0 && count > 0 && begin + count <= K, what, ": columns [", begin, ", ", begin + count,
           ") outside ", w.w.describe());
  Weight out = w;
  const size_t es = dtype_size(w.w.dtype);
  HostBuffer* b = new_buffer(w.w.dtype, {N, count}, owners);
  for (int64_t n = 0; n < N; ++n)
    std::memcpy(b->ptr<char>() + n * count * es, w.w.ptr<char>() + (n * w.w.stride[0] + begin) * es,
                static_cast<size_t>(count) * es);
  out.w = b->tensor();
  if (!w.scale_inv.defined()) return out;
  const int64_t bk = shard_block(w.block_k, begin, count, K, aligned, what);
  const int64_t nb = w.scale_inv.size(0), cols = ceil_div(count, bk);
  HostBuffer* s = new_buffer(DType::F32, {nb, cols}, owners);
  for (int64_t i = 0; i < nb; ++i)
    for (int64_t j = 0; j < cols; ++j)
      s->ptr<float>()[i * cols + j] =
          w.scale_inv.ptr<float>()[i * w.scale_inv.stride[0] + ((begin + j * bk) / w.block_k) * w.scale_inv.stride[1]];
  out.scale_inv = s->tensor();
  out.block_k = static_cast<int>(bk);
  return out;
}

namespace {

// An expert (or dense MLP) split by intermediate: gate/up rows, down columns, part r of n.
ExpertWeights shard_ffn(const ExpertWeights& e, int r, int n, bool aligned, const std::string& what, Owners& owners) {
  const int64_t I = e.gate.out_features() / n;
  ExpertWeights out;
  out.gate = shard_weight_rows(e.gate, r * I, I, aligned, what + ".gate_proj", owners);
  out.up = shard_weight_rows(e.up, r * I, I, aligned, what + ".up_proj", owners);
  out.down = shard_weight_cols(e.down, r * I, I, aligned, what + ".down_proj", owners);
  return out;
}

void shard_layer(LayerWeights& l, const std::string& name, const ModelConfig& c, const ParallelPlan& p, Owners& owners) {
  const bool al = p.block_aligned;
  if (p.tp_size > 1) {
    AttentionWeights& a = l.attn;
    const int64_t hl = c.num_attention_heads / p.tp_size, h0 = p.tp_rank * hl;
    const int64_t qk = c.qk_head_dim(), kvb = c.qk_nope_head_dim + c.v_head_dim, v = c.v_head_dim;
    if (c.has_q_lora()) {
      a.q_b_proj = shard_weight_rows(a.q_b_proj, h0 * qk, hl * qk, al, name + ".self_attn.q_b_proj", owners);
    } else {
      a.q_proj = shard_weight_rows(a.q_proj, h0 * qk, hl * qk, al, name + ".self_attn.q_proj", owners);
    }
    a.kv_b_proj = shard_weight_rows(a.kv_b_proj, h0 * kvb, hl * kvb, al, name + ".self_attn.kv_b_proj", owners);
    a.o_proj = shard_weight_cols(a.o_proj, h0 * v, hl * v, al, name + ".self_attn.o_proj", owners);
    if (!l.is_moe) l.mlp = shard_ffn(l.mlp, p.tp_rank, p.tp_size, al, name + ".mlp", owners);
  }
  if (!l.is_moe || p.moe_size == 1) return;
  MoeWeights& m = l.moe;
  if (p.experts_split) {  // the rank's physical experts; shared experts whole (each rank's own rows)
    std::vector<ExpertWeights> local;
    for (int i = 0; i < p.num_local_experts; ++i)
      local.push_back(m.experts[static_cast<size_t>(p.physical_to_logical[p.first_local_expert() + i])]);
    m.experts = std::move(local);
    return;
  }
  for (size_t e = 0; e < m.experts.size(); ++e)
    m.experts[e] = shard_ffn(m.experts[e], p.moe_rank, p.moe_size, al, name + ".mlp.experts." + std::to_string(e), owners);
  if (m.has_shared()) m.shared = shard_ffn(m.shared, p.moe_rank, p.moe_size, al, name + ".mlp.shared_experts", owners);
}

}  // namespace

ModelWeights shard_weights(const ModelWeights& full, const ModelConfig& config, const ParallelPlan& plan) {
  ModelWeights w = full;  // views; owners shared
  if (!plan.any()) return w;
  DI_CHECK(w.mtp.empty(), "shard_weights: MTP layers with several processes are not supported yet "
           "(speculative decoding is off under --tp/--ep)");
  for (size_t l = 0; l < w.layers.size(); ++l)
    shard_layer(w.layers[l], "model.layers." + std::to_string(l), config, plan, w.owners);
  return w;
}

ModelConfig local_model_config(const ModelConfig& config, const ParallelPlan& plan) {
  ModelConfig c = config;
  c.num_attention_heads /= plan.tp_size;
  return c;
}

}  // namespace deepinfer
