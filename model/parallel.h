// Several processes (issue 20): which part of the model a rank holds and where the ranks
// combine their parts. One mechanism for every layer kind:
//  - a rank holds a shard of a weight: rows (output features) or columns (input features)
//    of a range, cut when weights load (shard_weights), so a layer's code is the one-process
//    code on smaller dimensions;
//  - a block whose output is a partial sum (attention's o_proj over the rank's heads, the dense
//    MLP's down over its intermediate columns, the MoE over its experts or intermediate
//    columns) is followed by one all_reduce_sum over the ranks that split it.
//
// Layouts (DeepInfer's flags; W = number of processes):
//  --tp T  attention heads and dense MLPs split over T ranks (T = W, --dp 1);
//  --ep E  routed experts split by expert over the W ranks (E = W): each rank holds
//          num_local_experts physical experts (logical ones plus EPLB's redundant copies,
//          model/eplb.h), and the MoE dispatches each row to the ranks of its experts and
//          combines their outputs back (model/expert_parallel.h; shared experts replicated,
//          each rank computes them on its own rows). E = 1 splits every expert's
//          intermediate instead (the MoE layer is tensor parallel like the dense MLP; shared
//          experts split by intermediate too, one all_reduce_sum after the block);
//  --tp 1 --ep W: attention and dense layers replicated, the MoE layers expert-parallel.
//  --dp W (attention data parallelism, --tp 1): each rank runs attention and dense layers on its
//          own sequences (their KV lives there); with --ep W the MoE dispatches the rank's own
//          rows; with --ep 1 the MoE layers see every rank's tokens: an all_gather of the step's
//          rows (padded to the largest rank's), the rank's columns over all of them, an
//          all_reduce_sum, the rank's own rows taken back.
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace deepinfer {

class Communicator;

struct ParallelPlan {
  int tp_rank = 0, tp_size = 1;    // attention heads, dense MLP intermediate
  int moe_rank = 0, moe_size = 1;  // the MoE layers' ranks (all W)
  int dp_rank = 0, dp_size = 1;    // attention data parallelism (--dp; tp_size 1 then)
  bool experts_split = false;      // EP: each MoE rank holds num_local_experts physical experts
  int num_local_experts = 0;       // with experts_split: (n_routed_experts + extra) / moe_size
  int num_extra_experts = 0;       // EPLB's redundant experts (eplb_num_extra_experts)
  // Physical expert p (rank p / num_local_experts holds it) computes logical expert
  // physical_to_logical[p]: the placement every layer starts with (contiguous, then the extra
  // copies of experts 0, 1, ...); EPLB replaces it per layer from measured load.
  std::vector<int> physical_to_logical;
  int eplb_interval = 0;           // steps between EPLB re-placements (0: never)
  // The FP8 GEMMs of non-CPU backends take 128x128 blocks only: shards must fall on block edges
  // (the CPU backend takes the finer blocks a misaligned shard gets: shard_weights).
  bool block_aligned = false;
  Communicator* comm = nullptr;    // the W ranks; nullptr when W == 1

  bool any() const { return tp_size > 1 || moe_size > 1 || dp_size > 1; }
  int first_local_expert() const { return moe_rank * num_local_experts; }
};

// The plan of rank `rank` of `world` processes for --tp/--ep/--dp; throws Error naming the flag
// when the layout is impossible (tp x dp != world, heads not divisible, ...). extra_experts: the
// redundant experts asked for (DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS), a lower bound rounded up
// so the physical experts divide over --ep (also when none were asked for).
ParallelPlan make_parallel_plan(const ModelConfig& config, int tp, int ep, int dp, int rank, int world,
                                int extra_experts = 0);

// Rows [begin, begin + count) / columns of a weight (FP8 block scales cut alongside; a cut
// inside a block gives the shard blocks of gcd(block, begin, count) rows / columns with the
// scales repeated, unless block_aligned, which throws naming `what`). Row shards are views;
// column shards are copies owned by `owners`.
Weight shard_weight_rows(const Weight& w, int64_t begin, int64_t count, bool block_aligned,
                         const std::string& what, std::vector<std::shared_ptr<const void>>& owners);
Weight shard_weight_cols(const Weight& w, int64_t begin, int64_t count, bool block_aligned,
                         const std::string& what, std::vector<std::shared_ptr<const void>>& owners);

// This rank's shard of host-readable weights (full: every tensor of the checkpoint, views).
// The result's owners keep `full`'s alive.
ModelWeights shard_weights(const ModelWeights& full, const ModelConfig& config, const ParallelPlan& plan);

// The config a rank's layers see: heads / tp_size (MLA's dimensions, the absorbed weights).
ModelConfig local_model_config(const ModelConfig& config, const ParallelPlan& plan);

}  // namespace deepinfer
