// Two ranks in one process (threads, a test communicator over shared memory): rank 0's runner
// leads steps of the tiny model, rank 1's follows (runner/step_follow.cpp), each with its shard
// of the weights (model/parallel.h). Rank 0's logits match one process's to fp32 rounding and
// its greedy tokens are the same, for --tp 2, --tp 2 --ep 2, --ep 2, --dp 2 and --dp 2 --ep 2 (each
// rank attends its own sequence there). The same path as
// e2e_parallel's mpirun runs, here without MPI, so the sanitizer build covers it too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"
#include "model/config.h"
#include "model/parallel.h"
#include "model/deepseek_v3/model.h"
#include "model/expert_parallel.h"
#include "runner/runner.h"

namespace deepinfer {
namespace {

// Ranks as threads: every collective publishes its buffer, waits for all, reads the others.
struct ThreadGroup {
  explicit ThreadGroup(int n) : size(n), ptrs(static_cast<size_t>(n)), counts(static_cast<size_t>(n)) {}
  void barrier() {
    std::unique_lock<std::mutex> lock(m);
    const int64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen; });
    }
  }
  int size;
  std::vector<void*> ptrs;
  std::vector<std::vector<int64_t>> counts;  // all_to_all_v's send counts
  std::mutex m;
  std::condition_variable cv;
  int arrived = 0;
  int64_t generation = 0;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(ThreadGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.size; }
  std::string name() const override { return "threads"; }
  void all_reduce_sum(Tensor& t) override {
    DI_CHECK((t.dtype == DType::F32 || t.dtype == DType::I32) && t.is_contiguous(), "test communicator: F32, I32");
    if (t.dtype == DType::F32) {
      sum<float>(t);
    } else {
      sum<int32_t>(t);
    }
  }
  template <typename T>
  void sum(Tensor& t) {
    const int64_t n = t.numel();
    g_.ptrs[rank_] = t.data;
    g_.barrier();
    std::vector<T> acc(static_cast<size_t>(n), T{0});
    for (int r = 0; r < g_.size; ++r)
      for (int64_t i = 0; i < n; ++i) acc[i] += static_cast<const T*>(g_.ptrs[r])[i];
    g_.barrier();  // everyone has read every buffer before any is overwritten
    std::memcpy(t.data, acc.data(), static_cast<size_t>(n) * sizeof(T));
  }
  void all_gather(const Tensor& in, Tensor& out) override {
    const int64_t bytes = contiguous_bytes(in, "all_gather");
    g_.ptrs[rank_] = in.data;
    g_.barrier();
    for (int r = 0; r < g_.size; ++r)
      std::memcpy(static_cast<char*>(out.data) + r * bytes, g_.ptrs[r], static_cast<size_t>(bytes));
    g_.barrier();
  }
  // Rank r reads its rows from each sender's buffer at the offset of r's block there.
  void all_to_all_v(const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
                    std::span<const int64_t> recv_rows) override {
    const int64_t row = row_bytes(in, "all_to_all_v");
    g_.ptrs[rank_] = in.data;
    g_.counts[rank_].assign(send_rows.begin(), send_rows.end());
    g_.barrier();
    int64_t at = 0;
    for (int r = 0; r < g_.size; ++r) {
      const std::vector<int64_t>& c = g_.counts[r];
      int64_t from = 0;
      for (int q = 0; q < rank_; ++q) from += c[q];
      DI_CHECK(c[rank_] == recv_rows[r], "test communicator: rank ", r, " sends ", c[rank_], " rows, ", rank_,
               " expects ", recv_rows[r]);
      std::memcpy(static_cast<char*>(out.data) + at * row, static_cast<const char*>(g_.ptrs[r]) + from * row,
                  static_cast<size_t>(c[rank_] * row));
      at += c[rank_];
      rows_received += r == rank_ ? 0 : c[rank_];
    }
    g_.barrier();
  }
  int64_t rows_received = 0;  // rows received from other ranks
  void broadcast(Tensor& t, int root) override { broadcast_bytes(t.data, contiguous_bytes(t, "broadcast"), root); }
  void broadcast_bytes(void* data, int64_t num_bytes, int root) override {
    g_.ptrs[rank_] = data;
    g_.barrier();
    if (rank_ != root) std::memcpy(data, g_.ptrs[root], static_cast<size_t>(num_bytes));
    g_.barrier();
  }
  void barrier() override { g_.barrier(); }

 private:
  ThreadGroup& g_;
  int rank_;
};

const std::string kTiny = DEEPINFER_SOURCE_DIR "/models/deepseek-v3-tiny-code";

RunnerConfig runner_config(Communicator* comm, int dp) {
  RunnerConfig rc;
  rc.num_kv_blocks = 8;
  rc.kv_block_size = 16;
  rc.max_num_batched_tokens = 64;
  rc.max_num_seqs = 2;
  rc.max_model_len = 64;
  rc.use_graphs = false;
  rc.comm = comm;
  rc.dp_size = dp;
  return rc;
}

struct Rank {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Runner> runner;
  ParallelPlan plan;
  Rank(Communicator* comm, int tp, int ep, int dp, bool batch_invariant = false, int extra = 0, int interval = 0) {
    BackendOptions bo;
    bo.num_threads = 1;
    bo.batch_invariant = batch_invariant;
    backend = make_cpu_backend(bo);
    LoadOptions lo;
    lo.load_mtp = false;
    if (comm != nullptr) {
      plan = make_parallel_plan(load_model_config(kTiny), tp, ep, dp, comm->rank(), comm->size(), extra);
      plan.comm = comm;
      plan.eplb_interval = interval;
      lo.parallel = &plan;
    }
    model = load_model(kTiny, *backend, lo);
    runner = std::make_unique<Runner>(*model, *backend, runner_config(comm, dp));
  }
};

// A prefill of two sequences, then 3 greedy decode steps: every step's logits rows.
std::vector<std::vector<float>> greedy_steps(Runner& runner, int vocab) {
  std::vector<std::vector<int32_t>> tokens = {{5, 17, 300, 42, 7, 99}, {11, 23, 1000, 4}};
  // Under --dp 2 sequence A runs on rank 0 (first block even), B on rank 1.
  const std::vector<int32_t> blocks_a = {2, 5}, blocks_b = {1, 7};
  std::vector<std::vector<float>> out;
  for (int step = 0; step < 4; ++step) {
    std::vector<RunSeq> seqs;
    for (int s = 0; s < 2; ++s) {
      const int len = static_cast<int>(tokens[s].size());
      const int computed = step == 0 ? 0 : len - 1;
      seqs.push_back({tokens[s], computed, len - computed, s == 0 ? blocks_a : blocks_b, true});
    }
    const Tensor& logits = runner.execute(seqs);  // [2, vocab]
    out.emplace_back(logits.ptr<float>(), logits.ptr<float>() + 2 * vocab);
    for (int s = 0; s < 2; ++s) {
      const float* row = logits.ptr<float>() + s * vocab;
      tokens[s].push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
    }
  }
  return out;
}

TEST(StepFollow, TwoRanksGiveTheOneProcessLogits) {
  Rank single(nullptr, 1, 1, 1);
  const int vocab = single.model->vocab_size();
  const auto want = greedy_steps(*single.runner, vocab);
  struct Layout {
    int tp, ep, dp;
  };
  for (auto [tp, ep, dp] : {Layout{2, 1, 1}, {2, 2, 1}, {1, 2, 1}, {1, 1, 2}, {1, 2, 2}}) {
    ThreadGroup group(2);
    ThreadCommunicator c0(group, 0), c1(group, 1);
    std::string follower_error;
    int64_t followed = 0;
    std::thread follower([&] {
      try {
        Rank r1(&c1, tp, ep, dp);
        followed = r1.runner->follow();
      } catch (const std::exception& e) {
        follower_error = e.what();
      }
    });
    std::vector<std::vector<float>> got;
    {
      Rank r0(&c0, tp, ep, dp);
      got = greedy_steps(*r0.runner, vocab);
    }  // rank 0's runner stops the follower
    follower.join();
    ASSERT_EQ(follower_error, "") << "--tp " << tp << " --ep " << ep << " --dp " << dp;
    EXPECT_EQ(followed, 4) << "--tp " << tp << " --ep " << ep << " --dp " << dp << ": steps the follower ran";
    for (size_t s = 0; s < want.size(); ++s)
      for (size_t i = 0; i < want[s].size(); ++i)
        ASSERT_NEAR(got[s][i], want[s][i], 2e-4f * (1.0f + std::fabs(want[s][i])))
            << "--tp " << tp << " --ep " << ep << " --dp " << dp << ", step " << s << ", logit " << i;
  }
}

// --ep 2 dispatches each row to its experts' rank and combines their outputs back in slot order
// (model/expert_parallel.h): with batch-invariant kernels rank 0's logits are the one-process
// bits, with and without --dp, and with EPLB re-placing 3 redundant experts (rounded up to 4)
// after every step from the measured loads (the placement does change). The dispatch moves
// fewer rows than the all-gather of every rank's rows would.
TEST(StepFollow, ExpertParallelDispatchIsTheOneProcessBits) {
  Rank single(nullptr, 1, 1, 1, true);
  const int vocab = single.model->vocab_size();
  const auto want = greedy_steps(*single.runner, vocab);
  struct Layout {
    int dp, extra, interval;
  };
  for (auto [dp, extra, interval] : {Layout{1, 0, 0}, {2, 0, 0}, {2, 3, 1}}) {
    const std::string name = "--ep 2 --dp " + std::to_string(dp) + ", " + std::to_string(extra) + " extra experts";
    ThreadGroup group(2);
    ThreadCommunicator c0(group, 0), c1(group, 1);
    std::string follower_error;
    std::thread follower([&] {
      try {
        Rank r1(&c1, 1, 2, dp, true, extra, interval);
        r1.runner->follow();
      } catch (const std::exception& e) {
        follower_error = e.what();
      }
    });
    std::vector<std::vector<float>> got;
    int64_t rebalances = 0;
    bool moved = false;
    ExpertParallelMoe::Traffic traffic;
    {
      Rank r0(&c0, 1, 2, dp, true, extra, interval);
      got = greedy_steps(*r0.runner, vocab);
      const auto* m = dynamic_cast<const DeepseekV3Model*>(r0.model.get());
      ASSERT_NE(m, nullptr);
      ASSERT_NE(m->expert_parallel(), nullptr);
      rebalances = m->expert_parallel()->num_rebalances();
      traffic = m->expert_parallel()->traffic();
      for (int l = 0; l < m->config().num_hidden_layers; ++l)
        if (m->weights().layers[l].is_moe && m->expert_parallel()->placement(l) != r0.plan.physical_to_logical)
          moved = true;
    }
    follower.join();
    ASSERT_EQ(follower_error, "") << name;
    EXPECT_EQ(rebalances, interval > 0 ? 4 : 0) << name;
    EXPECT_EQ(moved, interval > 0) << name << ": EPLB changed no layer's placement";
    EXPECT_GT(c0.rows_received, 0) << name;
    // A token whose slots share a rank is sent there once: fewer rows than entries (top-2 of 16
    // experts over 2 ranks), and no more rows than tokens to the one other rank.
    EXPECT_GT(traffic.rows_out, 0) << name;
    EXPECT_LT(traffic.rows_out, traffic.entries_out) << name;
    EXPECT_LE(traffic.rows_out, traffic.tokens) << name;
    std::printf("%s: rank 0 sent %lld rows for %lld entries of %lld tokens x MoE layers\n", name.c_str(),
                static_cast<long long>(traffic.rows_out), static_cast<long long>(traffic.entries_out),
                static_cast<long long>(traffic.tokens));
    for (size_t s = 0; s < want.size(); ++s)
      ASSERT_EQ(std::memcmp(got[s].data(), want[s].data(), want[s].size() * 4), 0) << name << ", step " << s;
  }
}

}  // namespace
}  // namespace deepinfer
