// Step following (several processes, issue 20): rank 0 owns the scheduler, the sampler and the
// outputs; the other ranks hold their shard of the model and a KV cache of the same blocks, and
// run exactly the steps rank 0 runs, so the model's collectives pair up.
//
// One message per step, two broadcasts: a fixed header (what follows and its sizes), then the
// payload: the step's I32 inputs as build_step_inputs laid them out (StepLayout::make of the
// header's sizes gives the same offsets on every rank) and the host mirrors the model reads;
// or the KV block copies before a step (prefix-cache copy-on-write). Rank 0 stops the others
// when its runner goes away.
#include <array>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"
#include "runner/runner.h"

namespace deepinfer {
namespace {

enum Message : int64_t { kStop = 0, kStep = 1, kCopies = 2 };

// [kind, num_tokens, num_seqs, num_logits, max_blocks, num_groups, max_query_len, max_seq_len,
//  replay floors (0 or num_seqs), payload ints]
using Header = std::array<int64_t, 10>;

}  // namespace

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
    DI_CHECK((h[0] == kStep || h[0] == kCopies) && h[9] >= 0 && h[9] < (int64_t{1} << 31),
             "runner: a malformed step message from rank 0 (kind ", h[0], ", ", h[9], " ints)");
    msg.resize(static_cast<size_t>(h[9]));
    config_.comm->broadcast_bytes(msg.data(), h[9] * 4, 0);
    if (h[0] == kCopies) {
      std::vector<BlockCopy> copies;
      for (int64_t i = 0; i < h[1]; ++i) copies.push_back({msg[3 * i], msg[3 * i + 1], msg[3 * i + 2]});
      copy_blocks(copies);
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
