// EPLB (model/eplb.h): placements checked against properties and small cases worked by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "model/eplb.h"

namespace deepinfer {
namespace {

TEST(Eplb, BalancedPackingByHand) {
  // Descending: 9 (0), 7 (3), 5 (1), 2 (2): 9 -> pack 0, 7 -> pack 1, 5 -> pack 1 (7 < 9),
  // 2 -> pack 0 (pack 1 is full).
  const std::vector<double> w = {9, 5, 2, 7};
  EXPECT_EQ(eplb_balanced_packing(w, 2), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_THROW(eplb_balanced_packing(w, 3), Error);
}

TEST(Eplb, HotExpertGetsTheReplicasAndGpusBalance) {
  // 4 experts in 2 groups, 6 physical slots on 2 GPUs, one node: expert 2 carries most load.
  const std::vector<double> load = {10, 10, 100, 10};
  const EplbPlacement p = eplb_place(load, 6, 2, 1, 2);
  EXPECT_EQ(p.replicas, (std::vector<int>{1, 1, 3, 1}));  // 100/1 > 100/2 > 10, then 100/3 > 10
  ASSERT_EQ(p.physical_to_logical.size(), 6u);
  EXPECT_EQ(p.experts_per_gpu, 3);
  std::vector<double> gpu_load(2, 0.0);
  for (int i = 0; i < 6; ++i) {
    const int e = p.physical_to_logical[i];
    gpu_load[i / 3] += load[e] / p.replicas[e];
  }
  // Slots of 33.3 x 3 and 10 x 3: each GPU gets at least one hot replica.
  EXPECT_LT(std::max(gpu_load[0], gpu_load[1]), 100.0 / 3 * 2 + 10 + 1e-9);
  for (int e = 0; e < 4; ++e)
    EXPECT_EQ(std::count(p.physical_to_logical.begin(), p.physical_to_logical.end(), e), p.replicas[e]);
}

TEST(Eplb, HierarchicalKeepsGroupsOnTheirNode) {
  // 16 experts in 4 groups over 2 nodes of 2 GPUs, 24 physical experts.
  std::vector<double> load(16);
  for (int e = 0; e < 16; ++e) load[e] = 1 + (e * 7) % 11;
  const EplbPlacement p = eplb_place(load, 24, 4, 2, 4);
  ASSERT_EQ(p.physical_to_logical.size(), 24u);
  EXPECT_EQ(std::accumulate(p.replicas.begin(), p.replicas.end(), 0), 24);
  for (int node = 0; node < 2; ++node) {  // a node's 12 slots hold whole groups only
    std::vector<int> groups;
    for (int i = node * 12; i < node * 12 + 12; ++i) groups.push_back(p.physical_to_logical[i] / 4);
    std::sort(groups.begin(), groups.end());
    groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
    EXPECT_EQ(groups.size(), 2u) << "node " << node;
  }
  for (int r : p.replicas) EXPECT_GE(r, 1);
}

TEST(Eplb, ExtraExpertsRoundUpToTheEpSize) {
  EXPECT_EQ(eplb_num_extra_experts(256, 8, 0), 0);
  EXPECT_EQ(eplb_num_extra_experts(256, 8, 1), 8);
  EXPECT_EQ(eplb_num_extra_experts(256, 8, 32), 32);
  EXPECT_EQ(eplb_num_extra_experts(16, 3, 0), 2);  // 18 over 3 GPUs
  EXPECT_THROW(eplb_num_extra_experts(16, 2, -1), Error);
  EXPECT_THROW(eplb_place(std::vector<double>{1, 2, 3}, 4, 1, 1, 3), Error);  // 4 slots over 3 GPUs
}

}  // namespace
}  // namespace deepinfer
