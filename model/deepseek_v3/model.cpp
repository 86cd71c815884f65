#include "model/deepseek_v3/model.h"

#include <algorithm>
#include <cstring>

#include "model/layers/common.h"
#include "model/layers/rope_table.h"
#include "dist/communicator.h"
#include "model/expert_parallel.h"

namespace deepinfer {

std::vector<MlaAbsorbedWeights> make_absorbed_weights(const ModelConfig& config,
                                                      const ModelWeights& weights, Backend& backend) {
  std::vector<const LayerWeights*> blocks;
  for (const LayerWeights& layer : weights.layers) blocks.push_back(&layer);
  for (const MtpWeights& m : weights.mtp) blocks.push_back(&m.block);
  const MlaDims dims = config.mla_dims();
  std::vector<MlaAbsorbedWeights> out;
  for (const LayerWeights* block : blocks) {
    const Weight& src = block->attn.kv_b_proj;
    if (src.w.device == Device::CPU) {
      out.push_back(make_mla_absorbed_weights(dims, block->attn, backend));
      continue;
    }
    // Weights made on the device (random weights): a host copy of kv_b_proj, the one tensor
    // make_mla_absorbed_weights reads.
    AttentionWeights host_attn;
    Weight& kvb = host_attn.kv_b_proj;
    kvb = src;
    HostBuffer w(kvb.w.dtype, kvb.w.dims());
    backend.copy(src.w, w.tensor());
    kvb.w = w.tensor();
    HostBuffer s;
    if (kvb.scale_inv.defined()) {
      s = HostBuffer(kvb.scale_inv.dtype, kvb.scale_inv.dims());
      backend.copy(src.scale_inv, s.tensor());
      kvb.scale_inv = s.tensor();
    }
    backend.synchronize();
    out.push_back(make_mla_absorbed_weights(dims, host_attn, backend));
  }
  return out;
}

DeepseekV3Model::DeepseekV3Model(ModelConfig config, ModelWeights weights,
                                 std::vector<MlaAbsorbedWeights> absorbed, Backend& backend,
                                 ParallelPlan parallel, std::vector<std::vector<ExpertWeights>> eplb_experts,
                                 std::vector<std::shared_ptr<const void>> eplb_owners)
    : config_(std::move(config)),
      mla_dims_(local_model_config(config_, parallel).mla_dims()),
      ffn_dims_(config_.ffn_dims()),
      weights_(std::move(weights)),
      absorbed_(std::move(absorbed)),
      backend_(backend) {
  DI_CHECK(static_cast<int>(weights_.layers.size()) == config_.num_hidden_layers &&
               absorbed_.size() >= weights_.layers.size(),
           config_.source, ": weights hold ", weights_.layers.size(), " layers, config says ",
           config_.num_hidden_layers);
  if (config_.n_routed_experts > 0) routing_ = config_.moe_routing();
  parallel_ = parallel;
  DI_CHECK(!parallel_.any() || (parallel_.comm != nullptr && weights_.mtp.empty()),
           config_.source, ": several processes need a communicator and no MTP layer");
  DI_CHECK(parallel_.dp_size == 1 || parallel_.tp_size == 1 ||
               (parallel_.tp_comm != nullptr && parallel_.tp_comm->size() == parallel_.tp_size &&
                parallel_.dp_comm != nullptr && parallel_.dp_comm->size() == parallel_.dp_size),
           config_.source, ": --dp ", parallel_.dp_size, " --tp ", parallel_.tp_size,
           " needs the data-parallel groups' communicators (Communicator::split)");
  if (parallel_.experts_split)
    ep_ = std::make_unique<ExpertParallelMoe>(config_, parallel_, backend_, weights_.layers, std::move(eplb_experts),
                                              std::move(eplb_owners));
  const int64_t positions = std::max<int64_t>(config_.max_position_embeddings, 1);
  HostBuffer table = rope_cos_sin_table(config_.rope_dims(), positions);  // [positions, rope]
  cos_sin_ = backend_.alloc(DType::F32, table.tensor().dims());
  backend_.copy(table.tensor(), cos_sin_.tensor());
  if (!weights_.mtp.empty() && absorbed_.size() > weights_.layers.size()) {
    MtpDims mtp;
    mtp.hidden = config_.hidden_size;
    mtp.vocab = config_.vocab_size;
    mtp.rms_norm_eps = static_cast<float>(config_.rms_norm_eps);
    mtp.mla = mla_dims_;
    mtp.ffn = ffn_dims_;
    mtp.routing = routing_;
    mtp_ = std::make_unique<MtpLayer>(mtp, weights_.mtp[0], std::move(absorbed_[weights_.layers.size()]),
                                      weights_.embed_tokens, weights_.lm_head, backend_);
  }
}

DeepseekV3Model::~DeepseekV3Model() = default;

int64_t DeepseekV3Model::num_expert_replacements() const { return ep_ ? ep_->num_rebalances() : 0; }
double DeepseekV3Model::expert_comm_seconds() const { return ep_ ? ep_->traffic().comm_s : 0; }
int64_t DeepseekV3Model::expert_comm_bytes() const { return ep_ ? ep_->traffic().comm_bytes : 0; }
void DeepseekV3Model::hold_expert_replacement(bool hold) {
  if (ep_) ep_->hold(hold);
}

std::vector<KvGroupSpec> deepseek_v3_kv_groups(const ModelConfig& config) {
  KvGroupSpec latent;
  latent.name = "latent";
  latent.num_layers = config.num_hidden_layers;
  latent.row_dim = config.kv_row_dim();
  return {latent};
}

std::vector<KvGroupSpec> DeepseekV3Model::kv_groups() const { return deepseek_v3_kv_groups(config_); }

void DeepseekV3Model::mtp_forward(const StepBatch& batch, std::span<Tensor> kv, const Tensor& hidden_in,
                                  Tensor& hidden_out, Tensor& logits) {
  if (!mtp_) Model::mtp_forward(batch, kv, hidden_in, hidden_out, logits);
  mtp_->forward(batch, kv, cos_sin_.tensor(), hidden_in, hidden_out, logits);
}

uint64_t DeepseekV3Model::workspace_epoch() const {
  return workspace_epoch_ + (mtp_ ? mtp_->workspace_epoch() : 0) + (ep_ ? ep_->workspace_epoch() : 0);
}

void DeepseekV3Model::ensure_workspace(int64_t num_tokens) {
  if (num_tokens <= capacity_) return;
  // Grow geometrically so a run of slightly larger steps does not reallocate each time.
  const int64_t cap = std::max<int64_t>(num_tokens, std::min<int64_t>(2 * capacity_, 1 << 16));
  const DType dt = backend_.activation_dtype();
  const int64_t H = config_.hidden_size;
  buffers_.clear();
  for (Tensor* t : {&x_, &xn_, &delta_, &gathered_, &final_}) {
    buffers_.push_back(backend_.alloc(dt, {cap, H}));
    *t = buffers_.back().tensor();
  }
  mla_ws_ = make_mla_workspace(mla_dims_, backend_, cap);
  ffn_ws_ = make_ffn_workspace(ffn_dims_, backend_, cap);
  capacity_ = cap;
  ++workspace_epoch_;
}

void DeepseekV3Model::check_batch(const StepBatch& b, const KvCaches& kv, const Tensor& logits) const {
  DI_CHECK(b.num_tokens > 0 && b.num_seqs > 0, "forward: empty step (", b.num_tokens, " tokens, ",
           b.num_seqs, " sequences)");
  DI_CHECK(b.token_ids.numel() == b.num_tokens && b.positions.numel() == b.num_tokens &&
               b.slot_mapping.numel() == b.num_tokens,
           "forward: token_ids/positions/slot_mapping must hold num_tokens = ", b.num_tokens,
           " entries");
  DI_CHECK(static_cast<int>(b.host_query_start.size()) == b.num_seqs + 1 &&
               static_cast<int>(b.host_seq_lens.size()) == b.num_seqs &&
               b.host_query_start.back() == b.num_tokens,
           "forward: host_query_start/host_seq_lens must describe ", b.num_seqs,
           " sequences covering ", b.num_tokens, " tokens");
  check_kv_caches(kv);
  const int64_t R = b.logits_indices.numel();
  DI_CHECK(R <= b.num_tokens && logits.ndim == 2 && logits.size(0) == R &&
               logits.size(1) == config_.vocab_size,
           "forward: logits ", logits.describe(), " must be [", R, ", ", config_.vocab_size, "]");
}

void DeepseekV3Model::check_kv_caches(const KvCaches& kv) const {
  DI_CHECK(!kv.empty() && static_cast<int>(kv[0].size()) >= config_.num_hidden_layers,
           "forward: ", kv.empty() ? 0 : kv[0].size(), " KV caches for ", config_.num_hidden_layers, " layers");
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    const Tensor& c = kv[0][l];
    DI_CHECK(c.ndim == 3 && c.size(2) == config_.kv_row_dim(), "forward: KV cache of layer ", l,
             " ", c.describe(), " must be [blocks, block_size, ", config_.kv_row_dim(), "]");
  }
}

void DeepseekV3Model::attention(int layer, const StepBatch&, MlaStep& step, KvCaches& kv,
                                const Tensor& xn, Tensor& out) {
  step.kv.cache = kv[0][layer];
  mla_forward(backend_, mla_dims_, weights_.layers[layer].attn, absorbed_[layer], step, xn, mla_ws_,
              out);
}

// --ep 1: every data-parallel group's rows, padded to the largest group's T_max: [dp x T_max, H]
// gathered over dp_group() (one rank per group: the group's ranks hold the same rows), the rank's
// intermediate columns over all of them, summed over the W ranks, the group's own rows back.
// (--ep dispatches instead: model/expert_parallel.h.)
void DeepseekV3Model::moe_over_ranks(const StepBatch& batch, const LayerWeights& layer, const Tensor& xn,
                                     Tensor& delta) {
  const int W = parallel_.dp_size, r = parallel_.dp_rank;
  // No counts: every rank runs this same step (the engine's memory profile step, on all ranks).
  const std::vector<int32_t> counts = batch.host_dp_num_tokens.empty()
                                          ? std::vector<int32_t>(static_cast<size_t>(W), batch.num_tokens)
                                          : batch.host_dp_num_tokens;
  DI_CHECK(static_cast<int>(counts.size()) == W && counts[r] == batch.num_tokens, "forward: a data-parallel "
           "step needs every rank's token count (", counts.size(), " of ", W, ")");
  const int64_t T = batch.num_tokens, H = config_.hidden_size;
  const int64_t t_max = *std::max_element(counts.begin(), counts.end());
  if (t_max > dp_capacity_) {
    const int64_t cap = std::max<int64_t>(t_max, 2 * dp_capacity_);
    const DType dt = backend_.activation_dtype();
    dp_buffers_.clear();
    HostBuffer zeros(dt, {cap, H});  // padding rows stay finite (routed, then dropped)
    std::memset(zeros.tensor().data, 0, zeros.tensor().num_bytes());
    dp_buffers_.push_back(backend_.alloc(dt, {cap, H}));
    dp_send_ = dp_buffers_.back().tensor();
    backend_.copy(zeros.tensor(), dp_send_);
    for (Tensor* t : {&dp_in_, &dp_out_}) {
      dp_buffers_.push_back(backend_.alloc(dt, {W * cap, H}));
      *t = dp_buffers_.back().tensor();
    }
    dp_ffn_ws_ = make_ffn_workspace(ffn_dims_, backend_, W * cap);
    dp_capacity_ = cap;
    ++workspace_epoch_;
  }
  Tensor send = dp_send_.slice_rows(0, t_max);  // [T_max, H]: rows [0, T) this rank's
  Tensor own = send.slice_rows(0, T);
  backend_.copy(xn, own);
  Tensor in = dp_in_.slice_rows(0, W * t_max), out = dp_out_.slice_rows(0, W * t_max);
  parallel_.dp_group().all_gather(send, in);
  moe_forward(backend_, routing_, layer.moe, in, dp_ffn_ws_, out);
  parallel_.comm->all_reduce_sum(out);
  backend_.copy(out.slice_rows(r * t_max, r * t_max + T), delta);
}

void DeepseekV3Model::forward(const StepBatch& batch, KvCaches& kv, Tensor& logits, Tensor* hidden_out) {
  check_batch(batch, kv, logits);
  const int64_t T = batch.num_tokens, H = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  ensure_workspace(T);

  MlaStep step = make_mla_step(batch, cos_sin_.tensor(), backend_.batch_invariant());

  Tensor x = x_.slice_rows(0, T);          // [T, H] residual stream
  Tensor xn = xn_.slice_rows(0, T);        // [T, H] normed block input
  Tensor delta = delta_.slice_rows(0, T);  // [T, H] block output
  backend_.embedding(batch.token_ids, weights_.embed_tokens, x);
  const int L = config_.num_hidden_layers;
  if (L > 0) backend_.rms_norm(x, weights_.layers[0].input_layernorm, eps, xn);
  for (int l = 0; l < L; ++l) {
    const LayerWeights& layer = weights_.layers[l];
    attention(l, batch, step, kv, xn, delta);
    if (parallel_.tp_size > 1) parallel_.tp_group().all_reduce_sum(delta);  // heads split: sum of o_proj parts
    backend_.add_rms_norm(x, delta, layer.post_attention_layernorm, eps, xn);  // x += attn
    if (layer.is_moe && ep_ && parallel_.replica_size() == 1) {
      ep_->forward(l, layer.moe, xn, ffn_ws_, delta);  // each rank its own rows (--dp, --tp 1)
    } else if (layer.is_moe && ep_) {
      // The same rows on the ranks of tp_group(): every rank without --dp, a group's with it.
      ep_->forward_replicated(l, layer.moe, xn, ffn_ws_, delta, parallel_.tp_group());
    } else if (layer.is_moe && parallel_.dp_size > 1) {
      moe_over_ranks(batch, layer, xn, delta);
    } else if (layer.is_moe) {
      moe_forward(backend_, routing_, layer.moe, xn, ffn_ws_, delta);
      if (parallel_.moe_size > 1) parallel_.comm->all_reduce_sum(delta);  // columns split
    } else {
      mlp_forward(backend_, layer.mlp, xn, ffn_ws_, delta);
      if (parallel_.tp_size > 1) parallel_.tp_group().all_reduce_sum(delta);  // intermediate split
    }
    if (l + 1 < L) {
      backend_.add_rms_norm(x, delta, weights_.layers[l + 1].input_layernorm, eps, xn);
    } else {
      backend_.add(x, delta);
    }
  }
  if (ep_) ep_->end_step();
  if (hidden_out != nullptr) {  // every row after the final norm (MTP drafting)
    DI_CHECK(hidden_out->numel() == T * H, "forward: hidden_out ", hidden_out->describe(),
             " must be [", T, ", ", H, "]");
    backend_.rms_norm(x, weights_.norm, eps, *hidden_out);
  }
  // Only the requested rows go through the final norm and the output head.
  const int64_t R = batch.logits_indices.numel();
  if (R == 0) return;
  Tensor gathered = gathered_.slice_rows(0, R);  // [R, H] = x[logits_indices]
  backend_.embedding(batch.logits_indices, x, gathered);
  Tensor normed = final_.slice_rows(0, R);
  backend_.rms_norm(gathered, weights_.norm, eps, normed);
  backend_.gemm(normed, weights_.lm_head, logits);
}

}  // namespace deepinfer
