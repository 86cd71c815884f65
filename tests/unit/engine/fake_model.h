// FakeModel: a deterministic stand-in for a transformer that still exercises the
// paged KV cache. Each token's KV row is [token_id, position] (every layer); the
// logits of a sequence's last token are a hash of its whole context read back
// through the block table, checking every stored position. A wrong slot, block
// table or prefix-cache hit changes the logits (or throws), so engine outputs
// equal reference_greedy() only if all the KV bookkeeping is right.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/error.h"
#include "model/config.h"
#include "model/model.h"

namespace deepinfer::testing {

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class FakeModel final : public Model {
 public:
  // Broken-forward stand-ins: a context holding nan_token, or longer than nan_after_len
  // tokens, gets NaN logits (-1: never).
  explicit FakeModel(int vocab = 64, int eos = 1, int max_len = 4096, int32_t nan_token = -1,
                     int nan_after_len = -1)
      : nan_token_(nan_token), nan_after_len_(nan_after_len) {
    config_.vocab_size = vocab;
    config_.max_position_embeddings = max_len;
    config_.eos_token_ids = {eos};
  }
  const ModelConfig& config() const override { return config_; }
  std::vector<KvGroupSpec> kv_groups() const override {
    KvGroupSpec g;
    g.name = "fake";
    g.num_layers = 2;
    g.row_dim = 2;
    return {g};
  }
  int vocab_size() const override { return static_cast<int>(config_.vocab_size); }

  // Logits of the context (independent of any cache).
  static void context_logits(const std::vector<int32_t>& ctx, int vocab, float* out) {
    uint64_t h = 0x12345;
    for (int32_t t : ctx) h = mix64(h ^ static_cast<uint32_t>(t));
    for (int v = 0; v < vocab; ++v)
      out[v] = static_cast<float>(mix64(h ^ (0x1000000ull + v)) >> 40) / float(1 << 24) * 8.0f - 4.0f;
  }

  void forward(const StepBatch& b, KvCaches& kv_groups, Tensor& logits, Tensor*) override {
    std::vector<Tensor>& kv = kv_groups[0];
    const int32_t* ids = b.token_ids.ptr<int32_t>();
    const int32_t* pos = b.positions.ptr<int32_t>();
    const int32_t* slots = b.slot_mapping.ptr<int32_t>();
    for (int t = 0; t < b.num_tokens; ++t)
      for (Tensor& layer : kv) {
        float* row = layer.ptr<float>() + int64_t{slots[t]} * 2;
        row[0] = static_cast<float>(ids[t]);
        row[1] = static_cast<float>(pos[t]);
      }
    const int32_t* li = b.logits_indices.ptr<int32_t>();
    const int32_t* tables = b.block_tables.ptr<int32_t>();
    const int64_t max_blocks = b.block_tables.size(1);
    const int64_t block_size = kv[0].size(1);
    for (int64_t r = 0; r < b.logits_indices.numel(); ++r) {
      int s = 0;
      while (b.host_query_start[s + 1] <= li[r]) ++s;
      // A row of any token of the step (prompt logprobs, verify steps) is the logits of the
      // context up to that token, read back from the cache.
      const int len = b.host_seq_lens[s] - (b.host_query_start[s + 1] - 1 - li[r]);
      DI_CHECK(len >= 1 && len == pos[li[r]] + 1, "fake model: logits row ", r, " at token ", li[r],
               " has position ", pos[li[r]], ", context ", len);
      std::vector<int32_t> ctx;
      for (int p = 0; p < len; ++p) {
        int64_t slot = int64_t{tables[s * max_blocks + p / block_size]} * block_size + p % block_size;
        const float* row = kv[1].ptr<float>() + slot * 2;
        DI_CHECK(row[1] == static_cast<float>(p), "fake model: cache slot ", slot, " holds position ",
                 row[1], ", expected ", p);
        ctx.push_back(static_cast<int32_t>(row[0]));
      }
      float* out = logits.ptr<float>() + r * vocab_size();
      context_logits(ctx, vocab_size(), out);
      const bool nan = (nan_token_ >= 0 && std::find(ctx.begin(), ctx.end(), nan_token_) != ctx.end()) ||
                       (nan_after_len_ >= 0 && static_cast<int>(ctx.size()) > nan_after_len_);
      if (nan) std::fill(out, out + vocab_size(), std::numeric_limits<float>::quiet_NaN());
    }
  }

 private:
  ModelConfig config_;
  int32_t nan_token_;
  int nan_after_len_;
};

// Greedy continuation computed without the engine: the reference for every test.
inline std::vector<int32_t> reference_greedy(std::vector<int32_t> ctx, int max_tokens, int vocab,
                                             int eos, bool ignore_eos = false) {
  std::vector<int32_t> out;
  std::vector<float> logits(vocab);
  for (int i = 0; i < max_tokens; ++i) {
    FakeModel::context_logits(ctx, vocab, logits.data());
    int32_t best = 0;
    for (int v = 1; v < vocab; ++v)
      if (logits[v] > logits[best]) best = v;
    out.push_back(best);
    ctx.push_back(best);
    if (best == eos && !ignore_eos) break;
  }
  return out;
}

}  // namespace deepinfer::testing
