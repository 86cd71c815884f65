#include "runner/step_inputs.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace deepinfer {
namespace {
int64_t align64(int64_t n) { return (n + 63) / 64 * 64; }
}  // namespace

StepLayout StepLayout::make(int64_t num_tokens, int64_t num_seqs, int64_t num_logits,
                            int64_t max_blocks) {
  StepLayout l;
  l.num_tokens = num_tokens;
  l.num_seqs = num_seqs;
  l.num_logits = num_logits;
  l.max_blocks = max_blocks;
  int64_t at = 0;
  auto take = [&at](int64_t n) {
    const int64_t off = at;
    at += align64(n);
    return off;
  };
  l.token_ids = take(num_tokens);
  l.positions = take(num_tokens);
  l.slots = take(num_tokens);
  l.query_start = take(num_seqs + 1);
  l.seq_lens = take(num_seqs);
  l.logits_indices = take(num_logits);
  l.block_tables = take(num_seqs * max_blocks);
  l.total = at;
  return l;
}

StepLayout build_step_inputs(std::span<const RunSeq> seqs, int block_size,
                             const DecodePadding* pad, int32_t* out, int64_t capacity,
                             StepHostInfo& info) {
  const int64_t num_real = static_cast<int64_t>(seqs.size());
  int64_t num_tokens = 0, num_logits = 0, max_blocks = 1;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const RunSeq& s = seqs[i];
    const int64_t end = int64_t{s.num_computed} + s.num_new;
    DI_CHECK(s.num_new > 0 && s.num_computed >= 0 &&
                 end <= static_cast<int64_t>(s.token_ids.size()) &&
                 static_cast<int64_t>(s.block_ids.size()) * block_size >= end &&
                 (!s.needs_logits || (s.num_logits >= 1 && s.num_logits <= s.num_new)),
             "runner: sequence ", i, " computes tokens [", s.num_computed, ", ", end, ") of ",
             s.token_ids.size(), " with ", s.block_ids.size(), " blocks of ", block_size,
             " (logits of its last ", s.num_logits, ")");
    num_tokens += s.num_new;
    num_logits += s.needs_logits ? s.num_logits : 0;
    max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(s.block_ids.size()));
  }
  const int64_t num_seqs = pad ? pad->num_seqs : num_real;
  if (pad) {
    const int q = pad->tokens_per_seq;
    bool uniform = q >= 1 && pad->num_seqs >= num_real;
    for (const RunSeq& s : seqs) uniform = uniform && s.num_new == q && s.needs_logits && s.num_logits == q;
    DI_CHECK(uniform, "runner: a padded step needs ", q, " new tokens with logits for each of its ",
             num_real, " sequences (padded to ", pad->num_seqs, ")");
    num_tokens = num_logits = num_seqs * q;
    max_blocks = pad->max_blocks;
  }
  const StepLayout l = StepLayout::make(num_tokens, num_seqs, num_logits, max_blocks);
  DI_CHECK(l.total <= capacity, "runner: step of ", num_tokens, " tokens, ", num_seqs,
           " sequences and block tables of width ", max_blocks, " needs ", l.total,
           " input entries, the step buffer holds ", capacity);

  int32_t* token_ids = out + l.token_ids;
  int32_t* positions = out + l.positions;
  int32_t* slots = out + l.slots;
  int32_t* query_start = out + l.query_start;
  int32_t* seq_lens = out + l.seq_lens;
  int32_t* logits_indices = out + l.logits_indices;
  int32_t* tables = out + l.block_tables;
  std::memset(tables, 0, sizeof(int32_t) * static_cast<size_t>(num_seqs * max_blocks));
  info = StepHostInfo{};
  int64_t t = 0, r = 0;
  query_start[0] = 0;
  for (int64_t i = 0; i < num_real; ++i) {
    const RunSeq& s = seqs[i];
    const int end = s.num_computed + s.num_new;
    for (int p = s.num_computed; p < end; ++p, ++t) {
      token_ids[t] = s.token_ids[p];
      positions[t] = p;
      slots[t] = s.block_ids[p / block_size] * block_size + p % block_size;
    }
    const int64_t width = std::min<int64_t>(max_blocks, static_cast<int64_t>(s.block_ids.size()));
    std::copy(s.block_ids.begin(), s.block_ids.begin() + width, tables + i * max_blocks);
    query_start[i + 1] = static_cast<int32_t>(t);
    seq_lens[i] = end;
    if (s.needs_logits)
      for (int j = s.num_logits; j >= 1; --j) logits_indices[r++] = static_cast<int32_t>(t - j);
    info.max_query_len = std::max(info.max_query_len, s.num_new);
    info.max_seq_len = std::max(info.max_seq_len, end);
  }
  const int q = pad ? pad->tokens_per_seq : 1;
  for (int64_t i = num_real; i < num_seqs; ++i) {  // padding sequences
    for (int p = 0; p < q; ++p, ++t) {
      token_ids[t] = 0;
      positions[t] = p;
      slots[t] = -1;
      logits_indices[r++] = static_cast<int32_t>(t);
    }
    query_start[i + 1] = static_cast<int32_t>(t);
    seq_lens[i] = q;
  }
  if (pad) {
    DI_CHECK(info.max_seq_len <= pad->max_seq_len, "runner: step context ", info.max_seq_len,
             " exceeds the graph's bound ", pad->max_seq_len);
    info.max_query_len = q;
    info.max_seq_len = pad->max_seq_len;
  }
  info.host_query_start.assign(query_start, query_start + num_seqs + 1);
  info.host_seq_lens.assign(seq_lens, seq_lens + num_seqs);
  return l;
}

}  // namespace deepinfer
