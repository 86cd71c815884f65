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
#include <map>
#include <memory>
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
  std::vector<std::pair<int, int>> split_keys = std::vector<std::pair<int, int>>(static_cast<size_t>(size));
  std::map<std::pair<int64_t, int>, std::unique_ptr<ThreadGroup>> subgroups;  // (split call, color)
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

 protected:
  // MPI_Comm_split's rule: the ranks of one color, ordered by (key, rank).
  std::unique_ptr<Communicator> make_split(int color, int key) override {
    g_.split_keys[static_cast<size_t>(rank_)] = {color, key};
    g_.barrier();
    std::vector<std::pair<int, int>> members;  // (key, rank)
    for (int r = 0; r < g_.size; ++r)
      if (g_.split_keys[static_cast<size_t>(r)].first == color) members.push_back({g_.split_keys[static_cast<size_t>(r)].second, r});
    std::sort(members.begin(), members.end());
    const int sub_rank = static_cast<int>(std::find(members.begin(), members.end(), std::make_pair(key, rank_)) - members.begin());
    ThreadGroup* sub = nullptr;
    {
      std::lock_guard<std::mutex> lock(g_.m);
      auto& slot = g_.subgroups[{splits_, color}];
      if (!slot) slot = std::make_unique<ThreadGroup>(static_cast<int>(members.size()));
      sub = slot.get();
    }
    ++splits_;
    g_.barrier();  // every rank has read split_keys before the next split writes them
    return std::make_unique<ThreadCommunicator>(*sub, sub_rank);
  }

 private:
  ThreadGroup& g_;
  int rank_;
  int64_t splits_ = 0;
};

const std::string kTiny = DEEPINFER_SOURCE_DIR "/models/deepseek-v3-tiny-code";

RunnerConfig runner_config(Communicator* comm, int dp) {
  RunnerConfig rc;
  rc.num_kv_blocks = 8 / dp;  // --dp: each rank's pool is its partition of the leader's 8 blocks
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
  Rank(Communicator* comm, int tp, int ep, int dp, bool batch_invariant = false, int extra = 0, int interval = 0,
       bool private_slots = false) {
    BackendOptions bo;
    bo.num_threads = 1;
    bo.batch_invariant = batch_invariant;
    backend = make_cpu_backend(bo);
    LoadOptions lo;
    lo.load_mtp = false;
    if (comm != nullptr) {
      plan = make_parallel_plan(load_model_config(kTiny), tp, ep, dp, comm->rank(), comm->size(), extra);
      plan.comm = comm;
      if (plan.dp_size > 1 && plan.tp_size > 1) {  // as the engine does (engine_factory.cpp)
        plan.tp_comm = &comm->split(plan.dp_rank, plan.tp_rank);
        plan.dp_comm = &comm->split(plan.tp_rank, plan.dp_rank);
      }
      plan.eplb_interval = interval;
      lo.parallel = &plan;
    }
    model = load_model(kTiny, *backend, lo);
    if (private_slots)  // re-placement by copies into the rank's slots, as on device backends
      dynamic_cast<DeepseekV3Model&>(*model).expert_parallel()->use_private_slots();
    runner = std::make_unique<Runner>(*model, *backend, runner_config(comm, dp));
  }
};

// A prefill of two sequences, then 3 greedy decode steps: every step's logits rows.
std::vector<std::vector<float>> greedy_steps(Runner& runner, int vocab) {
  std::vector<std::vector<int32_t>> tokens = {{5, 17, 300, 42, 7, 99}, {11, 23, 1000, 4}};
  // Under --dp 2 sequence A runs on rank 0 (its blocks even: blocks 1, 2 of that rank's pool of 4),
  // B on rank 1 (odd: its blocks 0, 3).
  const std::vector<int32_t> blocks_a = {2, 4}, blocks_b = {1, 7};
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

// Rank 0 leads greedy_steps on `world` ranks (threads) of --tp/--ep/--dp; the followers' errors
// and step counts come back.
struct RanksRun {
  std::vector<std::vector<float>> logits;  // rank 0's
  std::vector<std::string> follower_errors;
  std::vector<int64_t> followed;
};
RanksRun run_ranks(int world, int tp, int ep, int dp, int vocab, bool batch_invariant = false) {
  ThreadGroup group(world);
  std::vector<std::unique_ptr<ThreadCommunicator>> comms;
  for (int r = 0; r < world; ++r) comms.push_back(std::make_unique<ThreadCommunicator>(group, r));
  RanksRun run;
  run.follower_errors.resize(static_cast<size_t>(world));
  run.followed.resize(static_cast<size_t>(world));
  std::vector<std::thread> followers;
  for (int r = 1; r < world; ++r)
    followers.emplace_back([&, r] {
      try {
        Rank rank(comms[static_cast<size_t>(r)].get(), tp, ep, dp, batch_invariant);
        run.followed[static_cast<size_t>(r)] = rank.runner->follow();
      } catch (const std::exception& e) {
        run.follower_errors[static_cast<size_t>(r)] = e.what();
      }
    });
  {
    Rank r0(comms[0].get(), tp, ep, dp, batch_invariant);
    run.logits = greedy_steps(*r0.runner, vocab);
  }  // rank 0's runner stops the followers
  for (std::thread& t : followers) t.join();
  return run;
}

TEST(StepFollow, TwoRanksGiveTheOneProcessLogits) {
  Rank single(nullptr, 1, 1, 1);
  const int vocab = single.model->vocab_size();
  const auto want = greedy_steps(*single.runner, vocab);
  struct Layout {
    int world, tp, ep, dp;
  };
  // --dp 2 --tp 2 over 4 ranks: two data-parallel groups (one sequence each) of two
  // tensor-parallel ranks; the MoE's intermediate split over all 4 (--ep 1) or its experts (--ep 4).
  for (auto [world, tp, ep, dp] :
       {Layout{2, 2, 1, 1}, {2, 2, 2, 1}, {2, 1, 2, 1}, {2, 1, 1, 2}, {2, 1, 2, 2}, {4, 2, 1, 2}, {4, 2, 4, 2}}) {
    const std::string name = std::to_string(world) + " ranks, --tp " + std::to_string(tp) + " --ep " +
                             std::to_string(ep) + " --dp " + std::to_string(dp);
    const RanksRun run = run_ranks(world, tp, ep, dp, vocab);
    for (int r = 1; r < world; ++r) {
      ASSERT_EQ(run.follower_errors[static_cast<size_t>(r)], "") << name << ", rank " << r;
      EXPECT_EQ(run.followed[static_cast<size_t>(r)], 4) << name << ": steps rank " << r << " ran";
    }
    for (size_t s = 0; s < want.size(); ++s)
      for (size_t i = 0; i < want[s].size(); ++i)
        ASSERT_NEAR(run.logits[s][i], want[s][i], 2e-4f * (1.0f + std::fabs(want[s][i])))
            << name << ", step " << s << ", logit " << i;
  }
}

// The communicator split of --dp x --tp (MPI_Comm_split's rule) on the test communicator: the
// groups' sums stay inside the group.
TEST(StepFollow, SplitGroupsReduceWithinTheGroup) {
  ThreadGroup group(4);
  std::vector<float> got(4);
  std::vector<int> sizes(4), ranks(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r)
    threads.emplace_back([&, r] {
      ThreadCommunicator c(group, r);
      Communicator& tp = c.split(r / 2, r % 2);  // {0, 1}, {2, 3}
      Communicator& dp = c.split(r % 2, 3 - r);  // {1, 3} ranked 3 before 1; {0, 2}: 2 before 0
      float v = static_cast<float>(1 << r);
      Tensor t(&v, DType::F32, {1});
      tp.all_reduce_sum(t);
      got[static_cast<size_t>(r)] = v;
      sizes[static_cast<size_t>(r)] = tp.size() + 10 * dp.size();
      ranks[static_cast<size_t>(r)] = tp.rank() + 10 * dp.rank();
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(got, (std::vector<float>{3, 3, 12, 12}));
  EXPECT_EQ(sizes, (std::vector<int>{22, 22, 22, 22}));
  EXPECT_EQ(ranks, (std::vector<int>{10, 11, 0, 1}));
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
    bool copies;  // re-placement by copying into private slots (the device backends' path)
  };
  for (auto [dp, extra, interval, copies] :
       {Layout{1, 0, 0, false}, {2, 0, 0, false}, {2, 3, 1, false}, {2, 3, 1, true}}) {
    const std::string name = "--ep 2 --dp " + std::to_string(dp) + ", " + std::to_string(extra) + " extra experts" +
                             (copies ? ", re-placed by copies" : "");
    ThreadGroup group(2);
    ThreadCommunicator c0(group, 0), c1(group, 1);
    std::string follower_error;
    std::thread follower([&] {
      try {
        Rank r1(&c1, 1, 2, dp, true, extra, interval, copies);
        r1.runner->follow();
      } catch (const std::exception& e) {
        follower_error = e.what();
      }
    });
    std::vector<std::vector<float>> got;
    int64_t rebalances = 0;
    bool moved = false;
    ExpertParallelMoe::Traffic traffic;
    int64_t copied = 0;
    {
      Rank r0(&c0, 1, 2, dp, true, extra, interval, copies);
      got = greedy_steps(*r0.runner, vocab);
      const auto* m = dynamic_cast<const DeepseekV3Model*>(r0.model.get());
      ASSERT_NE(m, nullptr);
      ASSERT_NE(m->expert_parallel(), nullptr);
      rebalances = m->expert_parallel()->num_rebalances();
      traffic = m->expert_parallel()->traffic();
      copied = m->expert_parallel()->num_experts_copied();
      for (int l = 0; l < m->config().num_hidden_layers; ++l)
        if (m->weights().layers[l].is_moe && m->expert_parallel()->placement(l) != r0.plan.physical_to_logical)
          moved = true;
    }
    follower.join();
    ASSERT_EQ(follower_error, "") << name;
    EXPECT_EQ(rebalances, interval > 0 ? 4 : 0) << name;
    EXPECT_EQ(moved, interval > 0) << name << ": EPLB changed no layer's placement";
    EXPECT_EQ(copied > 0, copies) << name << ": experts copied into slots";
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

// A benchmark's timed window holds EPLB's flush (Runner::hold_expert_replacement, broadcast to the
// followers): no re-placement while held though one falls due every step, one on release on every
// rank (collective), and the logits are still the one-process bits.
TEST(StepFollow, HeldExpertReplacementRunsOnRelease) {
  Rank single(nullptr, 1, 1, 1, true);
  const int vocab = single.model->vocab_size();
  const auto want = greedy_steps(*single.runner, vocab);
  ThreadGroup group(2);
  ThreadCommunicator c0(group, 0), c1(group, 1);
  std::string follower_error;
  int64_t follower_rebalances = -1;
  std::thread follower([&] {
    try {
      Rank r1(&c1, 1, 2, 2, true, 3, 1);
      r1.runner->follow();
      follower_rebalances = dynamic_cast<const DeepseekV3Model&>(*r1.model).expert_parallel()->num_rebalances();
    } catch (const std::exception& e) {
      follower_error = e.what();
    }
  });
  std::vector<std::vector<float>> got;
  int64_t held = -1, released = -1, deferred = -1;
  {
    Rank r0(&c0, 1, 2, 2, true, 3, 1);
    const auto& m = dynamic_cast<const DeepseekV3Model&>(*r0.model);
    r0.runner->hold_expert_replacement(true);
    got = greedy_steps(*r0.runner, vocab);
    held = m.expert_parallel()->num_rebalances();
    r0.runner->hold_expert_replacement(false);
    released = m.expert_parallel()->num_rebalances();
    deferred = m.expert_parallel()->num_deferred();
  }
  follower.join();
  ASSERT_EQ(follower_error, "");
  EXPECT_EQ(held, 0) << "a re-placement ran inside the held window";
  EXPECT_EQ(released, 1);
  EXPECT_EQ(deferred, 1);
  EXPECT_EQ(follower_rebalances, 1) << "the follower did not re-place with the leader";
  for (size_t s = 0; s < want.size(); ++s)
    ASSERT_EQ(std::memcmp(got[s].data(), want[s].data(), want[s].size() * 4), 0) << "step " << s;
}

}  // namespace
}  // namespace deepinfer
