// Step following (several processes, issue 20): rank 0 owns the scheduler, the sampler and the
// outputs; the other ranks hold their shard of the model and a KV cache of the same blocks, and
// run exactly the steps rank 0 runs, so the model's collectives pair up.
//
// One message per step, two broadcasts: a fixed header (what follows and its sizes), then the
// payload: the step's I32 inputs as build_step_inputs laid them out (StepLayout::make of the
// header's sizes gives the same offsets on every rank) and the host mirrors the model reads;
// or the KV block copies before a step (prefix-cache copy-on-write). Rank 0 stops the others
// when its runner goes away.
#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"
#include "runner/runner.h"

namespace deepinfer {
namespace {

enum Message : int64_t { kStop = 0, kStep = 1, kCopies = 2, kDpStep = 3, kHoldEplb = 4 };

// [kind, num_tokens, num_seqs, num_logits, max_blocks, num_groups, max_query_len, max_seq_len,
//  replay floors (0 or num_seqs), payload ints]
using Header = std::array<int64_t, 10>;

// A data-parallel step's part for one rank: [sub-header, its payload].
constexpr int kPartHeader = 9;  // num_tokens, num_seqs, num_logits, max_blocks, num_groups,
                                // max_query_len, max_seq_len, floors, payload ints

void append_part(const StepLayout& l, const StepHostInfo& info, const int32_t* ints, std::vector<int32_t>& msg) {
  const int64_t floors = static_cast<int64_t>(info.host_replay_floor.size());
  const int64_t payload = l.total + (l.num_seqs + 1) + l.num_seqs + floors;
  for (int64_t v : {l.num_tokens, l.num_seqs, l.num_logits, l.max_blocks, l.num_groups,
                    static_cast<int64_t>(info.max_query_len), static_cast<int64_t>(info.max_seq_len), floors, payload})
    msg.push_back(static_cast<int32_t>(v));
  msg.insert(msg.end(), ints, ints + l.total);
  msg.insert(msg.end(), info.host_query_start.begin(), info.host_query_start.end());
  msg.insert(msg.end(), info.host_seq_lens.begin(), info.host_seq_lens.end());
  msg.insert(msg.end(), info.host_replay_floor.begin(), info.host_replay_floor.end());
}

// Reads a part (at p) into its layout, host info and inputs; returns the input ints.
const int32_t* read_part(const int32_t* p, StepLayout& l, StepHostInfo& info) {
  l = StepLayout::make(p[0], p[1], p[2], p[3], p[4]);
  info = StepHostInfo{};
  info.max_query_len = p[5];
  info.max_seq_len = p[6];
  const int32_t* ints = p + kPartHeader;
  const int32_t* q = ints + l.total;
  info.host_query_start.assign(q, q + l.num_seqs + 1);
  q += l.num_seqs + 1;
  info.host_seq_lens.assign(q, q + l.num_seqs);
  q += l.num_seqs;
  info.host_replay_floor.assign(q, q + p[7]);
  return ints;
}

}  // namespace

StepLayout Runner::lead_dp_step(std::span<const RunSeq> seqs, int32_t* host, int64_t capacity, StepHostInfo& info) {
  const int W = config_.dp_size;
  DI_CHECK(config_.comm->size() % W == 0, "runner: --dp ", W, " over ", config_.comm->size(), " processes");
  std::vector<std::vector<RunSeq>> parts(static_cast<size_t>(W));
  std::vector<int> rank_of(seqs.size());
  // Per-rank KV pools (BlockManager::set_partitions): block b of the leader's tables is block
  // b / W of group b % W's pool; every block of a sequence is in its group's partition.
  std::vector<std::vector<int32_t>> local_ids(seqs.size());
  std::vector<std::vector<std::vector<int32_t>>> local_more(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    DI_CHECK(!seqs[i].block_ids.empty() && seqs[i].block_ids[0] >= 0, "runner: sequence ", i,
             " has no KV block");
    const int r = rank_of[i] = seqs[i].block_ids[0] % W;
    auto local = [&](std::span<const int32_t> ids, std::vector<int32_t>& out, int g) {
      for (int32_t b : ids) {
        DI_CHECK(b == kNullBlock || (b % W == r && b / W < group_blocks_[static_cast<size_t>(g)]), "runner: sequence ",
                 i, " holds KV block ", b, " outside its data-parallel rank ", r, "'s partition (block % ", W,
                 ", ", group_blocks_[static_cast<size_t>(g)], " blocks per rank)");
        out.push_back(b == kNullBlock ? b : b / W);
      }
    };
    RunSeq s = seqs[i];
    local(s.block_ids, local_ids[i], 0);
    s.block_ids = local_ids[i];
    for (size_t g = 0; g < s.more_block_ids.size(); ++g)
      local(s.more_block_ids[g], local_more[i].emplace_back(), static_cast<int>(g + 1));
    s.more_block_ids = local_more[i];
    parts[static_cast<size_t>(r)].push_back(s);
  }
  std::vector<int32_t> msg, scratch(static_cast<size_t>(capacity));
  dp_ = DpStep{};
  dp_.active = true;
  StepLayout own;
  for (int r = 0; r < W; ++r) {
    // A rank without sequences runs one filler token (no KV store, logits dropped): the MoE
    // layers' collectives need every rank.
    DecodePadding filler{1, 1, 1, 1};
    StepHostInfo part_info;
    const auto& part = parts[static_cast<size_t>(r)];
    const StepLayout l = build_step_inputs(part, config_.kv_block_size, part.empty() ? &filler : nullptr,
                                           r == 0 ? host : scratch.data(), capacity, part_info, groups_);
    append_part(l, part_info, r == 0 ? host : scratch.data(), msg);
    dp_.num_tokens.push_back(static_cast<int32_t>(l.num_tokens));
    dp_.num_rows.push_back(l.num_logits);
    if (r == 0) own = l, info = part_info;
  }
  // Row i of the step (sequences in order, each its num_logits rows) is row k of group r's part,
  // gathered (over every rank: --tp T ranks per group, rank r * T the group's first) at
  // r * T * max_rows + k.
  const int64_t max_rows = *std::max_element(dp_.num_rows.begin(), dp_.num_rows.end());
  const int64_t group = config_.comm->size() / W;
  std::vector<int64_t> next(static_cast<size_t>(W), 0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (!seqs[i].needs_logits) continue;
    for (int j = 0; j < seqs[i].num_logits; ++j)
      dp_.row_src.push_back((rank_of[i] * group) * max_rows + next[rank_of[i]]++);
  }
  Header h{kDpStep, W, 0, 0, 0, 0, 0, 0, 0, static_cast<int64_t>(msg.size())};
  config_.comm->broadcast_bytes(h.data(), sizeof(h), 0);
  config_.comm->broadcast_bytes(msg.data(), static_cast<int64_t>(msg.size()) * 4, 0);
  return own;
}

Tensor Runner::gather_dp_logits(int64_t vocab) {
  const int64_t W = config_.comm->size();  // every rank's rows: dp groups x their --tp ranks
  const int64_t max_rows = *std::max_element(dp_.num_rows.begin(), dp_.num_rows.end());
  DI_CHECK(max_rows <= max_rows_, "runner: a data-parallel part of ", max_rows, " logits rows (max ", max_rows_, ")");
  if (!dp_logits_.tensor().defined()) dp_logits_ = backend_.alloc(DType::F32, {W * max_rows_, vocab});
  const Tensor& buf = logits_.tensor();
  Tensor send(buf.data, DType::F32, {max_rows, vocab}, buf.device);
  Tensor all(dp_logits_.tensor().data, DType::F32, {W * max_rows, vocab}, buf.device);
  config_.comm->all_gather(send, all);
  const int64_t rows = static_cast<int64_t>(dp_.row_src.size());
  Tensor out(buf.data, DType::F32, {rows, vocab}, buf.device);
  for (int64_t i = 0; i < rows; ++i) {  // the leader's rows in the step's order
    Tensor dst = out.slice_rows(i, i + 1);
    backend_.copy(all.slice_rows(dp_.row_src[i], dp_.row_src[i] + 1), dst);
  }
  return out;
}

int Runner::dp_rank() const {
  if (config_.comm == nullptr || config_.dp_size <= 1) return 0;
  return config_.comm->rank() / (config_.comm->size() / config_.dp_size);  // rank = dp_rank x T + tp_rank
}

bool Runner::leads() const {
  return config_.comm != nullptr && config_.comm->size() > 1 && config_.comm->rank() == 0;
}

void Runner::lead_step(const StepLayout& l, const StepHostInfo& info, const int32_t* host) {
  const int64_t floors = static_cast<int64_t>(info.host_replay_floor.size());
  const int64_t payload = l.total + (l.num_seqs + 1) + l.num_seqs + floors;
  Header h{kStep, l.num_tokens, l.num_seqs, l.num_logits, l.max_blocks, l.num_groups, info.max_query_len,
           info.max_seq_len, floors, payload};
  config_.comm->broadcast_bytes(h.data(), sizeof(h), 0);
  std::vector<int32_t> msg(static_cast<size_t>(payload));
  int32_t* p = std::copy(host, host + l.total, msg.data());
  p = std::copy(info.host_query_start.begin(), info.host_query_start.end(), p);
  p = std::copy(info.host_seq_lens.begin(), info.host_seq_lens.end(), p);
  std::copy(info.host_replay_floor.begin(), info.host_replay_floor.end(), p);
  config_.comm->broadcast_bytes(msg.data(), payload * 4, 0);
}

void Runner::lead_copies(std::span<const BlockCopy> copies) {
  const int64_t n = static_cast<int64_t>(copies.size());
  Header h{kCopies, n, 0, 0, 0, 0, 0, 0, 0, 3 * n};
  config_.comm->broadcast_bytes(h.data(), sizeof(h), 0);
  std::vector<int32_t> msg;
  for (const BlockCopy& c : copies) msg.insert(msg.end(), {c.src_block_id, c.dst_block_id, c.group});
  config_.comm->broadcast_bytes(msg.data(), 3 * n * 4, 0);
}

void Runner::hold_expert_replacement(bool hold) {
  if (leads()) {
    Header h{kHoldEplb, hold ? 1 : 0, 0, 0, 0, 0, 0, 0, 0, 1};
    config_.comm->broadcast_bytes(h.data(), sizeof(h), 0);
    int32_t payload = hold ? 1 : 0;  // every message has a payload
    config_.comm->broadcast_bytes(&payload, 4, 0);
  }
  model_.hold_expert_replacement(hold);
}

void Runner::stop_followers() {
  if (!leads() || followers_stopped_) return;
  followers_stopped_ = true;
  Header h{kStop, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  config_.comm->broadcast_bytes(h.data(), sizeof(h), 0);
}

Runner::~Runner() {
  try {
    stop_followers();
  } catch (const Error&) {
    // The followers' communicator is gone (a failed run): nothing left to tell them.
  }
}

int64_t Runner::follow() {
  DI_CHECK(config_.comm != nullptr && config_.comm->rank() != 0, "runner: follow() is for ranks other than 0");
  int64_t steps = 0;
  std::vector<int32_t> msg;
  for (;;) {
    Header h{};
    config_.comm->broadcast_bytes(h.data(), sizeof(h), 0);
    if (h[0] == kStop) return steps;
    DI_CHECK((h[0] == kStep || h[0] == kCopies || h[0] == kDpStep || h[0] == kHoldEplb) && h[9] >= 0 &&
                 h[9] < (int64_t{1} << 31),
             "runner: a malformed step message from rank 0 (kind ", h[0], ", ", h[9], " ints)");
    msg.resize(static_cast<size_t>(h[9]));
    config_.comm->broadcast_bytes(msg.data(), h[9] * 4, 0);
    if (h[0] == kHoldEplb) {  // the leader's hold of EPLB's flush (between steps, as there)
      model_.hold_expert_replacement(h[1] != 0);
      continue;
    }
    if (h[0] == kCopies) {
      std::vector<BlockCopy> copies;
      for (int64_t i = 0; i < h[1]; ++i) copies.push_back({msg[3 * i], msg[3 * i + 1], msg[3 * i + 2]});
      copy_blocks(copies);
      continue;
    }
    if (h[0] == kDpStep) {  // this rank's part of a data-parallel step
      DI_CHECK(h[1] == config_.dp_size, "runner: rank 0 splits steps over ", h[1], " data-parallel ranks, this "
               "rank's engine over ", config_.dp_size);
      const int32_t* p = msg.data();
      const int dp_rank = this->dp_rank();
      dp_ = DpStep{};
      dp_.active = true;
      StepLayout own;
      StepHostInfo own_info;
      const int32_t* own_ints = nullptr;
      for (int r = 0; r < config_.dp_size; ++r) {
        StepLayout l;
        StepHostInfo info;
        const int32_t* ints = read_part(p, l, info);
        dp_.num_tokens.push_back(static_cast<int32_t>(l.num_tokens));
        dp_.num_rows.push_back(l.num_logits);
        if (r == dp_rank) own = l, own_info = std::move(info), own_ints = ints;
        p += kPartHeader + p[8];
      }
      DI_CHECK(own.total <= inputs_.tensor().numel(), "runner: rank 0's step does not fit this rank's runner");
      Tensor& host = staging_[0].tensor();
      std::memcpy(host.data, own_ints, static_cast<size_t>(own.total) * 4);
      Tensor src(host.data, DType::I32, {own.total}, host.device);
      Tensor dst(inputs_.tensor().data, DType::I32, {own.total}, inputs_.tensor().device);
      backend_.copy_async(src, dst);
      forward(own, own_info, nullptr, false);
      backend_.synchronize();
      dp_.active = false;
      ++steps;
      ++stats_.num_steps;
      continue;
    }
    const StepLayout l = StepLayout::make(h[1], h[2], h[3], h[4], h[5]);
    DI_CHECK(l.num_seqs <= config_.max_num_seqs && l.num_tokens <= config_.max_num_batched_tokens &&
                 l.total <= inputs_.tensor().numel() && h[9] == l.total + 2 * l.num_seqs + 1 + h[8],
             "runner: rank 0's step (", l.num_tokens, " tokens, ", l.num_seqs, " sequences) does not fit this "
             "rank's runner; every rank must run the same engine configuration");
    StepHostInfo info;
    info.max_query_len = static_cast<int>(h[6]);
    info.max_seq_len = static_cast<int>(h[7]);
    const int32_t* p = msg.data() + l.total;
    info.host_query_start.assign(p, p + l.num_seqs + 1);
    p += l.num_seqs + 1;
    info.host_seq_lens.assign(p, p + l.num_seqs);
    p += l.num_seqs;
    info.host_replay_floor.assign(p, p + h[8]);
    Tensor& host = staging_[0].tensor();
    std::memcpy(host.data, msg.data(), static_cast<size_t>(l.total) * 4);
    const Tensor& dev = inputs_.tensor();
    Tensor src(host.data, DType::I32, {l.total}, host.device);
    Tensor dst(dev.data, DType::I32, {l.total}, dev.device);
    backend_.copy_async(src, dst);
    const bool wide = l.num_logits > max_rows_;
    if (wide && (!wide_logits_.tensor().defined() || wide_logits_.tensor().size(0) < l.num_logits))
      wide_logits_ = backend_.alloc(DType::F32, {l.num_logits, model_.vocab_size()});
    forward(l, info, nullptr, wide);
    backend_.synchronize();  // staging_[0] is reused by the next message
    ++steps;
    ++stats_.num_steps;
  }
}

}  // namespace deepinfer
