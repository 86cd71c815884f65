#include "model/eplb.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace deepinfer {

std::vector<int> eplb_balanced_packing(std::span<const double> w, int num_packs) {
  const int n = static_cast<int>(w.size());
  DI_CHECK(num_packs >= 1 && n % num_packs == 0, "eplb: ", n, " items do not pack evenly into ", num_packs, " packs");
  const int per_pack = n / num_packs;
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return w[a] > w[b]; });
  std::vector<double> pack_load(static_cast<size_t>(num_packs), 0.0);
  std::vector<int> pack_items(static_cast<size_t>(num_packs), 0), pack_of(static_cast<size_t>(n), -1);
  for (int i : order) {
    int best = -1;
    for (int p = 0; p < num_packs; ++p)
      if (pack_items[p] < per_pack && (best < 0 || pack_load[p] < pack_load[best])) best = p;
    pack_of[i] = best;
    pack_load[best] += w[i];
    ++pack_items[best];
  }
  return pack_of;
}

namespace {

// Replicas of `w` [n] into m >= n physical experts: first one each, then each extra one to the
// expert with the highest load per replica (ties: the lowest index). Returns the logical
// expert of each physical slot; `count` gets each expert's replicas.
std::vector<int> replicate(std::span<const double> w, int m, std::vector<int>& count) {
  const int n = static_cast<int>(w.size());
  std::vector<int> phy(static_cast<size_t>(n));
  std::iota(phy.begin(), phy.end(), 0);
  count.assign(static_cast<size_t>(n), 1);
  for (int i = n; i < m; ++i) {
    int best = 0;
    for (int e = 1; e < n; ++e)
      if (w[e] / count[e] > w[best] / count[best]) best = e;
    phy.push_back(best);
    ++count[best];
  }
  return phy;
}

}  // namespace

EplbPlacement eplb_place(std::span<const double> load, int num_physical, int num_groups, int num_nodes,
                         int num_gpus) {
  const int n = static_cast<int>(load.size());
  DI_CHECK(n >= 1 && num_groups >= 1 && n % num_groups == 0, "eplb: ", n, " logical experts do not split into ",
           num_groups, " groups");
  DI_CHECK(num_gpus >= 1 && num_nodes >= 1 && num_gpus % num_nodes == 0, "eplb: ", num_gpus,
           " GPUs do not split over ", num_nodes, " nodes");
  DI_CHECK(num_physical >= n && num_physical % num_gpus == 0, "eplb: ", num_physical, " physical experts must be >= ",
           n, " logical ones and divide over ", num_gpus, " GPUs");
  for (double l : load) DI_CHECK(l >= 0.0, "eplb: negative expert load ", l);
  if (num_groups % num_nodes != 0 || (num_physical / num_nodes) % (num_gpus / num_nodes) != 0) {
    num_groups = 1;  // global: one node holds every group
    num_nodes = 1;
  }
  const int group_size = n / num_groups, groups_per_node = num_groups / num_nodes;
  const int phy_per_node = num_physical / num_nodes, gpus_per_node = num_gpus / num_nodes;
  DI_CHECK(phy_per_node >= groups_per_node * group_size, "eplb: ", phy_per_node, " physical experts per node hold "
           "fewer than its ", groups_per_node * group_size, " logical ones");
  // 1. Groups onto nodes.
  std::vector<double> group_load(static_cast<size_t>(num_groups), 0.0);
  for (int e = 0; e < n; ++e) group_load[e / group_size] += load[e];
  const std::vector<int> node_of_group = eplb_balanced_packing(group_load, num_nodes);
  EplbPlacement out;
  out.replicas.assign(static_cast<size_t>(n), 0);
  out.experts_per_gpu = num_physical / num_gpus;
  for (int node = 0; node < num_nodes; ++node) {
    std::vector<int> logical;  // the node's logical experts, group by group
    for (int g = 0; g < num_groups; ++g)
      if (node_of_group[g] == node)
        for (int e = g * group_size; e < (g + 1) * group_size; ++e) logical.push_back(e);
    std::vector<double> w;
    for (int e : logical) w.push_back(load[e]);
    // 2. Replicas within the node.
    std::vector<int> count;
    const std::vector<int> phy = replicate(w, phy_per_node, count);
    // 3. The node's physical experts onto its GPUs by load per replica.
    std::vector<double> phy_load;
    for (int p : phy) phy_load.push_back(w[p] / count[p]);
    const std::vector<int> gpu_of = eplb_balanced_packing(phy_load, gpus_per_node);
    for (int gpu = 0; gpu < gpus_per_node; ++gpu)
      for (size_t p = 0; p < phy.size(); ++p)
        if (gpu_of[p] == gpu) out.physical_to_logical.push_back(logical[phy[p]]);
    for (size_t i = 0; i < logical.size(); ++i) out.replicas[logical[i]] = count[i];
  }
  return out;
}

int eplb_num_extra_experts(int num_logical, int ep_size, int requested) {
  DI_CHECK(num_logical >= 1 && ep_size >= 1 && requested >= 0, "DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS: ", requested,
           " extra experts for ", num_logical, " over --ep ", ep_size, " (expected >= 0)");
  const int total = num_logical + requested;
  return (total + ep_size - 1) / ep_size * ep_size - num_logical;
}

}  // namespace deepinfer
