#include "runner/step_inputs.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace deepinfer {
namespace {
int64_t align64(int64_t n) { return (n + 63) / 64 * 64; }
}  // namespace

StepLayout StepLayout::make(int64_t num_tokens, int64_t num_seqs, int64_t num_logits,
                            int64_t max_blocks, int64_t num_groups) {
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
  l.num_groups = num_groups;
  if (num_groups > 1) {
    l.group_tables = take((num_groups - 1) * num_seqs * max_blocks);
    l.group_slots = take((num_groups - 1) * num_tokens);
  }
  l.total = at;
  return l;
}

StepLayout build_step_inputs(std::span<const RunSeq> seqs, int block_size,
                             const DecodePadding* pad, int32_t* out, int64_t capacity,
                             StepHostInfo& info, std::span<const KvGroupSpec> kv_groups) {
  const int64_t num_real = static_cast<int64_t>(seqs.size());
  const int64_t num_groups = std::max<int64_t>(1, static_cast<int64_t>(kv_groups.size()));
  auto tokens_per_row = [&](int64_t g) { return kv_groups.empty() ? 1 : kv_groups[g].tokens_per_row; };
  auto table = [&](const RunSeq& s, int64_t g) {
    return g == 0 ? s.block_ids : std::span<const int32_t>(s.more_block_ids[g - 1]);
  };
  int64_t num_tokens = 0, num_logits = 0, max_blocks = 1;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const RunSeq& s = seqs[i];
    const int64_t end = int64_t{s.num_computed} + s.num_new;
    DI_CHECK(s.num_new > 0 && s.num_computed >= 0 &&
                 end <= static_cast<int64_t>(s.token_ids.size()) &&
                 static_cast<int64_t>(s.block_ids.size()) * block_size >= end / tokens_per_row(0) &&
                 (!s.needs_logits || (s.num_logits >= 1 && s.num_logits <= s.num_new)),
             "runner: sequence ", i, " computes tokens [", s.num_computed, ", ", end, ") of ",
             s.token_ids.size(), " with ", s.block_ids.size(), " blocks of ", block_size,
             " (logits of its last ", s.num_logits, ")");
    DI_CHECK(static_cast<int64_t>(s.more_block_ids.size()) == num_groups - 1, "runner: sequence ", i,
             " has ", s.more_block_ids.size() + 1, " block tables, the model ", num_groups, " KV groups");
    for (int64_t g = 1; g < num_groups; ++g) {
      const int64_t rows = end / tokens_per_row(g);
      DI_CHECK(static_cast<int64_t>(table(s, g).size()) * block_size >= rows, "runner: sequence ", i,
               " computes tokens up to ", end, " (", rows, " rows of KV group '", kv_groups[g].name, "') with ",
               table(s, g).size(), " blocks of ", block_size);
    }
    num_tokens += s.num_new;
    num_logits += s.needs_logits ? s.num_logits : 0;
    for (int64_t g = 0; g < num_groups; ++g)
      max_blocks = std::max<int64_t>(max_blocks, static_cast<int64_t>(table(s, g).size()));
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
  const StepLayout l = StepLayout::make(num_tokens, num_seqs, num_logits, max_blocks, num_groups);
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
  if (num_groups > 1)
    std::memset(out + l.group_tables, 0, sizeof(int32_t) * static_cast<size_t>((num_groups - 1) * num_seqs * max_blocks));
  // Group g's table and slot arrays.
  auto group_tables = [&](int64_t g) { return g == 0 ? tables : out + l.group_tables + (g - 1) * num_seqs * max_blocks; };
  auto group_slots = [&](int64_t g) { return g == 0 ? slots : out + l.group_slots + (g - 1) * num_tokens; };
  // The slot of the row token p completes in group g, or -1.
  auto slot_of = [&](std::span<const int32_t> ids, int64_t g, int p) -> int32_t {
    const int n = tokens_per_row(g);
    if ((p + 1) % n != 0) return -1;
    const int row = (p + 1) / n - 1;
    return ids[row / block_size] * block_size + row % block_size;
  };
  info = StepHostInfo{};
  int64_t t = 0, r = 0;
  query_start[0] = 0;
  for (int64_t i = 0; i < num_real; ++i) {
    const RunSeq& s = seqs[i];
    const int end = s.num_computed + s.num_new;
    for (int p = s.num_computed; p < end; ++p, ++t) {
      token_ids[t] = s.token_ids[p];
      positions[t] = p;
      for (int64_t g = 0; g < num_groups; ++g) group_slots(g)[t] = slot_of(table(s, g), g, p);
    }
    for (int64_t g = 0; g < num_groups; ++g) {
      const std::span<const int32_t> ids = table(s, g);
      const int64_t width = std::min<int64_t>(max_blocks, static_cast<int64_t>(ids.size()));
      std::copy(ids.begin(), ids.begin() + width, group_tables(g) + i * max_blocks);
    }
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
      for (int64_t g = 0; g < num_groups; ++g) group_slots(g)[t] = -1;
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
  for (int64_t i = 0; i < num_real; ++i) {
    if (seqs[i].replay_floor == 0) continue;
    DI_CHECK(seqs[i].replay_floor > 0, "runner: sequence ", i, " has replay floor ", seqs[i].replay_floor);
    info.host_replay_floor.resize(static_cast<size_t>(num_seqs), 0);  // padding sequences: 0
    info.host_replay_floor[static_cast<size_t>(i)] = seqs[i].replay_floor;
  }
  return l;
}

}  // namespace deepinfer
