// Several processes (issue 20), the parts that need no second process: the launcher's
// environment, layout checks that name the flag, weight shards (FP8 block scales cut with
// them), and the sharded feed-forward blocks, whose per-rank partial outputs sum to the
// one-process output (what the all-reduce after them computes; e2e_parallel runs it on
// mpirun). References are written out here, not taken from the code under test.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "dist/communicator.h"
#include "model/config.h"
#include "model/layers/moe.h"
#include "model/parallel.h"

namespace deepinfer {
namespace {

std::map<std::string, std::string> g_env;
const char* fake_env(const char* name) {
  auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ProcessLayout, LaunchersAndErrors) {
  g_env = {};
  ProcessLayout l = process_layout_from(fake_env);
  EXPECT_EQ(l.world_size, 1);
  EXPECT_EQ(l.launcher, "none");
  g_env = {{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}};
  l = process_layout_from(fake_env);
  EXPECT_EQ(l.launcher, "mpirun");
  EXPECT_EQ(l.rank, 3);
  EXPECT_EQ(l.world_size, 4);
  EXPECT_EQ(l.local_rank, 1);
  g_env = {{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "127.0.0.1"},
           {"MASTER_PORT", "29500"}};
  l = process_layout_from(fake_env);
  EXPECT_EQ(l.launcher, "torchrun");
  EXPECT_EQ(l.master_addr, "127.0.0.1");
  EXPECT_EQ(l.master_port, 29500);
  g_env["TORCHELASTIC_USE_AGENT_STORE"] = "True";  // torchrun's own store holds MASTER_PORT
  EXPECT_EQ(process_layout_from(fake_env).master_port, 29501);
  g_env = {{"WORLD_SIZE", "2"}, {"RANK", "2"}};
  EXPECT_NE(error_of([] { process_layout_from(fake_env); }).find("outside a world of 2"), std::string::npos);
  g_env = {{"WORLD_SIZE", "two"}, {"RANK", "0"}};
  EXPECT_NE(error_of([] { process_layout_from(fake_env); }).find("WORLD_SIZE='two'"), std::string::npos);
  g_env = {{"WORLD_SIZE", "2"}};
  EXPECT_NE(error_of([] { process_layout_from(fake_env); }).find("RANK is not"), std::string::npos);
}

TEST(SingleCommunicator, Identity) {
  auto c = make_single_communicator();
  EXPECT_EQ(c->size(), 1);
  float v[3] = {1, 2, 3}, o[3] = {};
  Tensor t(v, DType::F32, {3});
  c->all_reduce_sum(t);
  EXPECT_EQ(v[2], 3.0f);
  Tensor out(o, DType::F32, {3});
  c->all_gather(t, out);
  EXPECT_EQ(o[1], 2.0f);
  const int64_t rows[1] = {3};
  c->all_to_all_v(t, rows, out, rows);
  EXPECT_EQ(o[2], 3.0f);
  EXPECT_EQ(make_communicator(ProcessLayout{}, Device::CPU)->name(), "single");
}

ModelConfig tiny() { return load_model_config(DEEPINFER_SOURCE_DIR "/models/deepseek-v3-tiny-code"); }

TEST(ParallelPlan, ImpossibleLayoutsNameTheFlag) {
  const ModelConfig c = tiny();  // 6 heads, 16 experts, moe_intermediate 128, 2 shared
  auto err = [&](int tp, int ep, int dp, int world) {
    return error_of([&] { make_parallel_plan(c, tp, ep, dp, 0, world); });
  };
  EXPECT_NE(err(4, 1, 1, 4).find("--tp 4: num_attention_heads 6"), std::string::npos);
  EXPECT_NE(err(2, 1, 1, 4).find("--tp 2 x --dp 1 must equal the 4 processes"), std::string::npos);
  EXPECT_NE(err(2, 1, 2, 2).find("--tp 2 x --dp 2 must equal the 2 processes"), std::string::npos);
  EXPECT_NE(err(1, 1, 2, 4).find("--tp 1 x --dp 2 must equal the 4 processes"), std::string::npos);
  // --dp 2 over 4 processes with attention replicated inside a group is not a layout either.
  EXPECT_NE(err(1, 4, 2, 4).find("--tp 1 x --dp 2 must equal the 4 processes"), std::string::npos);
  EXPECT_NE(err(2, 1, 1, 1).find("one process"), std::string::npos);
  EXPECT_NE(err(1, 1, 2, 1).find("--dp 2: one process; start 2 with mpirun -np 2"), std::string::npos);
  EXPECT_EQ(err(2, 4, 2, 4), "");  // 16 experts over --ep 4, 6 heads over --tp 2
  // --dp 2 --tp 2 over 4 processes: rank 3 is tp_rank 1 of data-parallel group 1; the MoE over all 4.
  const ParallelPlan dt = make_parallel_plan(c, 2, 1, 2, 3, 4);
  EXPECT_EQ(dt.tp_rank, 1);
  EXPECT_EQ(dt.tp_size, 2);
  EXPECT_EQ(dt.dp_rank, 1);
  EXPECT_EQ(dt.dp_size, 2);
  EXPECT_EQ(dt.moe_rank, 3);
  EXPECT_EQ(dt.moe_size, 4);
  EXPECT_EQ(dt.replica_size(), 2);
  EXPECT_FALSE(dt.experts_split);
  const ParallelPlan dte = make_parallel_plan(c, 2, 4, 2, 2, 4);  // 16 experts, 4 per rank
  EXPECT_TRUE(dte.experts_split);
  EXPECT_EQ(dte.first_local_expert(), 8);
  EXPECT_EQ(dte.dp_rank, 1);
  EXPECT_EQ(dte.tp_rank, 0);
  // 16 experts over --ep 3: rounded up to 18 physical (2 redundant), 6 per rank; more when asked.
  const ParallelPlan e3 = make_parallel_plan(c, 1, 3, 1, 2, 3);
  EXPECT_EQ(e3.num_extra_experts, 2);
  EXPECT_EQ(e3.num_local_experts, 6);
  ASSERT_EQ(e3.physical_to_logical.size(), 18u);
  EXPECT_EQ(e3.physical_to_logical[16], 0);  // the copies of experts 0 and 1
  EXPECT_EQ(e3.physical_to_logical[17], 1);
  EXPECT_EQ(make_parallel_plan(c, 1, 3, 1, 0, 3, 3).num_extra_experts, 5);
  EXPECT_NE(error_of([&] { make_parallel_plan(c, 1, 2, 1, 0, 2, -1); }).find("DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS"),
            std::string::npos);
  EXPECT_NE(err(2, 3, 1, 2).find("--ep 3"), std::string::npos);
  const ParallelPlan p = make_parallel_plan(c, 2, 2, 1, 1, 2);
  EXPECT_EQ(p.tp_rank, 1);
  EXPECT_TRUE(p.experts_split);
  EXPECT_EQ(p.first_local_expert(), 8);
  const ParallelPlan q = make_parallel_plan(c, 1, 2, 1, 1, 2);  // attention replicated
  EXPECT_EQ(q.tp_size, 1);
  EXPECT_EQ(q.moe_size, 2);
}

// An FP8 weight [N, K] with 128x128 block scales; element (n, k) dequantizes to
// e4m3(w[n, k]) * scale[n / 128][k / 128].
struct Fp8 {
  HostBuffer w, s;
  Weight weight;
  Fp8(int64_t N, int64_t K) : w(DType::F8_E4M3, {N, K}), s(DType::F32, {(N + 127) / 128, (K + 127) / 128}) {
    for (int64_t i = 0; i < N * K; ++i) w.ptr<uint8_t>()[i] = static_cast<uint8_t>((i * 37 + 11) % 0x7e);
    for (int64_t i = 0; i < s.tensor().numel(); ++i) s.ptr<float>()[i] = 0.5f + 0.25f * static_cast<float>(i);
    weight.w = w.tensor();
    weight.scale_inv = s.tensor();
  }
  float at(int64_t n, int64_t k) const {
    const int64_t K = w.tensor().size(1), kb = s.tensor().size(1);
    return fp8_e4m3_to_float(w.ptr<uint8_t>()[n * K + k]) * s.ptr<float>()[(n / 128) * kb + k / 128];
  }
};
float dequant(const Weight& w, int64_t n, int64_t k) {
  const float s = w.scale_inv.ptr<float>()[(n / w.block_n) * w.scale_inv.stride[0] + (k / w.block_k) * w.scale_inv.stride[1]];
  return fp8_e4m3_to_float(w.w.ptr<uint8_t>()[n * w.w.stride[0] + k]) * s;
}

TEST(ShardWeights, Fp8RowsAndColumnsKeepTheirScales) {
  Fp8 f(576, 384);
  std::vector<std::shared_ptr<const void>> owners;
  for (auto [b, n] : {std::pair<int64_t, int64_t>{288, 288}, {0, 256}, {128, 448}}) {  // misaligned and aligned
    const Weight r = shard_weight_rows(f.weight, b, n, false, "rows", owners);
    ASSERT_EQ(r.out_features(), n);
    for (int64_t i = 0; i < n; i += 7)
      for (int64_t k = 0; k < 384; k += 13) ASSERT_EQ(dequant(r, i, k), f.at(b + i, k)) << b << "+" << i << ", " << k;
  }
  for (auto [b, n] : {std::pair<int64_t, int64_t>{192, 192}, {128, 256}}) {
    const Weight c = shard_weight_cols(f.weight, b, n, false, "cols", owners);
    ASSERT_EQ(c.in_features(), n);
    for (int64_t i = 0; i < 576; i += 11)
      for (int64_t k = 0; k < n; k += 5) ASSERT_EQ(dequant(c, i, k), f.at(i, b + k)) << i << ", " << b << "+" << k;
  }
  EXPECT_NE(error_of([&] { shard_weight_rows(f.weight, 288, 288, true, "q_b_proj", owners); }).find("q_b_proj"),
            std::string::npos);
}

// out += rows of y (F32 [T, H]).
void accumulate(std::vector<float>& sum, const Tensor& y) {
  for (int64_t i = 0; i < y.numel(); ++i) sum[static_cast<size_t>(i)] += y.ptr<float>()[i];
}

// The feed-forward blocks of two ranks sum to the one-process block (the all-reduce's sum),
// for a dense layer and a MoE layer split by intermediate (--ep 1; --ep dispatches instead:
// StepFollow's layouts run it), and a rank's experts under --ep are its physical experts.
TEST(ShardWeights, PartialFeedForwardsSumToTheWhole) {
  const ModelConfig c = tiny();
  ModelWeights full = make_random_weights(c, 7, DType::BF16);
  auto backend = make_cpu_backend({});
  const int64_t T = 5, H = c.hidden_size;
  HostBuffer x(DType::F32, {T, H});
  for (int64_t i = 0; i < T * H; ++i) x.ptr<float>()[i] = std::sin(0.37f * static_cast<float>(i));
  FfnWorkspace ws = make_ffn_workspace(c.ffn_dims(), *backend, T);
  const MoeRouting routing = c.moe_routing();
  HostBuffer want(DType::F32, {T, H}), part(DType::F32, {T, H});
  {
    const ParallelPlan p = make_parallel_plan(c, 1, 2, 1, 1, 2, 1);  // 18 physical: 9 per rank
    const ModelWeights w = shard_weights(full, c, p);
    ASSERT_EQ(w.layers[1].moe.experts.size(), 9u);
    EXPECT_EQ(w.layers[1].moe.experts[0].gate.w.data, full.layers[1].moe.experts[9].gate.w.data);
    EXPECT_EQ(w.layers[1].moe.experts[8].gate.w.data, full.layers[1].moe.experts[1].gate.w.data);  // a copy
    EXPECT_EQ(w.layers[1].moe.shared.gate.w.data, full.layers[1].moe.shared.gate.w.data);  // whole
  }
  for (int ep : {1}) {
    std::vector<float> dense(static_cast<size_t>(T * H)), moe(dense.size());
    for (int rank = 0; rank < 2; ++rank) {
      const ParallelPlan p = make_parallel_plan(c, 2, ep, 1, rank, 2);
      const ModelWeights w = shard_weights(full, c, p);
      mlp_forward(*backend, w.layers[0].mlp, x.tensor(), ws, part.tensor());
      accumulate(dense, part.tensor());
      moe_forward(*backend, routing, w.layers[1].moe, x.tensor(), ws, part.tensor());
      accumulate(moe, part.tensor());
    }
    mlp_forward(*backend, full.layers[0].mlp, x.tensor(), ws, want.tensor());
    for (int64_t i = 0; i < T * H; ++i)
      ASSERT_NEAR(dense[i], want.ptr<float>()[i], 1e-4f * (1.0f + std::fabs(want.ptr<float>()[i]))) << "dense " << i;
    moe_forward(*backend, routing, full.layers[1].moe, x.tensor(), ws, want.tensor());
    for (int64_t i = 0; i < T * H; ++i)
      ASSERT_NEAR(moe[i], want.ptr<float>()[i], 1e-4f * (1.0f + std::fabs(want.ptr<float>()[i])))
          << "MoE (--ep " << ep << ") " << i;
  }
}

}  // namespace
}  // namespace deepinfer
