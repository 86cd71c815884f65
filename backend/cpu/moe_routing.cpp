// moe_routing: per token, choose top-k experts and their weights (MODELS.md, MoeRouting).
//  V3 (noaux_tc): scores = sigmoid(logits); choice = scores + e_score_correction_bias;
//      group score = sum of the top-2 choice scores of the group; keep top_k_groups groups.
//  V2: scores = softmax(logits); group score = max score of the group (group_limited_greedy).
// Experts are chosen by choice score inside the kept groups; ties go to the lowest index.
// Weights are the unbiased scores, / (sum + 1e-20) when normalize, times scaling.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace deepinfer::cpu {
namespace {

// Indices of the k largest values (descending; ties: lowest index first).
void top_k_indices(const float* values, const std::vector<int>& candidates, int k,
                   std::vector<int>& out) {
  out = candidates;
  std::partial_sort(out.begin(), out.begin() + k, out.end(), [&](int a, int b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  out.resize(static_cast<size_t>(k));
}

}  // namespace

void CpuBackend::moe_routing(const Tensor& logits, const Tensor& bias, const MoeRouting& routing,
                             Tensor& topk_ids, Tensor& topk_weights) {
  const Rows l = as_rows(logits, "moe_routing logits");
  const int E = routing.num_experts, K = routing.top_k;
  DI_CHECK(l.dtype == DType::F32 && l.cols == E, "moe_routing: logits must be F32 [T, ", E,
           "], got ", logits.describe());
  const int G = routing.group_limited ? routing.num_groups : 1;
  const int KG = routing.group_limited ? routing.top_k_groups : 1;
  DI_CHECK(G >= 1 && E % G == 0 && KG >= 1 && KG <= G && K >= 1 && K <= (E / G) * KG,
           "moe_routing: ", E, " experts in ", G, " groups keeping ", KG,
           " groups cannot supply top_k ", K);
  if (routing.use_bias) {
    check_cpu(bias, DType::F32, "moe_routing bias");
    DI_CHECK(bias.numel() == E && bias.is_contiguous(), "moe_routing: bias must be F32 [", E,
             "], got ", bias.describe());
  }
  check_cpu(topk_ids, DType::I32, "moe_routing topk_ids");
  check_cpu(topk_weights, DType::F32, "moe_routing topk_weights");
  DI_CHECK(topk_ids.numel() == l.rows * K && topk_weights.numel() == l.rows * K &&
               topk_ids.is_contiguous() && topk_weights.is_contiguous(),
           "moe_routing: topk_ids ", topk_ids.describe(), " and topk_weights ",
           topk_weights.describe(), " must be [", l.rows, ", ", K, "]");
  const float* b = routing.use_bias ? bias.ptr<float>() : nullptr;
  const int per_group = E / G;
  pool_->parallel_for(l.rows, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(E), choice(E), group_score(G);
    std::vector<int> all_groups(G), candidates, chosen_groups, chosen;
    std::iota(all_groups.begin(), all_groups.end(), 0);
    for (int64_t t = begin; t < end; ++t) {
      const float* x = l.f32(t);
      if (routing.scoring == MoeRouting::Scoring::Sigmoid) {
        for (int e = 0; e < E; ++e) scores[e] = 1.0f / (1.0f + std::exp(-x[e]));
      } else {
        float m = -INFINITY, sum = 0.0f;
        for (int e = 0; e < E; ++e) m = std::max(m, x[e]);
        for (int e = 0; e < E; ++e) sum += (scores[e] = std::exp(x[e] - m));
        for (int e = 0; e < E; ++e) scores[e] /= sum;
      }
      for (int e = 0; e < E; ++e) choice[e] = b ? scores[e] + b[e] : scores[e];
      candidates.clear();
      if (G > 1) {
        for (int g = 0; g < G; ++g) {
          const float* c = choice.data() + g * per_group;
          if (routing.use_bias) {  // sum of the two largest (one when the group has one expert)
            float a1 = -INFINITY, a2 = -INFINITY;
            for (int i = 0; i < per_group; ++i) {
              if (c[i] > a1) {
                a2 = a1;
                a1 = c[i];
              } else if (c[i] > a2) {
                a2 = c[i];
              }
            }
            group_score[g] = per_group >= 2 ? a1 + a2 : a1;
          } else {
            group_score[g] = *std::max_element(c, c + per_group);
          }
        }
        top_k_indices(group_score.data(), all_groups, KG, chosen_groups);
        std::sort(chosen_groups.begin(), chosen_groups.end());
        for (int g : chosen_groups) {
          for (int i = 0; i < per_group; ++i) candidates.push_back(g * per_group + i);
        }
      } else {
        for (int e = 0; e < E; ++e) candidates.push_back(e);
      }
      top_k_indices(choice.data(), candidates, K, chosen);
      int32_t* ids = topk_ids.ptr<int32_t>() + t * K;
      float* w = topk_weights.ptr<float>() + t * K;
      float sum = 0.0f;
      for (int j = 0; j < K; ++j) {
        ids[j] = chosen[j];
        w[j] = scores[chosen[j]];
        sum += w[j];
      }
      const float denom = routing.normalize ? sum + 1e-20f : 1.0f;
      for (int j = 0; j < K; ++j) w[j] = w[j] / denom * routing.scaling;
    }
  });
}

}  // namespace deepinfer::cpu
