#include "paged_driver.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace deepinfer::test {

PagedDriver::PagedDriver(Model& model, Backend& backend, int block_size, int num_blocks)
    : model_(model), backend_(backend), block_size_(block_size), num_blocks_(num_blocks),
      groups_(model.kv_groups()) {
  // Group 0 hands out odd ids descending, then even ids ascending; group g > 0 the mirror
  // image (id b of group 0's order is num_blocks - 1 - b there).
  std::vector<int32_t> order;
  for (int b = num_blocks - 1; b >= 0; --b) {
    if (b % 2 == 1) order.push_back(b);
  }
  for (int b = 0; b < num_blocks; b += 2) order.push_back(b);
  std::reverse(order.begin(), order.end());  // pop_back takes them in that order
  for (size_t g = 0; g < groups_.size(); ++g) {
    const KvGroupSpec& spec = groups_[g];
    caches_.emplace_back();
    for (int l = 0; l < spec.num_layers; ++l) {
      cache_buffers_.push_back(backend.alloc(spec.row_dtype(backend.activation_dtype()),
                                             {num_blocks, block_size, spec.row_dim}));
      caches_.back().push_back(cache_buffers_.back().tensor());
    }
    std::vector<int32_t>& free = free_blocks_.emplace_back(order);
    if (g > 0)
      for (int32_t& b : free) b = num_blocks - 1 - b;
  }
}

int PagedDriver::add_sequence() {
  seqs_.emplace_back();
  seqs_.back().blocks.resize(groups_.size());
  return static_cast<int>(seqs_.size()) - 1;
}

namespace {

void fill_nan_rows(Backend& backend, Tensor dst) {
  HostBuffer nan(dst.dtype, dst.dims());
  if (dst.dtype == DType::F32) {
    std::fill(nan.ptr<float>(), nan.ptr<float>() + dst.numel(), std::numeric_limits<float>::quiet_NaN());
  } else if (dst.dtype == DType::BF16) {
    std::fill(nan.ptr<uint16_t>(), nan.ptr<uint16_t>() + dst.numel(), uint16_t{0x7fc0});
  } else {
    std::memset(nan.ptr<uint8_t>(), 0xff, dst.num_bytes());
  }
  backend.copy(nan.tensor(), dst);
}

}  // namespace

void PagedDriver::fill_nan() {
  for (auto& group : caches_)
    for (Tensor& layer : group) fill_nan_rows(backend_, layer);
  backend_.synchronize();
}

void PagedDriver::free_block(int g, int32_t block) {
  // NaN over every layer's rows of the block, then first in line to be taken again.
  for (Tensor& layer : caches_[static_cast<size_t>(g)]) fill_nan_rows(backend_, layer.row(block));
  backend_.synchronize();
  free_blocks_[static_cast<size_t>(g)].push_back(block);
}

void PagedDriver::release(int seq) {
  Seq& s = seqs_[seq];
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (int32_t b : s.blocks[g])
      if (b >= 0) free_block(static_cast<int>(g), b);
    s.blocks[g].clear();
  }
  s.tokens.clear();
}

int PagedDriver::held_blocks(int seq, int g) const {
  const std::vector<int32_t>& ids = seqs_[seq].blocks[static_cast<size_t>(g)];
  return static_cast<int>(std::count_if(ids.begin(), ids.end(), [](int32_t b) { return b >= 0; }));
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
  const size_t num_groups = groups_.size();
  StepBatch b;
  std::vector<int32_t> ids, positions, logits_rows, seq_lens, query_start = {0}, floors;
  std::vector<std::vector<int32_t>> slots(num_groups);
  size_t max_blocks = 1;
  for (const Chunk& c : chunks) {
    Seq& s = seqs_[c.seq];
    const int first = static_cast<int>(s.tokens.size());
    for (size_t g = 0; g < num_groups; ++g) {
      const KvGroupSpec& spec = groups_[g];
      std::vector<int32_t>& table = s.blocks[g];
      if (spec.window > 0) {  // blocks no query from `first` on reads
        const int keep = std::max(first - spec.window + 1, 0) / block_size_;
        for (int i = 0; i < std::min(keep, static_cast<int>(table.size())); ++i) {
          if (table[i] < 0) continue;
          free_block(static_cast<int>(g), table[i]);
          table[i] = -1;
        }
      }
    }
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      const int pos = first + static_cast<int>(i);
      for (size_t g = 0; g < num_groups; ++g) {
        const int n = groups_[g].tokens_per_row;
        std::vector<int32_t>& table = s.blocks[g];
        if ((pos + 1) % n != 0) {
          slots[g].push_back(-1);
          continue;
        }
        const int row = (pos + 1) / n - 1;
        if (row / block_size_ >= static_cast<int>(table.size())) {
          std::vector<int32_t>& free = free_blocks_[g];
          DI_CHECK(!free.empty(), "PagedDriver: out of KV blocks in group '", groups_[g].name, "'");
          table.push_back(free.back());
          free.pop_back();
        }
        slots[g].push_back(table[row / block_size_] * block_size_ + row % block_size_);
      }
      ids.push_back(c.tokens[i]);
      positions.push_back(pos);
      if (c.logits && (c.all_logits || i + 1 == c.tokens.size())) {
        logits_rows.push_back(static_cast<int32_t>(ids.size()) - 1);
      }
      s.tokens.push_back(c.tokens[i]);
    }
    query_start.push_back(static_cast<int32_t>(ids.size()));
    floors.push_back(c.replay_floor);
    seq_lens.push_back(static_cast<int32_t>(s.tokens.size()));
    for (size_t g = 0; g < num_groups; ++g) max_blocks = std::max(max_blocks, s.blocks[g].size());
    b.max_query_len = std::max(b.max_query_len, static_cast<int>(c.tokens.size()));
    b.max_seq_len = std::max(b.max_seq_len, static_cast<int>(s.tokens.size()));
  }
  const int64_t S = static_cast<int64_t>(chunks.size());
  b.num_tokens = static_cast<int>(ids.size());
  b.num_seqs = static_cast<int>(S);
  b.token_ids = upload_i32(ids, {b.num_tokens});
  b.positions = upload_i32(positions, {b.num_tokens});
  b.query_start = upload_i32(query_start, {S + 1});
  b.seq_lens = upload_i32(seq_lens, {S});
  b.logits_indices = upload_i32(logits_rows, {static_cast<int64_t>(logits_rows.size())});
  b.host_query_start = query_start;
  b.host_seq_lens = seq_lens;
  if (std::any_of(floors.begin(), floors.end(), [](int32_t f) { return f != 0; }))
    b.host_replay_floor = floors;
  for (size_t g = 0; g < num_groups; ++g) {
    std::vector<int32_t> tables(chunks.size() * max_blocks, 0);
    for (size_t i = 0; i < chunks.size(); ++i) {
      const std::vector<int32_t>& t = seqs_[chunks[i].seq].blocks[g];
      std::copy(t.begin(), t.end(), tables.begin() + i * max_blocks);
    }
    b.kv_groups.push_back({upload_i32(tables, {S, static_cast<int64_t>(max_blocks)}),
                           upload_i32(slots[g], {b.num_tokens})});
  }
  b.block_tables = b.kv_groups[0].block_tables;
  b.slot_mapping = b.kv_groups[0].slot_mapping;

  const int64_t R = static_cast<int64_t>(logits_rows.size()), V = model_.vocab_size();
  DeviceBuffer logits = backend_.alloc(DType::F32, {R, V});
  if (capture_hidden) {
    const int64_t T = static_cast<int64_t>(ids.size()), C = model_.mtp_hidden_size();
    DeviceBuffer hidden = backend_.alloc(DType::F32, {T, C});
    Tensor h = hidden.tensor();
    model_.forward(b, caches_, logits.tensor(), &h);
    HostBuffer hh(DType::F32, {T, C});
    backend_.copy(h, hh.tensor());
    backend_.synchronize();
    last_hidden.assign(hh.ptr<float>(), hh.ptr<float>() + T * C);
  } else {
    model_.forward(b, caches_, logits.tensor());
  }
  HostBuffer host(DType::F32, {R, V});
  backend_.copy(logits.tensor(), host.tensor());
  backend_.synchronize();
  std::vector<std::vector<float>> rows(R);
  for (int64_t r = 0; r < R; ++r) rows[r].assign(host.ptr<float>() + r * V, host.ptr<float>() + (r + 1) * V);
  return rows;
}

}  // namespace deepinfer::test
