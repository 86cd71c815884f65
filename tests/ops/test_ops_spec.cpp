// Parity of speculative decoding's device fix-ups (Backend::spec_accept, spec_select_rows,
// spec_shift): the CUDA kernels against the CPU reference (backend/cpu/spec_fixup.cpp). They
// are integer ops: results must be equal exactly. Outputs are poisoned and guarded; odd
// sequence counts, NaN-row ids (negative), padding sequences that must stay untouched, and
// the batch-invariant backend too.
#include "tests/ops/parity.h"

namespace deepinfer::ops_test {
namespace {

class SpecOps : public Parity {
 protected:
  std::vector<int32_t> host_of(Backend& b, const Tensor& t) {
    std::vector<int32_t> v(static_cast<size_t>(t.numel()));
    Tensor h(v.data(), DType::I32, {t.numel()});
    b.copy(t, h);
    return v;
  }
  // ids / tokens of a verify step of S sequences x q tokens: drafts accepted for a random
  // prefix, some rows without a token (-1), some drafts equal to a later id only.
  void verify_step(int64_t S, int q, std::vector<int32_t>& ids, std::vector<int32_t>& tokens) {
    ids.assign(static_cast<size_t>(S * q), 0);
    tokens.assign(static_cast<size_t>(S * q), 0);
    for (int64_t s = 0; s < S; ++s) {
      const int keep = randint(0, q - 1);
      for (int j = 0; j < q; ++j) {
        ids[s * q + j] = randint(0, 50);
        tokens[s * q + j] = randint(0, 50);
      }
      for (int j = 0; j < keep; ++j) tokens[s * q + 1 + j] = ids[s * q + j];
      if (randint(0, 5) == 0) ids[s * q + randint(0, q - 1)] = -1;                 // NaN row
      if (randint(0, 5) == 0 && q > 1) tokens[s * q + 1] = ids[s * q] = -1;        // -1 == -1 is no match
    }
  }
};

TEST_F(SpecOps, AcceptAndSelectMatchReference) {
  for (Backend* gpu : {gpu_.get(), gpu_inv_.get()}) {
    for (int64_t S : {1, 5, 67, 256}) {
      for (int q : {1, 2, 4, 6, 17}) {
        std::vector<int32_t> ids, tokens;
        verify_step(S, q, ids, tokens);
        Tensor ic = cpu_i32(ids, {S * q}), tc = cpu_i32(tokens, {S * q});
        Tensor ac = cpu_i32(std::vector<int32_t>(S, -9), {S}), lc = cpu_i32(std::vector<int32_t>(S, -9), {S});
        cpu_->spec_accept(ic, tc, q, ac, lc);
        Tensor ig = gpu_copy(*gpu, ic), tg = gpu_copy(*gpu, tc);
        Tensor ag = gpu_guarded(*gpu, DType::I32, {S}), lg = gpu_guarded(*gpu, DType::I32, {S});
        gpu->spec_accept(ig, tg, q, ag, lg);
        const std::string what = "S " + std::to_string(S) + " q " + std::to_string(q) + " seed " + std::to_string(seed_);
        EXPECT_EQ(host_of(*gpu, ag), std::vector<int32_t>(ac.ptr<int32_t>(), ac.ptr<int32_t>() + S)) << what;
        EXPECT_EQ(host_of(*gpu, lg), std::vector<int32_t>(lc.ptr<int32_t>(), lc.ptr<int32_t>() + S)) << what;
        // Row selection from the accepted counts just computed (MTP rows: q per sequence).
        Tensor oc = cpu_i32(std::vector<int32_t>(S, -9), {S}), rc = cpu_i32(std::vector<int32_t>(S, -9), {S});
        cpu_->spec_select_rows(ic, ac, q, oc, rc);
        Tensor og = gpu_guarded(*gpu, DType::I32, {S}), rg = gpu_guarded(*gpu, DType::I32, {S});
        gpu->spec_select_rows(ig, ag, q, og, rg);
        EXPECT_EQ(host_of(*gpu, og), std::vector<int32_t>(oc.ptr<int32_t>(), oc.ptr<int32_t>() + S)) << what;
        EXPECT_EQ(host_of(*gpu, rg), std::vector<int32_t>(rc.ptr<int32_t>(), rc.ptr<int32_t>() + S)) << what;
        expect_guards_intact(what);
      }
    }
  }
}

TEST_F(SpecOps, ShiftMatchesReference) {
  constexpr int kBlockSize = 16;
  for (Backend* gpu : {gpu_.get(), gpu_inv_.get()}) {
    for (int64_t S : {1, 3, 67, 256}) {
      for (int q : {1, 2, 4, 17}) {
        const int assumed = randint(0, 5), pad = randint(0, 3), width = 9;
        const int64_t S_all = S + pad, T = S_all * q, R = S * q;
        std::vector<int32_t> accepted(S), qs(S_all + 1), pos(T), slots(T), lens(S_all), tables(S_all * width);
        std::vector<int32_t> first(S), drafts;
        const int num_drafts = q - 1, stride = static_cast<int>(S) + randint(0, 4);
        for (int64_t s = 0; s < S; ++s) accepted[s] = randint(0, assumed), first[s] = randint(0, 1000);
        for (int i = 0; i < num_drafts * stride; ++i) drafts.push_back(randint(0, 1000));
        for (int32_t& b : tables) b = randint(0, 500);  // scattered blocks
        for (int64_t s = 0; s < S_all; ++s) {
          qs[s + 1] = static_cast<int32_t>((s + 1) * q);
          const int32_t end = randint(q + assumed, width * kBlockSize);
          lens[s] = end;
          for (int j = 0; j < q; ++j) {
            pos[s * q + j] = end - q + j;
            slots[s * q + j] = randint(0, 7) == 0 ? -1 : 12345;  // -1: not stored, stays
          }
        }
        std::vector<int32_t> params(static_cast<size_t>(R * kSampleRowWords));
        for (int32_t& w : params) w = randint(-100000, 100000);
        for (int64_t r = 0; r < R; ++r) params[r * kSampleRowWords + 9] = randint(0, 2) - 1;  // position's high word
        std::vector<int32_t> tokens(T, 7);
        auto make = [&](auto&& tensor) {
          SpecShift f;
          f.accepted = tensor(accepted, std::vector<int64_t>{S});
          f.assumed = assumed;
          f.query_start = tensor(qs, std::vector<int64_t>{S_all + 1});
          f.positions = tensor(pos, std::vector<int64_t>{T});
          f.slots = tensor(slots, std::vector<int64_t>{T});
          f.seq_lens = tensor(lens, std::vector<int64_t>{S_all});
          f.block_tables = tensor(tables, std::vector<int64_t>{S_all, width});
          f.block_size = kBlockSize;
          f.tokens = tensor(tokens, std::vector<int64_t>{T});
          f.first_tokens = tensor(first, std::vector<int64_t>{S});
          if (num_drafts > 0) f.drafts = tensor(drafts, std::vector<int64_t>{num_drafts, stride});
          f.num_drafts = num_drafts;
          f.drafts_stride = stride;
          f.sample_params = tensor(params, std::vector<int64_t>{R, kSampleRowWords});
          f.rows_per_seq = q;
          return f;
        };
        const SpecShift c = make([&](const std::vector<int32_t>& v, std::vector<int64_t> d) { return cpu_i32(v, d); });
        cpu_->spec_shift(c);
        const SpecShift g = make([&](const std::vector<int32_t>& v, std::vector<int64_t> d) {
          return gpu_copy(*gpu, cpu_i32(v, d));
        });
        gpu->spec_shift(g);
        const std::string what = "S " + std::to_string(S) + " q " + std::to_string(q) + " assumed " +
                                 std::to_string(assumed) + " seed " + std::to_string(seed_);
        for (auto [name, ct, gt] : {std::tuple{"positions", &c.positions, &g.positions},
                                    std::tuple{"slots", &c.slots, &g.slots},
                                    std::tuple{"seq_lens", &c.seq_lens, &g.seq_lens},
                                    std::tuple{"tokens", &c.tokens, &g.tokens},
                                    std::tuple{"sample_params", &c.sample_params, &g.sample_params}})
          EXPECT_EQ(host_of(*gpu, *gt), std::vector<int32_t>(ct->ptr<int32_t>(), ct->ptr<int32_t>() + ct->numel()))
              << name << ", " << what;
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer::ops_test
