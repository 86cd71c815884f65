#include "model/expert_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "dist/communicator.h"
#include "model/eplb.h"

namespace deepinfer {
namespace {

Tensor host_view(std::vector<int32_t>& v, std::vector<int64_t> dims) {
  return Tensor(v.data(), DType::I32, std::move(dims), Device::CPU);
}

int64_t grow(int64_t need, int64_t cap) { return need <= cap && cap > 0 ? cap : std::max<int64_t>({need, 2 * cap, 16}); }

}  // namespace

ExpertParallelMoe::ExpertParallelMoe(const ModelConfig& config, const ParallelPlan& plan, Backend& backend,
                                     const std::vector<LayerWeights>& layers,
                                     std::vector<std::vector<ExpertWeights>> all_experts,
                                     std::vector<std::shared_ptr<const void>> host_owners)
    : config_(config), plan_(plan), backend_(backend), routing_(config.moe_routing()),
      all_experts_(std::move(all_experts)), host_owners_(std::move(host_owners)) {
  DI_CHECK(plan_.experts_split && plan_.comm != nullptr && plan_.comm->size() == plan_.moe_size,
           "expert parallelism: needs --ep over every process and a communicator");
  W_ = plan_.moe_size;
  rank_ = plan_.moe_rank;
  per_rank_ = plan_.num_local_experts;
  const size_t L = layers.size();
  local_.resize(L);
  placement_.resize(L);
  replicas_.resize(L);
  load_.assign(L * static_cast<size_t>(routing_.num_experts), 0);
  for (size_t l = 0; l < L; ++l) {
    if (!layers[l].is_moe) continue;
    DI_CHECK(static_cast<int>(layers[l].moe.experts.size()) == per_rank_, "expert parallelism: layer ", l, " holds ",
             layers[l].moe.experts.size(), " experts, the plan ", per_rank_);
    local_[l] = layers[l].moe.experts;
    set_placement(static_cast<int>(l), plan_.physical_to_logical);
    DI_CHECK(all_experts_.empty() || all_experts_[l].size() == static_cast<size_t>(routing_.num_experts),
             "expert parallelism: layer ", l, " has ", all_experts_.empty() ? 0 : all_experts_[l].size(),
             " host experts for EPLB, the routing ", routing_.num_experts);
  }
  if (plan_.eplb_interval > 0 && all_experts_.empty()) {
    log_warn("EPLB: re-placement every ", plan_.eplb_interval, " steps needs host copies of the experts (a "
             "checkpoint, or random weights made on the host); the placement stays fixed on ", backend_.name());
    plan_.eplb_interval = 0;
  }
  copy_slots_ = backend_.device() != Device::CPU;
  if (plan_.eplb_interval > 0 && copy_slots_) make_slots_private();
}

void ExpertParallelMoe::make_slots_private(bool all) {
  for (size_t l = 0; l < local_.size(); ++l) {
    for (size_t i = 0; i < local_[l].size(); ++i) {
      bool shared = all;
      for (size_t j = 0; j < i && !shared; ++j) shared = local_[l][j].gate.w.data == local_[l][i].gate.w.data;
      if (!shared) continue;
      for (Weight* w : {&local_[l][i].gate, &local_[l][i].up, &local_[l][i].down}) {
        for (Tensor* t : {&w->w, &w->scale_inv}) {
          if (!t->defined()) continue;
          private_slots_.push_back(backend_.alloc(t->dtype, t->dims()));
          Tensor fresh = private_slots_.back().tensor();
          backend_.copy(*t, fresh);
          *t = fresh;
        }
      }
    }
  }
  backend_.synchronize();
}

void ExpertParallelMoe::copy_expert(const ExpertWeights& src, ExpertWeights& dst, int layer) {
  const Weight* from[3] = {&src.gate, &src.up, &src.down};
  Weight* to[3] = {&dst.gate, &dst.up, &dst.down};
  for (int k = 0; k < 3; ++k) {
    for (auto [a, b] : {std::pair{&from[k]->w, &to[k]->w}, std::pair{&from[k]->scale_inv, &to[k]->scale_inv}}) {
      DI_CHECK(a->defined() == b->defined() && (!a->defined() || (a->dtype == b->dtype && a->dims() == b->dims())),
               "EPLB: layer ", layer, ": a host expert ", a->describe(), " does not fit its device slot ",
               b->describe());
      if (a->defined()) backend_.copy(*a, *b);
    }
  }
  ++experts_copied_;
}

void ExpertParallelMoe::set_placement(int layer, std::vector<int> physical_to_logical) {
  const auto l = static_cast<size_t>(layer);
  DI_CHECK(static_cast<int>(physical_to_logical.size()) == W_ * per_rank_, "expert parallelism: a placement of ",
           physical_to_logical.size(), " physical experts for ", W_, " x ", per_rank_);
  std::vector<std::vector<int>> reps(static_cast<size_t>(routing_.num_experts));
  for (size_t p = 0; p < physical_to_logical.size(); ++p) {
    const int e = physical_to_logical[p];
    DI_CHECK(e >= 0 && e < routing_.num_experts, "expert parallelism: physical expert ", p, " -> logical ", e);
    reps[static_cast<size_t>(e)].push_back(static_cast<int>(p));
  }
  for (size_t e = 0; e < reps.size(); ++e)
    DI_CHECK(!reps[e].empty(), "expert parallelism: layer ", layer, "'s placement holds no copy of expert ", e);
  replicas_[l] = std::move(reps);
  placement_[l] = std::move(physical_to_logical);
}

double ExpertParallelMoe::comm_clock() {
  if (!plan_.time_collectives) return 0;
  backend_.synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void ExpertParallelMoe::comm_time(double start) {
  if (plan_.time_collectives) traffic_.comm_s += comm_clock() - start;
}

void ExpertParallelMoe::ensure(int64_t tokens, int64_t send_rows, int64_t recv_rows) {
  if (tokens <= cap_tokens_ && send_rows <= cap_send_ && recv_rows <= cap_recv_ && !buffers_.empty()) return;
  cap_tokens_ = grow(tokens, cap_tokens_);
  cap_send_ = grow(send_rows, cap_send_);
  cap_recv_ = grow(recv_rows, cap_recv_);
  const DType dt = backend_.activation_dtype();
  const int64_t H = config_.hidden_size, K = routing_.top_k;
  buffers_.clear();
  auto make = [&](DType dtype, std::vector<int64_t> dims) {
    buffers_.push_back(backend_.alloc(dtype, dims));
    return buffers_.back().tensor();
  };
  counts_ = make(DType::I32, {2 * W_});
  counts_all_t_ = make(DType::I32, {2 * W_ * W_});
  send_token_t_ = make(DType::I32, {cap_send_});
  send_row_t_ = make(DType::I32, {cap_send_});
  send_local_t_ = make(DType::I32, {cap_send_, 1});
  pos_t_ = make(DType::I32, {cap_tokens_, K});
  send_x_ = make(dt, {cap_send_, H});
  y_back_ = make(DType::F32, {cap_send_, H});
  recv_x_ = make(dt, {cap_recv_, H});
  recv_row_ = make(DType::I32, {cap_recv_});
  recv_local_ = make(DType::I32, {cap_recv_, 1});
  x_pairs_ = make(dt, {cap_recv_, H});
  y_recv_ = make(DType::F32, {cap_recv_, H});
  ones_ = make(DType::F32, {cap_recv_, 1});
  std::vector<float> ones(static_cast<size_t>(cap_recv_), 1.0f);
  backend_.copy(Tensor(ones.data(), DType::F32, {cap_recv_, 1}, Device::CPU), ones_);
  ++epoch_;
}

void ExpertParallelMoe::ensure_chunk(int64_t chunk_rows, int chunks) {
  if (chunk_rows <= cap_chunk_ && chunks == chunks_) return;
  cap_chunk_ = grow(chunk_rows, cap_chunk_);
  chunks_ = chunks;
  const DType dt = backend_.activation_dtype();
  const int64_t H = config_.hidden_size;
  chunk_buffers_.clear();
  chunk_buffers_.push_back(backend_.alloc(dt, {cap_chunk_, H}));
  chunk_out_ = chunk_buffers_.back().tensor();
  chunk_buffers_.push_back(backend_.alloc(dt, {chunks * cap_chunk_, H}));
  gathered_ = chunk_buffers_.back().tensor();
  // Rows past a chunk's own stay finite (gathered, then dropped).
  HostBuffer zeros(dt, {cap_chunk_, H});
  std::memset(zeros.tensor().data, 0, zeros.tensor().num_bytes());
  backend_.copy(zeros.tensor(), chunk_out_);
  ++epoch_;
}

void ExpertParallelMoe::forward(int layer, const MoeWeights& w, const Tensor& x, FfnWorkspace& ws, Tensor& out) {
  const auto l = static_cast<size_t>(layer);
  DI_CHECK(l < local_.size() && !placement_[l].empty(), "expert parallelism: layer ", layer, " is not a MoE layer");
  const int64_t T = x.defined() ? x.size(0) : 0, K = routing_.top_k, E = routing_.num_experts;
  Communicator& comm = *plan_.comm;
  // 1. Route this rank's rows; the ids to the host.
  Tensor ids, weights;
  ids_.resize(static_cast<size_t>(T * K));
  if (T > 0) {
    moe_route(backend_, routing_, w, x, ws, ids, weights);
    Tensor ih = host_view(ids_, {T, K});
    backend_.copy(ids, ih);
  }
  // 2. A replica per (token, slot), hence its rank. One row per (token, rank) is sent (a token
  // whose slots share a rank travels once), one entry per (token, slot): the index of its row on
  // the receiver and the receiver's local expert. Rows by destination, then token; entries by
  // destination, then (token, slot).
  const int64_t S = T * K;
  std::vector<int> dest(static_cast<size_t>(S)), local(static_cast<size_t>(S)), next(static_cast<size_t>(E), 0);
  std::vector<int64_t> rows_to(static_cast<size_t>(W_), 0), pairs_to(static_cast<size_t>(W_), 0);
  std::vector<int64_t> token_row(static_cast<size_t>(W_), -1);  // this token's row to each rank
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < K; ++j) {
      const int64_t i = t * K + j;
      const int e = ids_[i];
      DI_CHECK(e >= 0 && e < E, "expert parallelism: routed expert ", e, " outside [0, ", E, ")");
      ++load_[l * E + e];
      const std::vector<int>& reps = replicas_[l][static_cast<size_t>(e)];
      const int p = reps[static_cast<size_t>(next[e]++) % reps.size()];
      dest[i] = p / per_rank_;
      local[i] = p % per_rank_;
      ++pairs_to[dest[i]];
      if (token_row[dest[i]] != t) token_row[dest[i]] = t, ++rows_to[dest[i]];
    }
  }
  std::vector<int64_t> row_at(static_cast<size_t>(W_), 0), pair_at(static_cast<size_t>(W_), 0);
  for (int r = 1; r < W_; ++r) {
    row_at[r] = row_at[r - 1] + rows_to[r - 1];
    pair_at[r] = pair_at[r - 1] + pairs_to[r - 1];
  }
  const std::vector<int64_t> row_begin = row_at, pair_begin = pair_at;
  const int64_t R = row_at[W_ - 1] + rows_to[W_ - 1];
  send_token_.resize(static_cast<size_t>(R));
  send_row_.resize(static_cast<size_t>(S));
  send_local_.resize(static_cast<size_t>(S));
  pos_.resize(static_cast<size_t>(S));
  std::fill(token_row.begin(), token_row.end(), -1);
  std::vector<int64_t> token_of_row(static_cast<size_t>(W_), -1);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < K; ++j) {
      const int64_t i = t * K + j;
      const int r = dest[i];
      if (token_of_row[r] != t) {  // the token's first slot on rank r: its row
        token_of_row[r] = t;
        token_row[r] = row_at[r] - row_begin[r];
        send_token_[row_at[r]++] = static_cast<int32_t>(t);
      }
      const int64_t s = pair_at[r]++;
      send_row_[s] = static_cast<int32_t>(token_row[r]);  // within this rank's block for now
      send_local_[s] = local[i];
      pos_[i] = static_cast<int32_t>(s);
    }
  }
  // Counts first: every rank's [W][rows, entries]; rank q's sends to r at q * 2W + 2r.
  std::vector<int32_t> counts(static_cast<size_t>(2 * W_));
  for (int r = 0; r < W_; ++r) counts[2 * r] = static_cast<int32_t>(rows_to[r]), counts[2 * r + 1] = static_cast<int32_t>(pairs_to[r]);
  ensure(T, S, 0);
  backend_.copy(host_view(counts, {2 * W_}), counts_);
  double t0 = comm_clock();
  comm.all_gather(counts_, counts_all_t_);
  comm_time(t0);
  counts_all_.resize(static_cast<size_t>(2 * W_ * W_));
  Tensor cah = host_view(counts_all_, {2 * W_ * W_});
  backend_.copy(counts_all_t_, cah);
  recv_rows_.assign(static_cast<size_t>(W_), 0);
  recv_pairs_.assign(static_cast<size_t>(W_), 0);
  int64_t N = 0, M = 0;
  for (int q = 0; q < W_; ++q) {
    N += recv_rows_[q] = counts_all_[q * 2 * W_ + 2 * rank_];
    M += recv_pairs_[q] = counts_all_[q * 2 * W_ + 2 * rank_ + 1];
  }
  // Rank r stacks the rows of ranks 0, 1, ... : this rank's block starts after those before it.
  for (int r = 0; r < W_; ++r) {
    int64_t base = 0;
    for (int q = 0; q < rank_; ++q) base += counts_all_[q * 2 * W_ + 2 * r];
    for (int64_t s = pair_begin[r]; s < pair_begin[r] + pairs_to[r]; ++s) send_row_[s] += static_cast<int32_t>(base);
  }
  ensure(T, S, M);
  traffic_.tokens += T;
  for (int r = 0; r < W_; ++r) {
    if (r == rank_) continue;
    traffic_.rows_out += rows_to[r];
    traffic_.entries_out += pairs_to[r];
    traffic_.outputs_back += pairs_to[r];
    traffic_.comm_bytes += rows_to[r] * config_.hidden_size * static_cast<int64_t>(dtype_size(backend_.activation_dtype())) +
                           pairs_to[r] * 8;
  }
  // 3. The payload: the rows, then each entry's row index and local expert.
  if (S > 0) {
    Tensor st = send_token_t_.slice_rows(0, R), sx = send_x_.slice_rows(0, R);
    Tensor sr = send_row_t_.slice_rows(0, S), sl = send_local_t_.slice_rows(0, S);
    backend_.copy(host_view(send_token_, {R}), st);
    backend_.copy(host_view(send_row_, {S}), sr);
    backend_.copy(host_view(send_local_, {S, 1}), sl);
    backend_.embedding(st, x, sx);  // row gather
  }
  t0 = comm_clock();
  comm.all_to_all_v(send_x_, rows_to, recv_x_, recv_rows_);
  comm.all_to_all_v(send_row_t_, pairs_to, recv_row_, recv_pairs_);
  comm.all_to_all_v(send_local_t_, pairs_to, recv_local_, recv_pairs_);
  comm_time(t0);
  if (M > 0) {  // one row per entry, through its expert alone with weight 1: the raw outputs
    Tensor xp = x_pairs_.slice_rows(0, M), yr = y_recv_.slice_rows(0, M);
    backend_.embedding(recv_row_.slice_rows(0, M), recv_x_.slice_rows(0, N), xp);
    backend_.moe_experts(xp, recv_local_.slice_rows(0, M), ones_.slice_rows(0, M), local_[l], yr);
  }
  // 4. Outputs back (the entry counts reversed), combined by the owner in slot order, shared experts added.
  t0 = comm_clock();
  comm.all_to_all_v(y_recv_, recv_pairs_, y_back_, pairs_to);
  comm_time(t0);
  for (int r = 0; r < W_; ++r)
    if (r != rank_) traffic_.comm_bytes += recv_pairs_[r] * config_.hidden_size * 4;  // F32 outputs back
  if (T == 0) return;
  Tensor pt = pos_t_.slice_rows(0, T);
  backend_.copy(host_view(pos_, {T, K}), pt);
  backend_.moe_combine(y_back_.slice_rows(0, S), pt, weights, out);
  moe_add_shared(backend_, w, x, ws, out);
}

void ExpertParallelMoe::forward_replicated(int layer, const MoeWeights& w, const Tensor& x, FfnWorkspace& ws,
                                           Tensor& out, Communicator& group) {
  const int G = group.size(), g = group.rank();
  const int64_t T = x.size(0), c = (T + G - 1) / G;
  const int64_t b = std::min<int64_t>(T, g * c), n = std::min<int64_t>(T, b + c) - b;
  ensure_chunk(c, G);
  Tensor own = chunk_out_.slice_rows(0, n);
  forward(layer, w, n > 0 ? x.slice_rows(b, b + n) : Tensor(), ws, own);
  Tensor send = chunk_out_.slice_rows(0, c), all = gathered_.slice_rows(0, G * c);
  const double t0 = comm_clock();
  group.all_gather(send, all);
  comm_time(t0);
  backend_.copy(all.slice_rows(0, T), out);
}

void ExpertParallelMoe::end_step() {
  ++steps_;
  if (plan_.eplb_interval <= 0 || steps_ % plan_.eplb_interval != 0) return;
  if (held_) {
    due_ = true;
  } else {
    rebalance();
  }
}

void ExpertParallelMoe::hold(bool on) {
  held_ = on;
  if (on || !due_) return;
  due_ = false;
  ++deferred_;
  rebalance();
}

void ExpertParallelMoe::rebalance() {
  // The load of every rank's rows: an I32 sum over the ranks (the counts of one interval).
  std::vector<int32_t> load(load_.size());
  for (size_t i = 0; i < load_.size(); ++i) load[i] = static_cast<int32_t>(std::min<int64_t>(load_[i], 1 << 30));
  DeviceBuffer buf = backend_.alloc(DType::I32, {static_cast<int64_t>(load.size())});
  Tensor t = buf.tensor();
  backend_.copy(host_view(load, {static_cast<int64_t>(load.size())}), t);
  plan_.comm->all_reduce_sum(t);
  Tensor lh = host_view(load, {static_cast<int64_t>(load.size())});
  backend_.copy(t, lh);
  std::fill(load_.begin(), load_.end(), 0);
  const int E = routing_.num_experts;
  const int groups = config_.n_group > 0 && E % config_.n_group == 0 ? config_.n_group : 1;
  for (size_t l = 0; l < local_.size(); ++l) {
    if (placement_[l].empty()) continue;
    std::vector<double> w(load.begin() + static_cast<int64_t>(l) * E, load.begin() + static_cast<int64_t>(l + 1) * E);
    EplbPlacement p = eplb_place(w, W_ * per_rank_, groups, 1, W_);
    for (int i = 0; i < per_rank_; ++i) {
      const int was = placement_[l][static_cast<size_t>(rank_ * per_rank_ + i)];
      const int now = p.physical_to_logical[static_cast<size_t>(rank_ * per_rank_ + i)];
      const ExpertWeights& src = all_experts_[l][static_cast<size_t>(now)];
      if (!copy_slots_) {
        local_[l][static_cast<size_t>(i)] = src;  // the host view itself
      } else if (now != was) {
        copy_expert(src, local_[l][static_cast<size_t>(i)], static_cast<int>(l));
      }
    }
    set_placement(static_cast<int>(l), std::move(p.physical_to_logical));
  }
  if (copy_slots_) backend_.synchronize();
  ++rebalances_;
  log_debug("EPLB: re-placed the experts of ", local_.size(), " layers from ", plan_.eplb_interval, " steps' loads");
}

}  // namespace deepinfer
