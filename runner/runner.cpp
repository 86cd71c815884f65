#include "runner/runner.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer {

int64_t Runner::kv_bytes_per_block(const Model& model, DType dtype, int block_size) {
  return static_cast<int64_t>(model.num_kv_layers()) * block_size * model.kv_row_dim() *
         static_cast<int64_t>(dtype_size(dtype));
}

Runner::Runner(Model& model, Backend& backend, const RunnerConfig& config)
    : model_(model), backend_(backend), config_(config) {
  DI_CHECK(config.num_kv_blocks > 0 && config.kv_block_size > 0 && config.max_model_len > 0,
           "runner: num_kv_blocks, kv_block_size and max_model_len must be > 0");
  const DType kv_dtype = backend.activation_dtype();
  for (int l = 0; l < model.num_kv_layers(); ++l) {
    kv_memory_.push_back(
        backend.alloc(kv_dtype, {config.num_kv_blocks, config.kv_block_size, model.kv_row_dim()}));
    kv_cache_.push_back(kv_memory_.back().tensor());
  }
  const int64_t max_tokens = config.max_num_batched_tokens, max_seqs = config.max_num_seqs;
  const int64_t max_blocks_per_seq =
      (config.max_model_len + config.kv_block_size - 1) / config.kv_block_size;
  token_ids_ = backend.alloc(DType::I32, {max_tokens});
  positions_ = backend.alloc(DType::I32, {max_tokens});
  slot_mapping_ = backend.alloc(DType::I32, {max_tokens});
  query_start_ = backend.alloc(DType::I32, {max_seqs + 1});
  seq_lens_ = backend.alloc(DType::I32, {max_seqs});
  logits_indices_ = backend.alloc(DType::I32, {max_seqs});
  block_tables_ = backend.alloc(DType::I32, {max_seqs * max_blocks_per_seq});
  logits_ = backend.alloc(DType::F32, {max_seqs, model.vocab_size()});
  argmax_ids_ = backend.alloc(DType::I32, {max_seqs});
  host_logits_ = HostBuffer(DType::F32, {max_seqs, model.vocab_size()});
}

Tensor Runner::upload(const std::vector<int32_t>& host, DeviceBuffer& buffer,
                      std::initializer_list<int64_t> dims) {
  Tensor dst(buffer.tensor().data, DType::I32, dims, buffer.tensor().device);
  DI_CHECK(dst.numel() <= buffer.tensor().numel(), "runner: step needs ", dst.numel(),
           " entries, buffer holds ", buffer.tensor().numel());
  if (dst.numel() == 0) return dst;
  Tensor src(const_cast<int32_t*>(host.data()), DType::I32, dims);
  backend_.copy(src, dst);
  return dst;
}

Tensor Runner::forward(std::span<const RunSeq> seqs) {
  const int bs = config_.kv_block_size;
  const int num_seqs = static_cast<int>(seqs.size());
  DI_CHECK(num_seqs > 0 && num_seqs <= config_.max_num_seqs, "runner: ", num_seqs,
           " sequences in a step (max ", config_.max_num_seqs, ")");
  StepBatch batch;
  std::vector<int32_t> token_ids, positions, slots, query_start{0}, seq_lens, logits_indices;
  size_t max_blocks = 1;
  for (const RunSeq& s : seqs) max_blocks = std::max(max_blocks, s.block_ids.size());
  std::vector<int32_t> block_tables(static_cast<size_t>(num_seqs) * max_blocks, 0);
  for (int i = 0; i < num_seqs; ++i) {
    const RunSeq& s = seqs[i];
    const int end = s.num_computed + s.num_new;
    DI_CHECK(s.num_new > 0 && end <= static_cast<int>(s.token_ids.size()) &&
                 static_cast<int64_t>(s.block_ids.size()) * bs >= end,
             "runner: sequence ", i, " computes tokens [", s.num_computed, ", ", end, ") of ",
             s.token_ids.size(), " with ", s.block_ids.size(), " blocks");
    for (int p = s.num_computed; p < end; ++p) {
      token_ids.push_back(s.token_ids[p]);
      positions.push_back(p);
      slots.push_back(s.block_ids[p / bs] * bs + p % bs);
    }
    std::copy(s.block_ids.begin(), s.block_ids.end(), block_tables.begin() + i * max_blocks);
    query_start.push_back(static_cast<int32_t>(token_ids.size()));
    seq_lens.push_back(end);
    if (s.needs_logits) logits_indices.push_back(static_cast<int32_t>(token_ids.size()) - 1);
    batch.max_query_len = std::max(batch.max_query_len, s.num_new);
    batch.max_seq_len = std::max(batch.max_seq_len, end);
  }
  const int64_t num_tokens = static_cast<int64_t>(token_ids.size());
  const int64_t num_logits = static_cast<int64_t>(logits_indices.size());
  batch.num_tokens = static_cast<int>(num_tokens);
  batch.num_seqs = num_seqs;
  batch.token_ids = upload(token_ids, token_ids_, {num_tokens});
  batch.positions = upload(positions, positions_, {num_tokens});
  batch.slot_mapping = upload(slots, slot_mapping_, {num_tokens});
  batch.query_start = upload(query_start, query_start_, {num_seqs + 1});
  batch.seq_lens = upload(seq_lens, seq_lens_, {num_seqs});
  batch.block_tables = upload(block_tables, block_tables_, {num_seqs, static_cast<int64_t>(max_blocks)});
  batch.logits_indices = upload(logits_indices, logits_indices_, {num_logits});
  batch.host_query_start = std::move(query_start);
  batch.host_seq_lens = std::move(seq_lens);

  const int64_t vocab = model_.vocab_size();
  Tensor logits(logits_.tensor().data, DType::F32, {num_logits, vocab}, logits_.tensor().device);
  model_.forward(batch, kv_cache_, logits);
  return logits;
}

const Tensor& Runner::execute(std::span<const RunSeq> seqs) {
  Tensor logits = forward(seqs);
  host_logits_view_ = Tensor(host_logits_.tensor().data, DType::F32, logits.dims());
  if (logits.size(0) > 0) backend_.copy(logits, host_logits_view_);
  backend_.synchronize();
  return host_logits_view_;
}

const std::vector<int32_t>& Runner::execute_argmax(std::span<const RunSeq> seqs) {
  Tensor logits = forward(seqs);
  const int64_t rows = logits.size(0);
  host_ids_.assign(static_cast<size_t>(rows), 0);
  if (rows > 0) {
    Tensor ids(argmax_ids_.tensor().data, DType::I32, {rows}, argmax_ids_.tensor().device);
    backend_.argmax(logits, ids);
    Tensor host(host_ids_.data(), DType::I32, {rows});
    backend_.copy(ids, host);
  }
  backend_.synchronize();
  return host_ids_;
}

}  // namespace deepinfer
