// moe_routing vs a double-precision statement of the V3/V2 rules (with ties), and
// moe_experts vs a double SwiGLU mixture; both batch-invariant.
#include <gtest/gtest.h>

#include <cstring>

#include "op_test_util.h"

namespace deepinfer {
namespace {

// The k best of `value` among `allowed` (ties: lowest index), by repeated selection.
std::vector<int> pick(const std::vector<double>& value, std::vector<bool> allowed, int k) {
  std::vector<int> out;
  for (int r = 0; r < k; ++r) {
    int best = -1;
    for (size_t i = 0; i < value.size(); ++i) {
      if (allowed[i] && (best < 0 || value[i] > value[best])) best = static_cast<int>(i);
    }
    out.push_back(best);
    allowed[best] = false;
  }
  return out;
}

void naive_route(const float* logits, const float* bias, const MoeRouting& r, std::vector<int>& ids,
                 std::vector<double>& weights) {
  const int E = r.num_experts;
  std::vector<double> score(E), choice(E);
  if (r.scoring == MoeRouting::Scoring::Sigmoid) {
    for (int e = 0; e < E; ++e) score[e] = 1.0 / (1.0 + std::exp(-double(logits[e])));
  } else {
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(double(logits[e]));
    for (int e = 0; e < E; ++e) score[e] = std::exp(double(logits[e])) / sum;
  }
  for (int e = 0; e < E; ++e) choice[e] = score[e] + (r.use_bias ? bias[e] : 0.0);
  std::vector<bool> allowed(E, true);
  if (r.group_limited && r.num_groups > 1) {
    const int per = E / r.num_groups;
    std::vector<double> gs(r.num_groups);
    for (int g = 0; g < r.num_groups; ++g) {
      std::vector<double> members(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      auto top = pick(members, std::vector<bool>(per, true), r.use_bias ? 2 : 1);
      gs[g] = 0;
      for (int i : top) gs[g] += members[i];
    }
    auto groups = pick(gs, std::vector<bool>(r.num_groups, true), r.top_k_groups);
    std::fill(allowed.begin(), allowed.end(), false);
    for (int g : groups) std::fill(allowed.begin() + g * per, allowed.begin() + (g + 1) * per, true);
  }
  ids = pick(choice, allowed, r.top_k);
  double sum = 0;
  weights.clear();
  for (int e : ids) sum += score[e];
  for (int e : ids) weights.push_back(score[e] / (r.normalize ? sum : 1.0) * r.scaling);
}

void check_routing(const MoeRouting& r, const HostBuffer& logits, const HostBuffer* bias) {
  auto backend = make_cpu_backend();
  const int64_t T = logits.tensor().size(0);
  HostBuffer ids(DType::I32, {T, r.top_k});
  HostBuffer w = test::f32_buffer({T, r.top_k}, NAN);
  backend->moe_routing(logits.tensor(), bias ? bias->tensor() : Tensor(), r, ids.tensor(), w.tensor());
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int> ref_ids;
    std::vector<double> ref_w;
    naive_route(logits.ptr<float>() + t * r.num_experts, bias ? bias->ptr<float>() : nullptr, r,
                ref_ids, ref_w);
    for (int j = 0; j < r.top_k; ++j) {
      ASSERT_EQ(ids.ptr<int32_t>()[t * r.top_k + j], ref_ids[j]) << "token " << t << " slot " << j;
      ASSERT_NEAR(w.ptr<float>()[t * r.top_k + j], ref_w[j], 1e-6 * (1 + std::fabs(ref_w[j])));
    }
  }
}

MoeRouting v3_routing() {
  MoeRouting r;
  r.scoring = MoeRouting::Scoring::Sigmoid;
  r.num_experts = 16;
  r.top_k = 3;
  r.num_groups = 4;
  r.top_k_groups = 2;
  r.use_bias = true;
  r.group_limited = true;
  r.normalize = true;
  r.scaling = 2.5f;
  return r;
}

TEST(CpuMoeRouting, SigmoidBiasGroups) {
  HostBuffer logits = test::random_f32({7, 16}, 1, 2.0f);
  HostBuffer bias = test::random_f32({16}, 2, 0.3f);
  check_routing(v3_routing(), logits, &bias);
}

TEST(CpuMoeRouting, TiesGoToLowestIndex) {
  HostBuffer logits = test::f32_buffer({3, 16}, 0.5f);
  HostBuffer bias = test::f32_buffer({16}, 0.0f);
  // token 0: equal logits; the bias alone lifts group 2 (experts 9 and 11 tie); the second
  // group is a four-way tie (group 0 wins) and so is the third expert (expert 0 wins).
  bias.ptr<float>()[9] = bias.ptr<float>()[11] = 0.25f;
  // token 1: groups 1 and 3 tie on top-2 sums above the rest; experts tie inside them.
  for (int e : {4, 5, 12, 13}) logits.ptr<float>()[16 + e] = 3.0f;
  // token 2: as token 0 but expert 1 slightly ahead inside group 0.
  logits.ptr<float>()[32 + 1] = 0.6f;
  check_routing(v3_routing(), logits, &bias);
  auto backend = make_cpu_backend();
  HostBuffer ids(DType::I32, {3, 3});
  HostBuffer w = test::f32_buffer({3, 3});
  backend->moe_routing(logits.tensor(), bias.tensor(), v3_routing(), ids.tensor(), w.tensor());
  EXPECT_EQ(std::vector<int>(ids.ptr<int32_t>(), ids.ptr<int32_t>() + 3), (std::vector<int>{9, 11, 0}));
  EXPECT_EQ(std::vector<int>(ids.ptr<int32_t>() + 3, ids.ptr<int32_t>() + 6),
            (std::vector<int>{4, 5, 12}));
  EXPECT_EQ(std::vector<int>(ids.ptr<int32_t>() + 6, ids.ptr<int32_t>() + 9),
            (std::vector<int>{9, 11, 1}));
}

TEST(CpuMoeRouting, SoftmaxGreedyAndGroupLimited) {
  HostBuffer logits = test::random_f32({5, 12}, 3, 1.5f);
  MoeRouting r;
  r.scoring = MoeRouting::Scoring::Softmax;
  r.num_experts = 12;
  r.top_k = 4;
  r.normalize = false;
  r.scaling = 1.0f;
  check_routing(r, logits, nullptr);  // greedy
  r.group_limited = true;
  r.num_groups = 3;
  r.top_k_groups = 2;
  r.scaling = 16.0f;
  check_routing(r, logits, nullptr);  // group_limited_greedy (group score = max)
  r.top_k = 9;                        // more than two groups of four can supply
  auto backend = make_cpu_backend();
  HostBuffer ids(DType::I32, {5, 9});
  HostBuffer w = test::f32_buffer({5, 9});
  EXPECT_THROW(backend->moe_routing(logits.tensor(), Tensor(), r, ids.tensor(), w.tensor()), Error);
}

TEST(CpuMoeExperts, MatchesNaiveAndIsBatchInvariant) {
  auto backend = make_cpu_backend();
  const int64_t E = 5, H = 24, I = 10, K = 2, T = 6;
  std::vector<HostBuffer> store;
  std::vector<ExpertWeights> experts(E);
  std::vector<std::vector<double>> gate(E), up(E), down(E);  // dequantized BF16 values
  auto make = [&](int64_t n, int64_t k, uint64_t seed, std::vector<double>& real) {
    HostBuffer src = test::random_f32({n, k}, seed, 0.3f);
    HostBuffer w(DType::BF16, {n, k});
    real.resize(n * k);
    for (int64_t i = 0; i < n * k; ++i) {
      w.ptr<uint16_t>()[i] = float_to_bf16(src.ptr<float>()[i]);
      real[i] = bf16_to_float(w.ptr<uint16_t>()[i]);
    }
    Weight out;
    out.w = w.tensor();
    store.push_back(std::move(w));
    return out;
  };
  for (int64_t e = 0; e < E; ++e) {
    experts[e].gate = make(I, H, 10 + e, gate[e]);
    experts[e].up = make(I, H, 20 + e, up[e]);
    experts[e].down = make(H, I, 30 + e, down[e]);
  }
  HostBuffer x = test::random_f32({T, H}, 40);
  HostBuffer ids = test::i32_buffer({0, 3, 3, 1, 4, 0, 2, 3, 1, 1, 0, 4});
  Tensor ids2 = ids.tensor().view({T, K});
  HostBuffer w = test::random_f32({T, K}, 41);
  HostBuffer out = test::f32_buffer({T, H}, NAN);
  backend->moe_experts(x.tensor(), ids2, w.tensor(), experts, out.tensor());
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> ref(H, 0.0);
    for (int64_t j = 0; j < K; ++j) {
      const int e = ids.ptr<int32_t>()[t * K + j];
      std::vector<double> act(I);
      for (int64_t i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int64_t h = 0; h < H; ++h) {
          g += gate[e][i * H + h] * x.ptr<float>()[t * H + h];
          u += up[e][i * H + h] * x.ptr<float>()[t * H + h];
        }
        act[i] = g / (1 + std::exp(-g)) * u;
      }
      for (int64_t h = 0; h < H; ++h) {
        double d = 0;
        for (int64_t i = 0; i < I; ++i) d += down[e][h * I + i] * act[i];
        ref[h] += w.ptr<float>()[t * K + j] * d;
      }
    }
    EXPECT_LE(test::max_abs_diff(out.ptr<float>() + t * H, ref.data(), H), 1e-5) << t;
    // The same token alone gives bit-identical output.
    HostBuffer one = test::f32_buffer({1, H});
    backend->moe_experts(x.tensor().slice_rows(t, t + 1), ids2.slice_rows(t, t + 1),
                         w.tensor().slice_rows(t, t + 1), experts, one.tensor());
    EXPECT_EQ(std::memcmp(one.ptr<float>(), out.ptr<float>() + t * H, H * 4), 0) << t;
  }
  ids.ptr<int32_t>()[3] = 5;  // expert id out of range
  EXPECT_THROW(backend->moe_experts(x.tensor(), ids2, w.tensor(), experts, out.tensor()), Error);
}

// E experts of F32 weights (gate/up [I, H], down [H, I]) from seeds gate + e, gate + 10 + e,
// gate + 20 + e; `store` owns them.
std::vector<ExpertWeights> random_experts(int64_t E, int64_t H, int64_t I, uint64_t seed,
                                          std::vector<HostBuffer>& store) {
  std::vector<ExpertWeights> experts(static_cast<size_t>(E));
  auto make = [&](int64_t n, int64_t k, uint64_t s) {
    store.push_back(test::random_f32({n, k}, s, 0.3f));
    Weight out;
    out.w = store.back().tensor();
    return out;
  };
  for (int64_t e = 0; e < E; ++e) {
    experts[e].gate = make(I, H, seed + e);
    experts[e].up = make(I, H, seed + 10 + e);
    experts[e].down = make(H, I, seed + 20 + e);
  }
  return experts;
}

// Experts are grouped by rows (several per threaded loop in small steps, one at a time in
// large ones): every token of a large step (160 expert rows over 3 experts) equals the token
// alone bitwise, on two threads.
TEST(CpuMoeExperts, LargeStepEqualsTokensAloneBitwise) {
  BackendOptions two;
  two.num_threads = 2;
  auto backend = make_cpu_backend(two);
  const int64_t E = 3, H = 32, I = 40, K = 2, T = 80;
  std::vector<HostBuffer> store;
  const std::vector<ExpertWeights> experts = random_experts(E, H, I, 50, store);
  HostBuffer x = test::random_f32({T, H}, 80);
  std::vector<int32_t> id_list(T * K);
  for (int64_t p = 0; p < T * K; ++p) id_list[p] = static_cast<int32_t>((p * 7 + p / 5) % E);
  for (int64_t t = 0; t < T; ++t)  // two different experts per token
    if (id_list[t * K] == id_list[t * K + 1]) id_list[t * K + 1] = (id_list[t * K] + 1) % E;
  HostBuffer ids = test::i32_buffer(id_list);
  Tensor ids2 = ids.tensor().view({T, K});
  HostBuffer w = test::random_f32({T, K}, 81);
  HostBuffer out = test::f32_buffer({T, H}, NAN);
  backend->moe_experts(x.tensor(), ids2, w.tensor(), experts, out.tensor());
  for (int64_t t = 0; t < T; ++t) {
    HostBuffer one = test::f32_buffer({1, H}, NAN);
    backend->moe_experts(x.tensor().slice_rows(t, t + 1), ids2.slice_rows(t, t + 1),
                         w.tensor().slice_rows(t, t + 1), experts, one.tensor());
    ASSERT_EQ(std::memcmp(one.ptr<float>(), out.ptr<float>() + t * H, H * 4), 0) << t;
  }
}

// Expert parallelism's split of moe_experts (model/expert_parallel.h): each (token, slot) row
// through its expert alone (one slot, weight 1: the raw output), rows in a shuffled order, then
// moe_combine with the token's weights at their positions: moe_experts' bits. A skipped slot
// (pos -1) contributes nothing; a position outside y throws.
TEST(CpuMoeCombine, ExpertRowsThenCombineAreMoeExpertsBits) {
  auto backend = make_cpu_backend();
  const int64_t E = 4, H = 40, I = 12, K = 3, T = 7, P = T * K;
  std::vector<HostBuffer> store;
  const std::vector<ExpertWeights> experts = random_experts(E, H, I, 90, store);
  HostBuffer x = test::random_f32({T, H}, 7);
  std::vector<int32_t> id_list(P), order(P), pos(P);
  for (int64_t p = 0; p < P; ++p) id_list[p] = static_cast<int32_t>((p * 5 + p / 3) % E);
  for (int64_t s = 0; s < P; ++s) order[s] = static_cast<int32_t>((s * 8) % P);  // row s is pair order[s]
  for (int64_t s = 0; s < P; ++s) pos[order[s]] = static_cast<int32_t>(s);
  HostBuffer ids = test::i32_buffer(id_list);
  HostBuffer w = test::random_f32({T, K}, 8);
  HostBuffer want = test::f32_buffer({T, H}, NAN);
  backend->moe_experts(x.tensor(), ids.tensor().view({T, K}), w.tensor(), experts, want.tensor());
  // The rows of the pairs in `order`, each with its expert and weight 1.
  HostBuffer xs = test::f32_buffer({P, H}), one_ids = test::i32_buffer(id_list), ones = test::f32_buffer({P, 1}, 1.0f);
  for (int64_t s = 0; s < P; ++s) {
    std::memcpy(xs.ptr<float>() + s * H, x.ptr<float>() + (order[s] / K) * H, H * 4);
    one_ids.ptr<int32_t>()[s] = id_list[order[s]];
  }
  HostBuffer y = test::f32_buffer({P, H}, NAN);
  backend->moe_experts(xs.tensor(), one_ids.tensor().view({P, 1}), ones.tensor(), experts, y.tensor());
  HostBuffer pos_buf = test::i32_buffer(pos);
  HostBuffer got = test::f32_buffer({T, H}, NAN);
  backend->moe_combine(y.tensor(), pos_buf.tensor().view({T, K}), w.tensor(), got.tensor());
  EXPECT_EQ(std::memcmp(got.ptr<float>(), want.ptr<float>(), T * H * 4), 0);
  // Token 0 without its slot 1: moe_experts with that slot's id -1.
  pos_buf.ptr<int32_t>()[1] = -1;
  ids.ptr<int32_t>()[1] = -1;
  backend->moe_experts(x.tensor(), ids.tensor().view({T, K}), w.tensor(), experts, want.tensor());
  backend->moe_combine(y.tensor(), pos_buf.tensor().view({T, K}), w.tensor(), got.tensor());
  EXPECT_EQ(std::memcmp(got.ptr<float>(), want.ptr<float>(), T * H * 4), 0);
  pos_buf.ptr<int32_t>()[2] = static_cast<int32_t>(P);
  EXPECT_THROW(backend->moe_combine(y.tensor(), pos_buf.tensor().view({T, K}), w.tensor(), got.tensor()), Error);
}

}  // namespace
}  // namespace deepinfer
