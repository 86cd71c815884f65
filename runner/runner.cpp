#include "runner/runner.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "core/error.h"
#include "model/config.h"

namespace deepinfer {

std::vector<KvGroupSpec> Runner::kv_groups(const Model& model, int num_mtp_kv_layers) {
  std::vector<KvGroupSpec> groups = model.kv_groups();
  DI_CHECK(!groups.empty(), "runner: the model declares no KV group");
  for (const KvGroupSpec& g : groups) g.validate();
  const int m = model.mtp_kv_group(), n = model.num_mtp_kv_groups();
  if (num_mtp_kv_layers > 0) {
    DI_CHECK(m >= 0 && n >= 1 && m + n <= static_cast<int>(groups.size()), "runner: the model's MTP KV groups ", m,
             " .. ", m + n - 1, " are not among its ", groups.size(), " groups");
  }
  for (int i = 0; i < n && num_mtp_kv_layers > 0; ++i) {
    KvGroupSpec& g = groups[static_cast<size_t>(m + i)];
    g.num_layers += num_mtp_kv_layers;
    // A window group keeps one row more: the MTP pass after a step (its last row at the
    // step's last position p reads rows [p - W + 1 - 1 ...]: the MTP row of position p - W + 1
    // sits one before the next query's window) runs after the step freed what that query
    // no longer reads.
    if (g.window > 0) g.window += 1;
  }
  return groups;
}

KvPoolLimits Runner::pool_limits(const RunnerConfig& config) {
  return {config.kv_block_size, config.max_num_seqs, config.max_num_batched_tokens};
}

int64_t Runner::kv_bytes_per_block(const Model& model, DType dtype, int block_size,
                                   int num_mtp_kv_layers) {
  int64_t bytes = 0;
  for (const KvGroupSpec& g : kv_groups(model, num_mtp_kv_layers))
    bytes += int64_t{g.num_layers} * block_size * g.row_bytes(dtype);
  return bytes;
}

Runner::Runner(Model& model, Backend& backend, const RunnerConfig& config)
    : model_(model), backend_(backend), config_(config) {
  DI_CHECK(config.num_kv_blocks > 0 && config.kv_block_size > 0 && config.max_model_len > 0 &&
               config.max_num_seqs > 0 && config.max_num_batched_tokens > 0,
           "runner: num_kv_blocks, kv_block_size, max_model_len, max_num_seqs and "
           "max_num_batched_tokens must be > 0");
  const DType kv_dtype = backend.activation_dtype();
  DI_CHECK(config.num_mtp_kv_layers == 0 || model.num_mtp_layers() >= config.num_mtp_kv_layers,
           "runner: ", config.num_mtp_kv_layers, " MTP KV layers asked, the model has ",
           model.num_mtp_layers(), " MTP layers loaded");
  DI_CHECK(config.max_logits_per_seq >= 1, "runner: max_logits_per_seq must be >= 1");
  groups_ = kv_groups(model, config.num_mtp_kv_layers);
  for (const KvGroupPool& pool : kv_group_pools(groups_, config.num_kv_blocks, pool_limits(config)))
    group_blocks_.push_back(pool.num_blocks);
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::vector<Tensor>& layers = kv_.emplace_back();
    for (int l = 0; l < groups_[g].num_layers; ++l) {
      kv_memory_.push_back(backend.alloc(groups_[g].row_dtype(kv_dtype),
                                         {group_blocks_[g], config.kv_block_size, groups_[g].row_dim}));
      layers.push_back(kv_memory_.back().tensor());
    }
  }
  for (int i = 0; i < model.num_mtp_kv_groups() && config.num_mtp_kv_layers > 0; ++i) {  // groups checked above
    const size_t g = static_cast<size_t>(model.mtp_kv_group() + i);
    mtp_kv_.push_back(kv_[g][static_cast<size_t>(groups_[g].num_layers - config.num_mtp_kv_layers)]);
  }
  const int64_t max_tokens = config.max_num_batched_tokens, max_seqs = config.max_num_seqs;
  max_blocks_per_seq_ = (config.max_model_len + config.kv_block_size - 1) / config.kv_block_size;
  const int64_t max_rows = max_rows_ =
      std::max(max_seqs, std::min(max_seqs * config.max_logits_per_seq, max_tokens));
  const int64_t capacity =
      StepLayout::make(max_tokens, max_seqs, max_rows, max_blocks_per_seq_, static_cast<int64_t>(groups_.size())).total;
  inputs_ = backend.alloc(DType::I32, {capacity});
  for (DeviceBuffer& s : staging_) s = backend.alloc_host(DType::I32, {capacity});
  const int64_t vocab = model.vocab_size();
  logits_ = backend.alloc(DType::F32, {max_rows, vocab});
  argmax_ids_ = backend.alloc(DType::I32, {max_rows});
  for (DeviceBuffer& h : host_ids_) h = backend.alloc_host(DType::I32, {max_rows});
  sample_params_ = backend.alloc(DType::I32, {max_rows, kSampleRowWords});
  for (DeviceBuffer& h : host_sample_params_) h = backend.alloc_host(DType::I32, {max_rows, kSampleRowWords});
  host_logits_ = backend.alloc_host(DType::F32, {max_rows, vocab});
  if (config.num_mtp_kv_layers > 0) {
    const DType dt = model.mtp_hidden_dtype(backend.activation_dtype());
    const int64_t H = model.mtp_hidden_size();
    hidden_ = backend.alloc(dt, {max_tokens, H});
    mtp_in_ = backend.alloc(dt, {max_tokens, H});
    for (DeviceBuffer& b : mtp_out_) b = backend.alloc(dt, {max_tokens, H});
    mtp_rows_ = backend.alloc(DType::I32, {max_tokens});
    for (DeviceBuffer& h : host_mtp_rows_) h = backend.alloc_host(DType::I32, {max_tokens});
    mtp_ids_ = backend.alloc(DType::I32, {max_rows});
    spec_accepted_ = backend.alloc(DType::I32, {max_seqs});
    spec_last_ = backend.alloc(DType::I32, {max_seqs});
    spec_rows_ = backend.alloc(DType::I32, {max_seqs});
    spec_drafts_ = backend.alloc(DType::I32, {config.max_logits_per_seq, max_seqs});
    for (DeviceBuffer& h : host_accepted_) h = backend.alloc_host(DType::I32, {max_seqs});
  }
  // A graph step has one logits row per token: buckets (x tokens per sequence) stay within
  // the step buffers and the logits rows.
  const int graph_seqs = std::min(config.max_num_seqs, config.max_num_batched_tokens);
  const int graph_tokens = static_cast<int>(std::min<int64_t>(max_tokens, max_rows));
  graphs_ = DecodeGraphs(graph_seqs, max_blocks_per_seq_, config.kv_block_size, graph_tokens);
  // Passes from the target's hidden states may be uniform over 1 + k rows per sequence
  // (draft_ahead's first pass); chained passes have one row per sequence.
  mtp_graphs_[0] = DecodeGraphs(graph_seqs, max_blocks_per_seq_, config.kv_block_size, graph_tokens);
  for (int v = 1; v < 3; ++v) mtp_graphs_[v] = DecodeGraphs(graph_seqs, max_blocks_per_seq_, config.kv_block_size);
}

StepBatch Runner::step_batch(const StepLayout& l, const StepHostInfo& info) const {
  const Tensor& in = inputs_.tensor();
  auto view = [&](int64_t offset, std::initializer_list<int64_t> dims) {
    return Tensor(in.ptr<int32_t>() + offset, DType::I32, dims, in.device);
  };
  StepBatch batch;
  batch.num_tokens = static_cast<int>(l.num_tokens);
  batch.num_seqs = static_cast<int>(l.num_seqs);
  batch.max_query_len = info.max_query_len;
  batch.max_seq_len = info.max_seq_len;
  batch.token_ids = view(l.token_ids, {l.num_tokens});
  batch.positions = view(l.positions, {l.num_tokens});
  batch.slot_mapping = view(l.slots, {l.num_tokens});
  batch.query_start = view(l.query_start, {l.num_seqs + 1});
  batch.seq_lens = view(l.seq_lens, {l.num_seqs});
  batch.block_tables = view(l.block_tables, {l.num_seqs, l.max_blocks});
  batch.logits_indices = view(l.logits_indices, {l.num_logits});
  batch.host_query_start = info.host_query_start;
  batch.host_seq_lens = info.host_seq_lens;
  batch.host_replay_floor = info.host_replay_floor;
  batch.kv_groups.push_back({batch.block_tables, batch.slot_mapping});
  for (int64_t g = 1; g < l.num_groups; ++g)
    batch.kv_groups.push_back({view(l.group_tables + (g - 1) * l.num_seqs * l.max_blocks, {l.num_seqs, l.max_blocks}),
                               view(l.group_slots + (g - 1) * l.num_tokens, {l.num_tokens})});
  return batch;
}

Tensor Runner::forward(const StepLayout& l, const StepHostInfo& info, const DecodePadding* graph_shape, bool wide) {
  StepBatch batch = step_batch(l, info);
  const Tensor& buf = wide ? wide_logits_.tensor() : logits_.tensor();
  Tensor logits(buf.data, DType::F32, {l.num_logits, model_.vocab_size()}, buf.device);
  Tensor hidden;
  Tensor* hidden_out = nullptr;
  if (hidden_.tensor().defined()) {
    hidden = hidden_.tensor().slice_rows(0, l.num_tokens);
    hidden_out = &hidden;
    hidden_rows_ = l.num_tokens;
  }
  if (graph_shape == nullptr) {
    if (dp_.active) batch.host_dp_num_tokens = dp_.num_tokens;
    model_.forward(batch, kv_, logits, hidden_out);
    return dp_.active ? gather_dp_logits(model_.vocab_size()) : logits;
  }
  if (run_graphed(graphs_, *graph_shape, [&] { model_.forward(batch, kv_, logits, hidden_out); }))
    ++stats_.num_graph_steps;
  return logits;
}

bool Runner::run_graphed(DecodeGraphs& graphs, const DecodePadding& shape, const std::function<void()>& body) {
  auto epoch = [&] { return std::make_pair(backend_.workspace_epoch(), model_.workspace_epoch()); };
  const int graph = graphs.find(backend_, shape, epoch());
  if (graph >= 0) {
    backend_.graph_replay(graph);
    return true;
  }
  // First step of this shape (or after a workspace reallocation): run it eagerly, which
  // also grows every workspace to this shape, then record it for the next steps.
  body();
  if (graphs.failed(shape)) return false;
  try {
    backend_.graph_capture_begin();
    try {
      body();
    } catch (...) {
      try {
        backend_.graph_release(backend_.graph_capture_end());
      } catch (const Error&) {
      }
      throw;
    }
    graphs.add(backend_, shape, backend_.graph_capture_end(), epoch());
    ++stats_.num_graphs_captured;
  } catch (const Error&) {
    // A shape that cannot be captured (e.g. an op that must grow a workspace or copy
    // through the host) runs eagerly from now on; the step's result is already computed.
    graphs.mark_failed(shape);
    ++stats_.num_capture_failures;
  }
  return false;
}

void Runner::shift_inputs(const StepLayout& l, int num_seqs, int assumed, SpecShift& f) {
  const Tensor& dev = inputs_.tensor();
  auto view = [&](int64_t offset, std::initializer_list<int64_t> dims) {
    return Tensor(dev.ptr<int32_t>() + offset, DType::I32, dims, dev.device);
  };
  f.accepted = spec_accepted_.tensor().slice_rows(0, num_seqs);
  f.assumed = assumed;
  f.query_start = view(l.query_start, {l.num_seqs + 1});
  f.positions = view(l.positions, {l.num_tokens});
  f.slots = view(l.slots, {l.num_tokens});
  f.seq_lens = view(l.seq_lens, {l.num_seqs});
  f.block_tables = view(l.block_tables, {l.num_seqs, l.max_blocks});
  f.block_size = config_.kv_block_size;
  f.tokens = view(l.token_ids, {l.num_tokens});
  backend_.spec_shift(f);
}

void Runner::submit(std::span<const RunSeq> seqs, bool argmax_only, bool tokens_from_previous,
                    std::span<const SampleRowParams> sample_rows, const SpecStep& spec) {
  const int num_seqs = static_cast<int>(seqs.size());
  DI_CHECK(num_seqs > 0 && num_seqs <= config_.max_num_seqs, "runner: ", num_seqs,
           " sequences in a step (max ", config_.max_num_seqs, ")");
  DI_CHECK(in_flight_.size() < 2, "runner: two steps are in flight; collect one first");
  DI_CHECK(mtp_pending_.empty(), "runner: a step submitted while MTP passes are pending");
  DI_CHECK(argmax_only || in_flight_.empty() || in_flight_.front().argmax_only,
           "runner: at most one step returning logits may be in flight");
  // Uniform step (graph-able): every sequence computes q new tokens after cached context,
  // each with its logits row (q = 1: decode; q = 1 + k: a verify step; a prefill chunk with a
  // row per token for prompt logprobs is not one).
  const int q = seqs[0].num_new;
  bool uniform = q <= config_.max_logits_per_seq;
  int max_seq_len = 0;
  int64_t num_tokens = 0;
  for (const RunSeq& s : seqs) {
    uniform = uniform && s.num_new == q && s.num_computed > 0 && s.needs_logits && s.num_logits == q;
    max_seq_len = std::max(max_seq_len, s.num_computed + s.num_new);
    num_tokens += s.num_new;
  }
  DI_CHECK(num_tokens <= config_.max_num_batched_tokens, "runner: step of ", num_tokens,
           " tokens (max_num_batched_tokens ", config_.max_num_batched_tokens, ")");
  DI_CHECK(!tokens_from_previous || (num_tokens == num_seqs && last_argmax_rows_ >= num_seqs),
           "runner: tokens_from_previous needs one new token per sequence and a previous "
           "argmax step of at least ", num_seqs, " rows (had ", last_argmax_rows_, ")");

  int64_t rows = 0;  // logits rows: the real rows that need logits come first
  for (const RunSeq& s : seqs) rows += s.needs_logits ? s.num_logits : 0;
  DI_CHECK(rows <= max_rows_ || !argmax_only, "runner: ", rows, " logits rows in an argmax step (max ", max_rows_,
           ": max_num_seqs x max_logits_per_seq)");
  const bool wide = rows > max_rows_;
  if (wide && (!wide_logits_.tensor().defined() || wide_logits_.tensor().size(0) < rows)) {
    DI_CHECK(in_flight_.empty() || in_flight_.front().argmax_only, "runner: growing the logits buffers while a "
             "logits step is in flight");
    const int64_t vocab = model_.vocab_size();
    wide_logits_ = backend_.alloc(DType::F32, {rows, vocab});
    host_wide_logits_ = backend_.alloc_host(DType::F32, {rows, vocab});
  }
  DI_CHECK(sample_rows.empty() || (argmax_only && static_cast<int64_t>(sample_rows.size()) == rows),
           "runner: sample_rows needs an argmax_only step and one entry per logits row (",
           sample_rows.size(), " entries, ", rows, " rows)");

  DI_CHECK(spec.verify_q == 0 || (spec_accepted_.tensor().defined() && argmax_only && uniform && q == spec.verify_q),
           "runner: a verify step with accepted counts on the device needs an MTP KV layer and a uniform argmax step of ",
           spec.verify_q, " tokens per sequence");
  DI_CHECK(spec.assumed < 0 || (ahead_drafts_ > 0 && num_seqs == last_verify_seqs_ && spec.assumed == last_verify_q_ - 1 &&
                                uniform && q == 1 + ahead_drafts_ && !tokens_from_previous),
           "runner: a step laid out on assumed drafts must follow draft_ahead over the same ", last_verify_seqs_,
           " sequences, with ", ahead_drafts_, " + 1 tokens each (got ", num_seqs, " sequences of ", q, ")");

  DecodePadding pad;
  if (uniform && graphs_enabled() && q <= model_.max_graph_tokens_per_seq())
    pad = graphs_.shape_for(num_seqs, q, max_seq_len);
  const bool graph = pad.num_seqs > 0;

  const int slot = next_slot_;
  next_slot_ ^= 1;
  Tensor& host = staging_[slot].tensor();
  StepHostInfo info;
  DI_CHECK(!leads() || (!graph && !tokens_from_previous && spec.verify_q == 0 && spec.assumed < 0 &&
                        (config_.dp_size == 1 || !wide)),
           "runner: with several processes steps run eagerly with their tokens from the host "
           "(no graphs, asynchronous tokens, drafts in flight or prompt logprobs beyond max_num_seqs rows)");
  dp_.active = false;
  StepLayout l;
  if (leads() && config_.dp_size > 1) {
    l = lead_dp_step(seqs, host.ptr<int32_t>(), host.numel(), info);
  } else {
    l = build_step_inputs(seqs, config_.kv_block_size, graph ? &pad : nullptr, host.ptr<int32_t>(), host.numel(),
                          info, groups_);
    if (leads()) lead_step(l, info, host.ptr<int32_t>());
  }
  const Tensor& dev = inputs_.tensor();
  Tensor src(host.data, DType::I32, {l.total}, host.device);
  Tensor dst(dev.data, DType::I32, {l.total}, dev.device);
  backend_.copy_async(src, dst);
  if (tokens_from_previous) {
    // Sequence i's token is row i of the previous step's argmax (issued before on the
    // same stream, so this copy reads it once that step is done).
    Tensor prev(argmax_ids_.tensor().data, DType::I32, {num_seqs}, argmax_ids_.tensor().device);
    Tensor ids(dev.ptr<int32_t>() + l.token_ids, DType::I32, {num_seqs}, dev.device);
    backend_.copy_async(prev, ids);
  }
  // The rows' sampling parameters travel like the step inputs: staged in this slot's host
  // memory (untouched until the step's fence), copied on the stream.
  Tensor dev_params(sample_params_.tensor().data, DType::I32, {rows, kSampleRowWords}, sample_params_.tensor().device);
  if (!sample_rows.empty()) {
    Tensor host_params(host_sample_params_[slot].tensor().data, DType::I32, {rows, kSampleRowWords});
    std::memcpy(host_params.data, sample_rows.data(), sample_rows.size_bytes());
    backend_.copy_async(host_params, dev_params);
  }
  if (spec.assumed >= 0) {
    // Laid out as if every draft of the previous verify step were accepted: moved back by
    // the rejected ones, its tokens (last token, then the drafts) from the device.
    SpecShift f;
    f.first_tokens = spec_last_.tensor().slice_rows(0, num_seqs);
    f.drafts = spec_drafts_.tensor();
    f.num_drafts = ahead_drafts_;
    f.drafts_stride = spec_drafts_.tensor().size(1);
    if (!sample_rows.empty()) f.sample_params = dev_params, f.rows_per_seq = q;
    shift_inputs(l, num_seqs, spec.assumed, f);
    ahead_drafts_ = 0;
  }

  Tensor logits = forward(l, info, graph ? &pad : nullptr, wide);
  Pending p;
  p.argmax_only = argmax_only;
  p.wide = wide;
  p.num_rows = rows;
  p.slot = slot;
  if (argmax_only) {
    if (rows > 0) {
      Tensor ids(argmax_ids_.tensor().data, DType::I32, {rows}, argmax_ids_.tensor().device);
      Tensor chosen = logits.slice_rows(0, rows);  // [rows, sample_vocab] of [rows, vocab]
      if (config_.sample_vocab > 0 && config_.sample_vocab < chosen.shape[1])
        chosen.shape[1] = config_.sample_vocab;
      if (sample_rows.empty()) {
        backend_.argmax(chosen, ids);
      } else {
        backend_.sample(chosen, dev_params, ids);
      }
      Tensor out(host_ids_[slot].tensor().data, DType::I32, {rows});
      backend_.copy_async(ids, out);
      if (spec.verify_q > 0) {
        // Each sequence's accepted drafts and last token, for the next step's fix-up; the
        // counts come back with the ids.
        const Tensor& dev = inputs_.tensor();
        Tensor tokens(dev.ptr<int32_t>() + l.token_ids, DType::I32, {rows}, dev.device);
        Tensor accepted = spec_accepted_.tensor().slice_rows(0, num_seqs);
        Tensor last = spec_last_.tensor().slice_rows(0, num_seqs);
        backend_.spec_accept(ids, tokens, q, accepted, last);
        Tensor host_accepted(host_accepted_[slot].tensor().data, DType::I32, {num_seqs});
        backend_.copy_async(accepted, host_accepted);
        p.num_accepted = num_seqs;
      }
    }
    last_argmax_rows_ = rows;
  } else {
    if (rows > 0) {
      Tensor out((wide ? host_wide_logits_ : host_logits_).tensor().data, DType::F32, {rows, model_.vocab_size()});
      backend_.copy_async(logits.slice_rows(0, rows), out);
    }
    last_argmax_rows_ = -1;
  }
  p.fence = backend_.record_fence();
  in_flight_.push_back(p);
  ++stats_.num_steps;
  last_verify_q_ = spec.verify_q;
  last_verify_seqs_ = spec.verify_q > 0 ? num_seqs : 0;
  ahead_drafts_ = 0;
}

const std::vector<int32_t>& Runner::collect_argmax() {
  DI_CHECK(!in_flight_.empty() && in_flight_.front().argmax_only,
           "runner: collect_argmax without an argmax step in flight");
  const Pending p = in_flight_.front();
  in_flight_.pop_front();
  backend_.wait_fence(p.fence);
  const int32_t* ids = host_ids_[p.slot].tensor().ptr<int32_t>();
  ids_out_.assign(ids, ids + p.num_rows);
  accepted_out_.clear();
  if (p.num_accepted > 0) {
    const int32_t* accepted = host_accepted_[p.slot].tensor().ptr<int32_t>();
    accepted_out_.assign(accepted, accepted + p.num_accepted);
  }
  return ids_out_;
}

const Tensor& Runner::collect_logits() {
  DI_CHECK(!in_flight_.empty() && !in_flight_.front().argmax_only,
           "runner: collect_logits without a logits step in flight");
  const Pending p = in_flight_.front();
  in_flight_.pop_front();
  backend_.wait_fence(p.fence);
  logits_out_ = Tensor((p.wide ? host_wide_logits_ : host_logits_).tensor().data, DType::F32,
                       {p.num_rows, model_.vocab_size()});
  return logits_out_;
}

int64_t Runner::mtp_pass(std::span<const RunSeq> seqs, std::span<const int32_t> host_rows, bool hidden_from_target,
                         Tensor& staging, Tensor& rows_staging, const Tensor* device_tokens, const Tensor* device_rows,
                         int shift_assumed, Tensor& logits_out) {
  const int num_seqs = static_cast<int>(seqs.size());
  const Tensor& src_all = hidden_from_target ? hidden_.tensor() : mtp_out_[mtp_cur_].tensor();
  // A pass from the target's hidden states writes mtp_out_[0], a chained one the other
  // buffer than it reads: three (source, destination) pairs, a graph set for each.
  const int out_index = hidden_from_target ? 0 : mtp_cur_ ^ 1;
  const int variant = hidden_from_target ? 0 : 1 + mtp_cur_;
  // Uniform passes (q rows per sequence after cached context, each with logits: every chained
  // draft, and draft_ahead's first pass) replay a graph like decode and verify steps do.
  const int q = seqs[0].num_new;
  bool uniform = true;
  int max_seq_len = 0;
  for (const RunSeq& s : seqs) {
    uniform = uniform && s.num_new == q && s.num_computed > 0 && s.needs_logits && s.num_logits == q;
    max_seq_len = std::max(max_seq_len, s.num_computed + s.num_new);
  }
  DecodePadding pad;
  if (uniform && graphs_enabled() && model_.mtp_graph_capturable() && q <= model_.max_graph_tokens_per_seq())
    pad = mtp_graphs_[variant].shape_for(num_seqs, q, max_seq_len);
  const bool graph = pad.num_seqs > 0;
  StepHostInfo info;
  const StepLayout l =
      build_step_inputs(seqs, config_.kv_block_size, graph ? &pad : nullptr, staging.ptr<int32_t>(), staging.numel(),
                        info, std::span(groups_).subspan(static_cast<size_t>(model_.mtp_kv_group()), mtp_kv_.size()));
  const Tensor& dev = inputs_.tensor();
  Tensor src(staging.data, DType::I32, {l.total}, staging.device);
  Tensor dst(dev.data, DType::I32, {l.total}, dev.device);
  backend_.copy_async(src, dst);
  const int64_t real_tokens = info.host_query_start[static_cast<size_t>(num_seqs)];
  if (device_tokens != nullptr) {
    // Each row's token from the device (issued before on the same stream: read once its
    // producer is done; a NaN row's no-token id embeds as a NaN row).
    Tensor ids(dev.ptr<int32_t>() + l.token_ids, DType::I32, {real_tokens}, dev.device);
    backend_.copy_async(device_tokens->slice_rows(0, real_tokens), ids);
  }
  // Hidden source rows; padding rows read row 0.
  Tensor rows(mtp_rows_.tensor().data, DType::I32, {l.num_tokens}, mtp_rows_.tensor().device);
  Tensor host_rows_t(rows_staging.data, DType::I32, {l.num_tokens}, rows_staging.device);
  std::fill(std::copy(host_rows.begin(), host_rows.end(), host_rows_t.ptr<int32_t>()),
            host_rows_t.ptr<int32_t>() + l.num_tokens, 0);
  backend_.copy_async(host_rows_t, rows);
  if (device_rows != nullptr) {
    Tensor first = rows.slice_rows(0, real_tokens);
    backend_.copy_async(device_rows->slice_rows(0, real_tokens), first);
  }
  if (shift_assumed >= 0) {
    SpecShift f;
    shift_inputs(l, num_seqs, shift_assumed, f);
  }

  StepBatch batch = step_batch(l, info);
  Tensor in = mtp_in_.tensor().slice_rows(0, l.num_tokens);
  Tensor out = mtp_out_[out_index].tensor().slice_rows(0, l.num_tokens);
  Tensor logits(logits_.tensor().data, DType::F32, {l.num_logits, model_.vocab_size()},
                logits_.tensor().device);
  auto body = [&] {
    backend_.embedding(rows, src_all, in);  // gather the hidden inputs
    model_.mtp_forward(batch, mtp_kv_, in,
                       out, logits);
  };
  if (!graph) {
    body();
  } else if (run_graphed(mtp_graphs_[variant], pad, body)) {
    ++stats_.num_mtp_graph_runs;
  }
  mtp_cur_ = out_index;
  mtp_out_rows_ = l.num_tokens;
  // Drafts are argmax rows: chosen on the device. Real rows only (a padded pass computes more).
  const int64_t rows_out = graph ? int64_t{num_seqs} * q : l.num_logits;
  DI_CHECK(rows_out <= mtp_ids_.tensor().numel(), "runner: an MTP pass returns ", rows_out,
           " logits rows (max ", mtp_ids_.tensor().numel(), ")");
  if (rows_out > 0) {
    Tensor ids(mtp_ids_.tensor().data, DType::I32, {rows_out}, mtp_ids_.tensor().device);
    Tensor chosen = logits.slice_rows(0, rows_out);  // [rows, sample_vocab] of [rows, vocab]
    if (config_.sample_vocab > 0 && config_.sample_vocab < chosen.shape[1]) chosen.shape[1] = config_.sample_vocab;
    backend_.argmax(chosen, ids);
  }
  last_mtp_rows_ = rows_out;
  logits_out = logits.slice_rows(0, rows_out);
  return rows_out;
}

void Runner::submit_mtp(std::span<const RunSeq> seqs, std::span<const int32_t> hidden_rows, bool hidden_from_target,
                        bool logits_to_host, bool tokens_from_previous) {
  DI_CHECK(in_flight_.empty(), "runner: run_mtp while asynchronous steps are in flight");
  DI_CHECK(config_.num_mtp_kv_layers > 0, "runner: run_mtp without an MTP KV layer (RunnerConfig)");
  DI_CHECK(mtp_pending_.size() < 2, "runner: two MTP passes are pending; collect one first");
  const int num_seqs = static_cast<int>(seqs.size());
  int64_t num_tokens = 0;
  for (const RunSeq& s : seqs) num_tokens += s.num_new;
  DI_CHECK(num_seqs > 0 && num_seqs <= config_.max_num_seqs && num_tokens <= config_.max_num_batched_tokens &&
               static_cast<int64_t>(hidden_rows.size()) == num_tokens,
           "runner: run_mtp over ", num_seqs, " sequences and ", num_tokens, " tokens with ",
           hidden_rows.size(), " hidden rows");
  DI_CHECK(!tokens_from_previous || (num_tokens == num_seqs && last_mtp_rows_ >= num_seqs),
           "runner: an MTP pass with tokens from the previous one needs one row per sequence and a previous pass of ",
           "at least ", num_seqs, " logits rows (had ", last_mtp_rows_, ")");
  const int64_t src_rows = hidden_from_target ? hidden_rows_ : mtp_out_rows_;
  for (int32_t r : hidden_rows)
    DI_CHECK(r >= 0 && r < src_rows, "runner: run_mtp hidden row ", r, " outside [0, ", src_rows, ")");
  // The host staging of this slot was last read by the pass before the pending one (at
  // most two pending, collected in order): free.
  const int slot = next_slot_;
  next_slot_ ^= 1;
  // Chained drafts: row i's token is the previous pass's argmax of its row i (no host wait
  // between passes; copied into the inputs before this pass's argmax overwrites mtp_ids_).
  const Tensor prev_ids = mtp_ids_.tensor();
  Tensor logits;
  const int64_t rows_out = mtp_pass(seqs, hidden_rows, hidden_from_target, staging_[slot].tensor(),
                                    host_mtp_rows_[slot].tensor(), tokens_from_previous ? &prev_ids : nullptr, nullptr,
                                    -1, logits);
  // Only the drafts' ids come back (a [rows, vocab] F32 copy and a host scan per draft cost
  // more than the MTP layer at batch 64), and the logits when asked.
  MtpPending p;
  p.slot = slot;
  p.rows = rows_out;
  p.logits = logits_to_host;
  if (rows_out > 0) {
    Tensor ids(mtp_ids_.tensor().data, DType::I32, {rows_out}, mtp_ids_.tensor().device);
    Tensor host_ids(host_ids_[slot].tensor().data, DType::I32, {rows_out});
    backend_.copy_async(ids, host_ids);
  }
  if (logits_to_host && rows_out > 0) {
    // Two pending passes keep their host logits in the two halves of host_logits_.
    const bool half = rows_out <= max_overlapped_mtp_rows();
    DI_CHECK(half || mtp_pending_.empty(), "runner: an MTP pass of ", rows_out, " logits rows to the host while ",
             "another is pending (at most ", max_overlapped_mtp_rows(), " rows each)");
    p.logits_row0 = half ? slot * max_overlapped_mtp_rows() : 0;
    Tensor host_logits(host_logits_.tensor().ptr<float>() + p.logits_row0 * model_.vocab_size(), DType::F32,
                       {rows_out, model_.vocab_size()});
    backend_.copy_async(logits, host_logits);
  }
  p.fence = backend_.record_fence();
  mtp_pending_.push_back(p);
}

void Runner::draft_ahead(std::span<const DraftAheadSeq> seqs, int num_drafts) {
  const int num_seqs = static_cast<int>(seqs.size()), q = last_verify_q_;
  DI_CHECK(config_.num_mtp_kv_layers > 0 && mtp_pending_.empty() && in_flight_.size() == 1 && q > 0 &&
               num_seqs == last_verify_seqs_ && num_drafts >= 1 && num_drafts < config_.max_logits_per_seq,
           "runner: draft_ahead needs an MTP KV layer, one verify step in flight (of ", last_verify_seqs_,
           " sequences) with accepted counts on the device, no MTP pass pending, and 1 .. ",
           config_.max_logits_per_seq - 1, " drafts (got ", num_seqs, " sequences, ", num_drafts, " drafts)");
  const int assumed = q - 1;
  int max_end = 0;
  for (const DraftAheadSeq& s : seqs) max_end = std::max(max_end, s.begin + assumed + num_drafts);
  if (static_cast<int>(ahead_zeros_.size()) < max_end) ahead_zeros_.assign(static_cast<size_t>(max_end), 0);
  // Host staging: one (inputs, rows) pair per pass of this round.
  std::vector<DeviceBuffer>& ring = ahead_staging_[ahead_round_];
  ahead_round_ ^= 1;
  while (static_cast<int>(ring.size()) < 2 * num_drafts) {
    ring.push_back(backend_.alloc_host(DType::I32, {staging_[0].tensor().numel()}));
    ring.push_back(backend_.alloc_host(DType::I32, {config_.max_num_batched_tokens}));
  }
  std::vector<RunSeq> runs(static_cast<size_t>(num_seqs));
  std::vector<int32_t> rows;
  // Pass 0: every row of the verify step in flight (tokens: its chosen ids, which row for row
  // are the tokens after its positions; hidden: its target rows).
  for (int s = 0; s < num_seqs; ++s) {
    runs[static_cast<size_t>(s)] = {ahead_zeros_, seqs[static_cast<size_t>(s)].begin, q,
                                    seqs[static_cast<size_t>(s)].block_ids, true, q};
    for (int j = 0; j < q; ++j) rows.push_back(s * q + j);
  }
  const Tensor target_ids = argmax_ids_.tensor().slice_rows(0, int64_t{num_seqs} * q);
  Tensor logits;
  mtp_pass(runs, rows, true, ring[0].tensor(), ring[1].tensor(), &target_ids, nullptr, -1, logits);
  // Draft 1: row accepted[s] of each sequence; its output hidden state feeds the chain.
  Tensor accepted = spec_accepted_.tensor().slice_rows(0, num_seqs);
  Tensor draft_rows = spec_rows_.tensor().slice_rows(0, num_seqs);
  const int64_t stride = spec_drafts_.tensor().size(1);
  auto drafts_row = [&](int d) {
    return Tensor(spec_drafts_.tensor().ptr<int32_t>() + d * stride, DType::I32, {num_seqs},
                  spec_drafts_.tensor().device);
  };
  Tensor first = drafts_row(0);
  backend_.spec_select_rows(mtp_ids_.tensor().slice_rows(0, int64_t{num_seqs} * q), accepted, q, first, draft_rows);
  // Chained passes d = 1 ..: draft d + 1 at position begin + accepted + d (laid out at
  // begin + k + d, shifted on the device), token draft d, hidden the previous pass's row.
  rows.resize(static_cast<size_t>(num_seqs));
  for (int s = 0; s < num_seqs; ++s) rows[static_cast<size_t>(s)] = s;
  for (int d = 1; d < num_drafts; ++d) {
    for (int s = 0; s < num_seqs; ++s)
      runs[static_cast<size_t>(s)] = {ahead_zeros_, seqs[static_cast<size_t>(s)].begin + assumed + d, 1,
                                      seqs[static_cast<size_t>(s)].block_ids, true, 1};
    const Tensor prev = drafts_row(d - 1);
    mtp_pass(runs, rows, false, ring[2 * static_cast<size_t>(d)].tensor(),
             ring[2 * static_cast<size_t>(d) + 1].tensor(), &prev, d == 1 ? &draft_rows : nullptr, assumed, logits);
    Tensor next = drafts_row(d);
    backend_.copy_async(mtp_ids_.tensor().slice_rows(0, num_seqs), next);
  }
  ahead_drafts_ = num_drafts;
  ++stats_.num_drafts_ahead;
}

const std::vector<int32_t>& Runner::collect_mtp() {
  DI_CHECK(!mtp_pending_.empty(), "runner: collect_mtp without a pending MTP pass");
  const MtpPending p = mtp_pending_.front();
  mtp_pending_.pop_front();
  backend_.wait_fence(p.fence);
  logits_out_ = p.logits ? Tensor(host_logits_.tensor().ptr<float>() + p.logits_row0 * model_.vocab_size(), DType::F32,
                                  {p.rows, model_.vocab_size()})
                         : Tensor{};
  const int32_t* ids = host_ids_[p.slot].tensor().ptr<int32_t>();
  ids_out_.assign(ids, ids + p.rows);
  return ids_out_;
}

const std::vector<int32_t>& Runner::run_mtp(std::span<const RunSeq> seqs, std::span<const int32_t> hidden_rows,
                                            bool hidden_from_target, bool logits_to_host) {
  DI_CHECK(mtp_pending_.empty(), "runner: run_mtp while MTP passes are pending");
  submit_mtp(seqs, hidden_rows, hidden_from_target, logits_to_host);
  return collect_mtp();
}

const Tensor& Runner::execute(std::span<const RunSeq> seqs) {
  DI_CHECK(in_flight_.empty(), "runner: execute while asynchronous steps are in flight");
  submit(seqs, false);
  return collect_logits();
}

const std::vector<int32_t>& Runner::execute_argmax(std::span<const RunSeq> seqs) {
  DI_CHECK(in_flight_.empty(), "runner: execute_argmax while asynchronous steps are in flight");
  submit(seqs, true);
  return collect_argmax();
}

}  // namespace deepinfer
