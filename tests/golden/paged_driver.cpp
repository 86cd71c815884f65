#include "paged_driver.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer::test {

PagedDriver::PagedDriver(Model& model, Backend& backend, int block_size, int num_blocks)
    : model_(model), backend_(backend), block_size_(block_size) {
  const std::vector<KvGroupSpec> groups = model.kv_groups();
  DI_CHECK(groups.size() == 1 && groups[0].tokens_per_row == 1 && groups[0].window == 0,
           "PagedDriver: one KV group of one row per token only");
  caches_.emplace_back();
  for (int l = 0; l < groups[0].num_layers; ++l) {
    cache_buffers_.push_back(backend.alloc(groups[0].row_dtype(backend.activation_dtype()),
                                           {num_blocks, block_size, groups[0].row_dim}));
    caches_[0].push_back(cache_buffers_.back().tensor());
  }
  // Hand out blocks in a scattered order: odd ids descending, then even ids ascending.
  for (int b = num_blocks - 1; b >= 0; --b) {
    if (b % 2 == 1) free_blocks_.push_back(b);
  }
  for (int b = 0; b < num_blocks; b += 2) free_blocks_.push_back(b);
  std::reverse(free_blocks_.begin(), free_blocks_.end());  // pop_back takes them in that order
}

int PagedDriver::add_sequence() {
  seqs_.emplace_back();
  return static_cast<int>(seqs_.size()) - 1;
}

Tensor PagedDriver::upload_i32(const std::vector<int32_t>& values, std::vector<int64_t> dims) {
  HostBuffer host(DType::I32, dims);
  std::copy(values.begin(), values.end(), host.ptr<int32_t>());
  step_buffers_.push_back(backend_.alloc(DType::I32, dims));
  backend_.copy(host.tensor(), step_buffers_.back().tensor());
  return step_buffers_.back().tensor();
}

std::vector<std::vector<float>> PagedDriver::step(const std::vector<Chunk>& chunks) {
  step_buffers_.clear();
  StepBatch b;
  std::vector<int32_t> ids, positions, slots, logits_rows, seq_lens, query_start = {0};
  size_t max_blocks = 1;
  for (const Chunk& c : chunks) {
    Seq& s = seqs_[c.seq];
    const int first = static_cast<int>(s.tokens.size());
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      const int pos = first + static_cast<int>(i);
      if (pos / block_size_ >= static_cast<int>(s.blocks.size())) {
        DI_CHECK(!free_blocks_.empty(), "PagedDriver: out of KV blocks");
        s.blocks.push_back(free_blocks_.back());
        free_blocks_.pop_back();
      }
      ids.push_back(c.tokens[i]);
      positions.push_back(pos);
      slots.push_back(s.blocks[pos / block_size_] * block_size_ + pos % block_size_);
      if (c.all_logits || i + 1 == c.tokens.size()) {
        logits_rows.push_back(static_cast<int32_t>(ids.size()) - 1);
      }
      s.tokens.push_back(c.tokens[i]);
    }
    query_start.push_back(static_cast<int32_t>(ids.size()));
    seq_lens.push_back(static_cast<int32_t>(s.tokens.size()));
    max_blocks = std::max(max_blocks, s.blocks.size());
    b.max_query_len = std::max(b.max_query_len, static_cast<int>(c.tokens.size()));
    b.max_seq_len = std::max(b.max_seq_len, static_cast<int>(s.tokens.size()));
  }
  std::vector<int32_t> tables(chunks.size() * max_blocks, 0);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Seq& s = seqs_[chunks[i].seq];
    std::copy(s.blocks.begin(), s.blocks.end(), tables.begin() + i * max_blocks);
  }
  const int64_t S = static_cast<int64_t>(chunks.size());
  b.num_tokens = static_cast<int>(ids.size());
  b.num_seqs = static_cast<int>(S);
  b.token_ids = upload_i32(ids, {b.num_tokens});
  b.positions = upload_i32(positions, {b.num_tokens});
  b.query_start = upload_i32(query_start, {S + 1});
  b.seq_lens = upload_i32(seq_lens, {S});
  b.block_tables = upload_i32(tables, {S, static_cast<int64_t>(max_blocks)});
  b.slot_mapping = upload_i32(slots, {b.num_tokens});
  b.logits_indices = upload_i32(logits_rows, {static_cast<int64_t>(logits_rows.size())});
  b.host_query_start = query_start;
  b.host_seq_lens = seq_lens;
  b.kv_groups.push_back({b.block_tables, b.slot_mapping});

  const int64_t R = static_cast<int64_t>(logits_rows.size()), V = model_.vocab_size();
  DeviceBuffer logits = backend_.alloc(DType::F32, {R, V});
  model_.forward(b, caches_, logits.tensor());
  HostBuffer host(DType::F32, {R, V});
  backend_.copy(logits.tensor(), host.tensor());
  backend_.synchronize();
  std::vector<std::vector<float>> rows(R);
  for (int64_t r = 0; r < R; ++r) rows[r].assign(host.ptr<float>() + r * V, host.ptr<float>() + (r + 1) * V);
  return rows;
}

}  // namespace deepinfer::test
