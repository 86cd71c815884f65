// Expert-parallel load balancing (EPLB, DeepSeek's algorithm; issue 20): from each logical
// expert's measured load, choose how many replicas (redundant copies) each gets and which GPU
// holds each physical expert, so the GPUs' loads come out even. A pure function of the loads.
//
// Hierarchical when the expert groups (V3: n_group) divide evenly over the nodes:
//  1. pack the groups onto nodes, equal group counts per node, balancing the groups' loads
//     (the routing's group limit then keeps most of a token's experts on few nodes);
//  2. within each node, give the extra replicas one at a time to the expert whose load per
//     replica is the highest;
//  3. pack the node's physical experts onto its GPUs, equal counts per GPU, balancing load.
// Otherwise the same with one node holding every group (global).
// Balanced packing: items by descending weight, each to the lightest pack that still has room
// (ties: the lowest index), so the result is deterministic.
#pragma once
#include <span>
#include <vector>

namespace deepinfer {

struct EplbPlacement {
  // Physical expert p (GPU p / experts_per_gpu holds it) computes logical expert
  // physical_to_logical[p].
  std::vector<int> physical_to_logical;
  std::vector<int> replicas;  // [logical] copies of each logical expert (>= 1)
  int experts_per_gpu = 0;
};

// load: [num_logical] measured tokens (or any non-negative weight) per logical expert.
// num_physical >= num_logical, divisible by num_gpus; num_logical divisible by num_groups;
// num_gpus divisible by num_nodes. Throws Error naming the argument otherwise.
EplbPlacement eplb_place(std::span<const double> load, int num_physical, int num_groups, int num_nodes,
                         int num_gpus);

// The redundant experts a run gets: at least `requested` (DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS),
// rounded up so num_logical + extra divides over ep_size GPUs.
int eplb_num_extra_experts(int num_logical, int ep_size, int requested);

// Items [n] into num_packs packs of n / num_packs items each: pack of each item (the packing
// above; exposed for tests).
std::vector<int> eplb_balanced_packing(std::span<const double> weights, int num_packs);

}  // namespace deepinfer
