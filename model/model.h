// Model: a DeepSeek-family network on one backend. Built from a checkpoint
// directory (or random weights for benchmarks); runs one StepBatch at a time
// over a paged latent KV cache that the runner owns.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/kv_group_spec.h"
#include "model/step_batch.h"

namespace deepinfer {

struct ModelConfig;  // model/config.h

// Every KV layer group's caches: kv[g][l] = layer l of group g (Model::kv_groups).
using KvCaches = std::vector<std::vector<Tensor>>;

struct ParallelPlan;  // model/parallel.h

struct LoadOptions {
  // Progress callback for large checkpoints: (bytes done, bytes total).
  void (*progress)(uint64_t done, uint64_t total, void* user) = nullptr;
  void* progress_user = nullptr;
  bool load_mtp = true;          // load layer num_hidden_layers (MTP) when present
  // With load_mtp: an MTP block the checkpoint lacks entirely is skipped (the engine's default
  // speculation, 3 drafts only where an MTP layer exists) instead of failing on its first tensor.
  // V3's MTP layers are always optional (transformers does not save them).
  bool mtp_optional = false;
  bool random_weights = false;   // ignore files; make weights from `seed` (bench)
  uint64_t seed = 0;
  DType random_weight_dtype = DType::BF16;  // BF16 or F8_E4M3 (block-scaled)
  // deepseek_v4 / deepseek_v41 with F8_E4M3: routed experts FP4 e2m1 packed with E8M0 scales
  // (V4-Flash's and V4.1-Flash's format); false: F8_E4M3 like the dense linears.
  bool random_fp4_experts = true;
  // Scan every checkpoint tensor the model uses for NaN/Inf (model/weight_check.h) and fail
  // naming the first; false skips it (trusted checkpoints). Random weights are never scanned.
  bool check_finite = true;
  // DeepSeek-V4.1's prefill truncation (model/deepseek_v41/truncation.h; the engine fills these
  // from DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE / DEEPINFER_YOCO_PREFILL_KEEP_TOKENS): "compact"
  // runs the layers above the last KV source on a prompt's last keep rows only; "off" on all.
  std::string prefill_truncation_mode = "off";
  int64_t prefill_keep_tokens = 140;
  // Several processes (model/parallel.h): this rank's shard of the model and its communicator;
  // nullptr: one process, every weight.
  const ParallelPlan* parallel = nullptr;
};

// A model's prefill truncation as the engine sees it (Model::prefill_truncation): a prompt's rows
// more than `keep` tokens before its end skip the model's upper layers (StepBatch::
// host_replay_floor says where each sequence's kept rows start); the upper layers' window rows of
// positions from that floor + exact_lag on equal full prefill's, and only those may serve a later
// sequence from the prefix cache (Sequence::reuse_floor). keep 0: no truncation.
struct PrefillTruncation {
  int64_t keep = 0;
  int64_t exact_lag = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  // The model's KV state as layer groups (core/kv_group_spec.h; how the pieces use them:
  // kv/kv_groups.h). Group g's layers get kv[g][0 .. num_layers) in forward.
  virtual std::vector<KvGroupSpec> kv_groups() const = 0;
  // The groups the MTP layer has a cache in (one layer more in each, the same block tables):
  // num_mtp_kv_groups() groups from mtp_kv_group() on (V3: the latent group 0; V3.2: latent
  // and indexer keys; V4: its window group).
  virtual int mtp_kv_group() const { return 0; }
  virtual int num_mtp_kv_groups() const { return 1; }
  virtual int vocab_size() const = 0;
  // One forward step. kv[g][l] is layer l of group g, [num_blocks_g, block_size, row_dim]
  // in the group's dtype, addressed by batch.kv_groups[g] (group 0 also by
  // batch.block_tables / slot_mapping). logits: F32 [batch.logits_indices.numel(), vocab].
  // hidden_out (optional): the last hidden states AFTER the final norm at every row of the
  // step, [num_tokens, hidden] (what the MTP layer drafts from).
  virtual void forward(const StepBatch& batch, KvCaches& kv, Tensor& logits,
                       Tensor* hidden_out = nullptr) = 0;
  // MTP layers loaded (LoadOptions::load_mtp and present in the checkpoint).
  virtual int num_mtp_layers() const { return 0; }
  // Columns of a hidden row forward's hidden_out gives and mtp_forward takes and returns
  // (V3: hidden_size; V4: its hc_mult hyper-connection streams, hc_mult * hidden_size).
  virtual int64_t mtp_hidden_size() const;
  // Their dtype on a backend computing in `activation` (V3: the activation dtype; V4: F32,
  // its hyper-connection streams stay F32 on every backend).
  virtual DType mtp_hidden_dtype(DType activation) const { return activation; }
  // MTP layer 0 over one step (model/layers/mtp.h): row i holds the next token t_{i+1}
  // (batch.token_ids) at position i with hidden_in [T, hidden] = h_i; its rows go to kv
  // (the MTP layer's own caches: kv[i] = its layer of group mtp_kv_group() + i, addressed by
  // batch.kv_groups[i]); hidden_out [T, hidden]; logits F32 [batch.logits_indices.numel(), vocab].
  virtual void mtp_forward(const StepBatch& batch, std::span<Tensor> kv, const Tensor& hidden_in,
                           Tensor& hidden_out, Tensor& logits);
  // Whether forward and mtp_forward can be captured into a CUDA graph and replayed for new
  // steps of the same shape: no host reads of step inputs and no host-built inputs during a
  // step. V4 (model/deepseek_v4/model.h) builds its decode steps' KV addressing on the device
  // and its other steps' on the host: only its decode steps are captured.
  virtual bool graph_capturable() const { return true; }
  // The model's prefill truncation (above); none by default.
  virtual PrefillTruncation prefill_truncation() const { return {}; }
  // With graph_capturable: the most new tokens per sequence a captured step may have (V4: 1,
  // decode steps only; its verify steps run eagerly) and whether mtp_forward can be captured.
  virtual int max_graph_tokens_per_seq() const { return 1 << 30; }
  virtual bool mtp_graph_capturable() const { return true; }
  // Changes whenever forward or mtp_forward reallocates its workspaces: CUDA graphs
  // captured over them before then hold stale pointers (runner/ releases them).
  virtual uint64_t workspace_epoch() const { return 0; }
  // Expert parallelism: EPLB re-placements so far (model/expert_parallel.h); benches record it
  // so a window that held one can be told apart.
  virtual int64_t num_expert_replacements() const { return 0; }
  // EPLB's statistics flush (re-placement from the measured load) held while `hold` (a benchmark's
  // timed window): a flush due meanwhile runs when the hold is released. Every rank calls it at
  // the same point between steps (Runner::hold_expert_replacement); collective on release.
  virtual void hold_expert_replacement(bool) {}
  // Expert parallelism with DEEPINFER_EP_COMM_TIMING: seconds in the dispatch's collectives and
  // bytes sent to other ranks so far (model/expert_parallel.h Traffic).
  virtual double expert_comm_seconds() const { return 0; }
  virtual int64_t expert_comm_bytes() const { return 0; }
};

// Loads `dir` (config.json + safetensors) onto `backend`. Throws Error naming the
// file, tensor or field on bad input.
std::unique_ptr<Model> load_model(const std::string& dir, Backend& backend,
                                  const LoadOptions& options = {});
// Builds the model from a config.json alone with random weights (LoadOptions::seed).
std::unique_ptr<Model> random_model(const std::string& config_path, Backend& backend,
                                    const LoadOptions& options);

}  // namespace deepinfer
