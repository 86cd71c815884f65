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
//  --dp D (attention data parallelism; D x T = W with --tp T): D groups of T ranks (rank =
//          dp_rank x T + tp_rank), each group runs attention and dense layers on its own
//          sequences (their KV lives there), heads split over its T ranks (all_reduce_sum over
//          tp_comm, the group's ranks). With --ep W the MoE dispatches the group's rows (cut into
//          T chunks, one per rank of the group, gathered back over tp_comm: with T = 1 each
//          rank its own rows); with --ep 1 the MoE layers see every group's tokens: an
//          all_gather over dp_comm (the ranks of the same tp_rank, one per group) of the step's
//          rows (padded to the largest group's), the rank's columns over all of them, an
//          all_reduce_sum over the W ranks, the group's own rows taken back.
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
  int dp_rank = 0, dp_size = 1;    // attention data parallelism (--dp): the rank's group
  bool experts_split = false;      // EP: each MoE rank holds num_local_experts physical experts
  int num_local_experts = 0;       // with experts_split: (n_routed_experts + extra) / moe_size
  int num_extra_experts = 0;       // EPLB's redundant experts (eplb_num_extra_experts)
  // Physical expert p (rank p / num_local_experts holds it) computes logical expert
  // physical_to_logical[p]: the placement every layer starts with (contiguous, then the extra
  // copies of experts 0, 1, ...); EPLB replaces it per layer from measured load.
  std::vector<int> physical_to_logical;
  int eplb_interval = 0;           // steps between EPLB re-placements (0: never)
  bool time_collectives = false;   // DEEPINFER_EP_COMM_TIMING: the dispatch's collectives timed
  // The FP8 GEMMs of non-CPU backends take 128x128 blocks only: shards must fall on block edges
  // (the CPU backend takes the finer blocks a misaligned shard gets: shard_weights).
  bool block_aligned = false;
  Communicator* comm = nullptr;    // the W ranks; nullptr when W == 1
  // --dp D with --tp T > 1 (Communicator::split of comm): tp_comm the T ranks of this rank's
  // data-parallel group (ranked by tp_rank), dp_comm the D ranks of its tp_rank (one per group,
  // ranked by dp_rank). nullptr otherwise: tp_group() / dp_group() are then comm.
  Communicator* tp_comm = nullptr;
  Communicator* dp_comm = nullptr;

  bool any() const { return tp_size > 1 || moe_size > 1 || dp_size > 1; }
  // The ranks that hold the same rows (attention's all_reduce_sum; the expert dispatch's chunks):
  // every rank without --dp, the data-parallel group's T ranks with it.
  Communicator& tp_group() const { return tp_comm != nullptr ? *tp_comm : *comm; }
  int replica_size() const { return dp_size > 1 ? tp_size : moe_size; }
  // One rank of each data-parallel group, the same tp_rank (--ep 1's MoE gathers over them).
  Communicator& dp_group() const { return dp_comm != nullptr ? *dp_comm : *comm; }
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
