// GroupedFakeModel: FakeModel's deterministic logits over a KV state of four layer groups
// (kv/kv_groups.h), the shapes V3.2 and V4 need:
//   0 "latent"      2 layers, row [token, position]                         one row per token
//   1 "keys"        1 layer,  row [token, position, 7 * token + position]   another width (V3.2's indexer keys)
//   2 "compressed"  1 layer,  row [sum of its 4 tokens, row index]          one row per 4 tokens (V4 CSA)
//   3 "window"      1 layer,  row [token, position]                         sliding window of 8 tokens
// Each token's rows go to the slots of every group's slot_mapping; a compressed row is made
// from the tokens of its group read back through group 0 (as V4 folds its pending tokens).
// The logits of a sequence's last token are FakeModel's hash of the context read from
// group 0, after every other group's rows that a query there would read are checked
// against it (all of "keys", every completed row of "compressed", the last 8 positions of
// "window"): a wrong table, slot, freed block or prefix hit in any group throws.
#pragma once
#include <string>
#include <vector>

#include "fake_model.h"

namespace deepinfer::testing {

class GroupedFakeModel final : public Model {
 public:
  static constexpr int kRatio = 4, kWindow = 8;
  explicit GroupedFakeModel(int vocab = 64, int eos = 1, int max_len = 4096) {
    config_.vocab_size = vocab;
    config_.max_position_embeddings = max_len;
    config_.eos_token_ids = {eos};
  }
  const ModelConfig& config() const override { return config_; }
  int vocab_size() const override { return static_cast<int>(config_.vocab_size); }
  std::vector<KvGroupSpec> kv_groups() const override {
    auto group = [](std::string name, int layers, int row, int tokens_per_row, int window) {
      KvGroupSpec g;
      g.name = std::move(name);
      g.num_layers = layers;
      g.row_dim = row;
      g.tokens_per_row = tokens_per_row;
      g.window = window;
      return g;
    };
    return {group("latent", 2, 2, 1, 0), group("keys", 1, 3, 1, 0), group("compressed", 1, 2, kRatio, 0),
            group("window", 1, 2, 1, kWindow)};
  }
  int64_t num_forwards = 0;

  void forward(const StepBatch& b, KvCaches& kv, Tensor& logits, Tensor*) override {
    ++num_forwards;
    DI_CHECK(kv.size() == 4 && b.kv_groups.size() == 4, "grouped fake model: ", kv.size(), " caches, ",
             b.kv_groups.size(), " group tables");
    const int32_t* ids = b.token_ids.ptr<int32_t>();
    const int32_t* pos = b.positions.ptr<int32_t>();
    const int64_t bs = kv[0][0].size(1);
    auto slots = [&](int g) { return b.kv_groups[g].slot_mapping.ptr<int32_t>(); };
    auto row_at = [&](int g, int layer, int64_t slot) {
      const Tensor& c = kv[g][layer];
      DI_CHECK(slot >= 0 && slot < c.size(0) * bs, "grouped fake model: slot ", slot, " outside group ", g);
      return c.ptr<float>() + slot * c.size(2);
    };
    // The slot of row r of step sequence s in group g (through its block table).
    auto slot_of = [&](int g, int s, int64_t r) {
      const Tensor& t = b.kv_groups[g].block_tables;
      const int32_t block = t.ptr<int32_t>()[s * t.size(1) + r / bs];
      DI_CHECK(block >= 0, "grouped fake model: group ", g, " reads freed block ", r / bs, " of sequence ", s);
      return int64_t{block} * bs + r % bs;
    };
    auto seq_of = [&](int t) {
      int s = 0;
      while (b.host_query_start[s + 1] <= t) ++s;
      return s;
    };
    for (int t = 0; t < b.num_tokens; ++t) {
      for (int l = 0; l < 2; ++l) {
        float* r = row_at(0, l, slots(0)[t]);
        r[0] = static_cast<float>(ids[t]);
        r[1] = static_cast<float>(pos[t]);
      }
      float* k = row_at(1, 0, slots(1)[t]);
      k[0] = static_cast<float>(ids[t]);
      k[1] = static_cast<float>(pos[t]);
      k[2] = static_cast<float>(7 * ids[t] + pos[t]);
      float* w = row_at(3, 0, slots(3)[t]);
      w[0] = static_cast<float>(ids[t]);
      w[1] = static_cast<float>(pos[t]);
    }
    for (int t = 0; t < b.num_tokens; ++t) {  // group 0 holds the whole step now
      const bool ends_group = (pos[t] + 1) % kRatio == 0;
      DI_CHECK((slots(2)[t] >= 0) == ends_group, "grouped fake model: compressed slot ", slots(2)[t],
               " at position ", pos[t]);
      if (!ends_group) continue;
      const int s = seq_of(t);
      float sum = 0;
      for (int p = pos[t] + 1 - kRatio; p <= pos[t]; ++p) sum += row_at(0, 1, slot_of(0, s, p))[0];
      float* c = row_at(2, 0, slots(2)[t]);
      c[0] = sum;
      c[1] = static_cast<float>((pos[t] + 1) / kRatio - 1);
    }
    const int32_t* li = b.logits_indices.ptr<int32_t>();
    for (int64_t r = 0; r < b.logits_indices.numel(); ++r) {
      const int s = seq_of(li[r]);
      DI_CHECK(li[r] == b.host_query_start[s + 1] - 1, "grouped fake model: logits row is not a last token");
      const int n = b.host_seq_lens[s];
      std::vector<int32_t> ctx;
      for (int p = 0; p < n; ++p) {
        const float* row = row_at(0, 1, slot_of(0, s, p));
        DI_CHECK(row[1] == static_cast<float>(p), "grouped fake model: latent slot holds position ", row[1],
                 ", expected ", p);
        ctx.push_back(static_cast<int32_t>(row[0]));
        const float* k = row_at(1, 0, slot_of(1, s, p));
        DI_CHECK(k[0] == row[0] && k[1] == row[1] && k[2] == 7 * row[0] + row[1],
                 "grouped fake model: keys row of position ", p, " is wrong");
        if (p >= n - kWindow) {
          const float* w = row_at(3, 0, slot_of(3, s, p));
          DI_CHECK(w[0] == row[0] && w[1] == row[1], "grouped fake model: window row of position ", p,
                   " holds [", w[0], ", ", w[1], "]");
        }
      }
      for (int c = 0; c < n / kRatio; ++c) {
        float sum = 0;
        for (int p = c * kRatio; p < (c + 1) * kRatio; ++p) sum += static_cast<float>(ctx[p]);
        const float* row = row_at(2, 0, slot_of(2, s, c));
        DI_CHECK(row[0] == sum && row[1] == static_cast<float>(c), "grouped fake model: compressed row ", c,
                 " holds [", row[0], ", ", row[1], "], expected [", sum, ", ", c, "]");
      }
      FakeModel::context_logits(ctx, vocab_size(), logits.ptr<float>() + r * vocab_size());
    }
  }

 private:
  ModelConfig config_;
};

}  // namespace deepinfer::testing
