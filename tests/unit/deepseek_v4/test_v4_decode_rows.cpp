// The ops V4's decode steps build their addressing with on the device (backend.h), on the CPU
// reference: v4_decode_rows' rules against lists written out by hand from the rules' words,
// compressor_pool_rows against compressor_pool over the same rows laid out consecutively
// (the same bits: the decode path must give the bits of the host-built path), and the
// indexer's per-query keys against one call per query.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"

namespace deepinfer {
namespace {

using Rule = Backend::V4RowRule;
using Kind = Rule::Kind;

Tensor host_i32(std::vector<int32_t>& v, std::vector<int64_t> dims) {
  return Tensor(v.data(), DType::I32, dims, Device::CPU);
}
Tensor host_f32(std::vector<float>& v, std::vector<int64_t> dims) {
  return Tensor(v.data(), DType::F32, dims, Device::CPU);
}

// Two sequences, block size 4, 20 blocks: sequence 0's table [3, 7, 1, -1], sequence 1's [5, 2, 9,
// 0].
struct Tables {
  std::vector<int32_t> table = {3, 7, 1, -1, 5, 2, 9, 0};
  Rule rule(Kind kind, int ratio, bool overlap, int32_t fill) const {
    Rule r;
    r.kind = kind;
    r.ratio = ratio;
    r.window = 6;
    r.overlap = overlap;
    r.fill = fill;
    r.block_size = 4;
    r.num_blocks = 20;
    return r;
  }
};

std::vector<int32_t> run(Backend& be, std::vector<int32_t> keys, std::vector<int32_t>& table,
                         int64_t width, const Rule& rule, int64_t n,
                         std::vector<int32_t>* index = nullptr, std::vector<int32_t> rows_in = {}) {
  const int64_t S = static_cast<int64_t>(keys.size());
  std::vector<int32_t> out(static_cast<size_t>(S * n), 12345);
  Tensor ix;
  if (index != nullptr) {
    index->assign(static_cast<size_t>(S * n), 12345);
    ix = host_i32(*index, {S, n});
  }
  Tensor slots = host_i32(out, {S, n});
  be.v4_decode_rows(host_i32(keys, {S}), rows_in.empty() ? Tensor() : host_i32(rows_in, {S, n}),
                    host_i32(table, {static_cast<int64_t>(table.size()) / width, width}), rule,
                    slots, ix);
  return out;
}

// slot(seq, row) through the fixture's tables.
int32_t slot(const std::vector<int32_t>& table, int s, int row) {
  return table[s * 4 + row / 4] * 4 + row % 4;
}

TEST(V4DecodeRows, WindowVisibleGroupCompletedListedAndPositions) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  Tables t;
  // Window of 6: context 3 reads rows 0..2 in the last 3 slots; context 11 reads rows 5..10.
  std::vector<int32_t> index;
  Rule w = t.rule(Kind::Window, 1, false, 0);
  w.index_base = 100;
  const std::vector<int32_t> win = run(*be, {3, 11}, t.table, 4, w, 6, &index);
  const std::vector<int32_t> want_win = {0,
                                         0,
                                         0,
                                         slot(t.table, 0, 0),
                                         slot(t.table, 0, 1),
                                         slot(t.table, 0, 2),
                                         slot(t.table, 1, 5),
                                         slot(t.table, 1, 6),
                                         slot(t.table, 1, 7),
                                         slot(t.table, 1, 8),
                                         slot(t.table, 1, 9),
                                         slot(t.table, 1, 10)};
  EXPECT_EQ(win, want_win);
  EXPECT_EQ(index, (std::vector<int32_t>{-1, -1, -1, 103, 104, 105, 106, 107, 108, 109, 110, 111}));
  // Visible entries of ratio 4: context 9 sees 2 (then fill -1), context 16 sees 4.
  const std::vector<int32_t> vis =
      run(*be, {9, 16}, t.table, 4, t.rule(Kind::Visible, 4, false, -1), 5);
  EXPECT_EQ(vis, (std::vector<int32_t>{slot(t.table, 0, 0), slot(t.table, 0, 1), -1, -1, -1,
                                       slot(t.table, 1, 0), slot(t.table, 1, 1),
                                       slot(t.table, 1, 2), slot(t.table, 1, 3), -1}));
  // Overlapping groups of 2: context 4 completes group 1 (rows 0..3), context 2 group 0 (no
  // previous group: rows -2, -1 are none), context 5 none.
  const std::vector<int32_t> grp =
      run(*be, {4, 2}, t.table, 4, t.rule(Kind::Group, 2, true, -1), 4);
  EXPECT_EQ(grp, (std::vector<int32_t>{slot(t.table, 0, 0), slot(t.table, 0, 1),
                                       slot(t.table, 0, 2), slot(t.table, 0, 3), -1, -1,
                                       slot(t.table, 1, 0), slot(t.table, 1, 1)}));
  const std::vector<int32_t> none =
      run(*be, {5, 7}, t.table, 4, t.rule(Kind::Group, 2, false, -1), 2);
  EXPECT_EQ(none, (std::vector<int32_t>{-1, -1, -1, -1}));
  const std::vector<int32_t> plain =
      run(*be, {6, 4}, t.table, 4, t.rule(Kind::Group, 2, false, -1), 2);
  EXPECT_EQ(plain, (std::vector<int32_t>{slot(t.table, 0, 4), slot(t.table, 0, 5),
                                         slot(t.table, 1, 2), slot(t.table, 1, 3)}));
  // Completed entry rows and the group's first position.
  EXPECT_EQ(run(*be, {8, 7}, t.table, 4, t.rule(Kind::Completed, 4, false, -1), 1),
            (std::vector<int32_t>{slot(t.table, 0, 1), -1}));
  EXPECT_EQ(run(*be, {8, 7}, t.table, 4, t.rule(Kind::GroupStart, 4, false, 0), 1),
            (std::vector<int32_t>{4, 0}));
  // Listed rows (the indexer's choices); a row whose block is freed (-1) or missing is none.
  Rule l = t.rule(Kind::Listed, 1, false, 0);
  l.index_base = 10;
  const std::vector<int32_t> listed =
      run(*be, {30, 30}, t.table, 4, l, 3, &index, {2, -1, 13, 9, 0, 17});
  EXPECT_EQ(listed, (std::vector<int32_t>{slot(t.table, 0, 2), 0, 0, slot(t.table, 1, 9),
                                          slot(t.table, 1, 0), 0}));
  EXPECT_EQ(index, (std::vector<int32_t>{10, -1, -1, 13, 14, -1}));
}

TEST(V4DecodeRows, TableRowsGatherTid2eidRowsAndBadArgumentsAreNamed) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::vector<int32_t> tid2eid = {0, 1, 2, 3, 4, 5, 6, 7};  // [4 tokens, 2 experts]
  Rule r;
  r.kind = Kind::TableRows;
  r.fill = 0;
  EXPECT_EQ(run(*be, {3, 0, 2}, tid2eid, 2, r, 2), (std::vector<int32_t>{6, 7, 0, 1, 4, 5}));
  Tables t;
  try {
    run(*be, {4, 4}, t.table, 4, t.rule(Kind::Group, 2, true, -1), 3);
    FAIL() << "a Group list of the wrong length was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("v4_decode_rows"), std::string::npos) << e.what();
  }
}

// compressor_pool_rows over rows listed out of order in a table equals compressor_pool over
// them laid out consecutively, bit for bit (overlapping with a first group that has no
// previous one, and plain).
TEST(V4DecodeRows, CompressorPoolRowsEqualsCompressorPoolBits) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (bool overlap : {true, false}) {
    const int64_t r = 4, D = 6, C = overlap ? 2 * D : D, R = 40, width = C + 3 + C;
    std::vector<float> table(static_cast<size_t>(R * width)), ape(static_cast<size_t>(r * C));
    for (float& x : table) x = nd(rng);
    for (float& x : ape) x = nd(rng);
    // Groups: [0, 1] consecutive in the reference; listed rows scattered through the table.
    const std::vector<int32_t> order = {17, 3, 29, 8, 0, 33, 12, 21};
    std::vector<float> kv, gate;
    for (int32_t row : order) {
      kv.insert(kv.end(), table.begin() + row * width, table.begin() + row * width + C);
      gate.insert(gate.end(), table.begin() + row * width + C + 3,
                  table.begin() + row * width + 2 * C + 3);
    }
    std::vector<float> want(static_cast<size_t>(2 * D)), got(static_cast<size_t>(3 * D), 1.0f);
    Tensor wt = host_f32(want, {2, D}), apet = host_f32(ape, {r, C});
    be->compressor_pool(host_f32(kv, {8, C}), host_f32(gate, {8, C}), apet, static_cast<int>(r),
                        overlap, Tensor(), Tensor(), wt);
    // Window 0 (no previous group), window 1 (group 0 before it), window 2 (no slot: zeros).
    std::vector<int32_t> ids;
    if (overlap) {
      ids = {-1, -1, -1, -1, 17, 3, 29, 8, 17, 3, 29, 8, 0, 33, 12, 21};
    } else {
      ids = {17, 3, 29, 8, 0, 33, 12, 21};
    }
    ids.resize(ids.size() + static_cast<size_t>(overlap ? 2 * r : r), -1);
    Tensor all = host_f32(table, {R, width});
    Tensor kvv = all, gv = all;
    kvv.shape[1] = C;
    gv.data = table.data() + C + 3;
    gv.shape[1] = C;
    Tensor gt = host_f32(got, {3, D});
    be->compressor_pool_rows(kvv, gv, apet, host_i32(ids, {3, overlap ? 2 * r : r}),
                             static_cast<int>(r), overlap, gt);
    EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
        << (overlap ? "overlap" : "plain");
    EXPECT_EQ(std::vector<float>(got.begin() + 2 * D, got.end()),
              std::vector<float>(static_cast<size_t>(D), 0.0f));
  }
}

// Keys [T, S, d]: query t scores its own keys, as a call per query with keys [S, d] does.
TEST(V4DecodeRows, IndexerTopkWithPerQueryKeysEqualsOneCallPerQuery) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  const int64_t T = 3, heads = 2, d = 8, S = 12, k = 4;
  std::vector<float> q(T * heads * d), keys(T * S * d), w(T * heads);
  for (float& x : q) x = nd(rng);
  for (float& x : keys) x = nd(rng);
  for (float& x : w) x = nd(rng);
  std::vector<int32_t> pos = {47, 9, 30};
  std::vector<int32_t> got(T * k);
  Tensor gt = host_i32(got, {T, k});
  be->indexer_topk(host_f32(q, {T, heads, d}), host_f32(keys, {T, S, d}), host_f32(w, {T, heads}),
                   host_i32(pos, {T}), 4, 0.25f, 0.5f, gt);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> qt(q.begin() + t * heads * d, q.begin() + (t + 1) * heads * d);
    std::vector<float> kt(keys.begin() + t * S * d, keys.begin() + (t + 1) * S * d);
    std::vector<float> wt(w.begin() + t * heads, w.begin() + (t + 1) * heads);
    std::vector<int32_t> pt = {pos[static_cast<size_t>(t)]}, one(k);
    Tensor ot = host_i32(one, {1, k});
    be->indexer_topk(host_f32(qt, {1, heads, d}), host_f32(kt, {S, d}), host_f32(wt, {1, heads}),
                     host_i32(pt, {1}), 4, 0.25f, 0.5f, ot);
    EXPECT_EQ(one, std::vector<int32_t>(got.begin() + t * k, got.begin() + (t + 1) * k))
        << "query " << t;
  }
}

}  // namespace
}  // namespace deepinfer
