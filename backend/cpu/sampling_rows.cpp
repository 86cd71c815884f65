// The sampling rule on the host (backend/sample_rule.h): sample_row, the reference of
// Backend::sample, and the default Backend::sample (copies to the host and runs it per row).
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "backend/sample_rule.h"

namespace deepinfer {
namespace sample_rule {
namespace {

struct Cand {
  uint32_t key;  // order_key(s)
  int32_t id;
  uint32_t weight;
};
// The rule's order: most likely first, lower id first on ties.
bool before(const Cand& a, const Cand& b) { return a.key > b.key || (a.key == b.key && a.id < b.id); }

bool has_nan(const float* l, int64_t vocab) {
  bool nan = false;
  for (int64_t i = 0; i < vocab; ++i) nan |= is_nan(l[i]);
  return nan;
}

int32_t argmax_row(const float* l, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (l[i] > l[best]) best = i;
  return static_cast<int32_t>(best);
}

}  // namespace

int32_t sample_row(const float* logits, int64_t vocab, const SampleRowParams& p) {
  if (has_nan(logits, vocab)) return kNoToken;
  if (is_greedy(p.temperature)) return argmax_row(logits, vocab);
  float max_s = 0.0f;
  bool any = false;
  for (int64_t v = 0; v < vocab; ++v) {
    const float s = fdiv(logits[v], p.temperature);
    if (!is_finite(s)) continue;
    if (!any || s > max_s) max_s = s;
    any = true;
  }
  if (!any) return kNoToken;
  // [candidates] in id order: finite, and e >= min_p.
  std::vector<Cand> cand;
  for (int64_t v = 0; v < vocab; ++v) {
    const float s = fdiv(logits[v], p.temperature);
    if (!is_finite(s)) continue;
    const float x = fadd(s, -max_s);
    if (p.min_p > 0.0f && !(exp_neg(x) >= p.min_p)) continue;
    cand.push_back({order_key(s), static_cast<int32_t>(v), weight(x)});
  }
  const bool top_k = p.top_k > 0 && static_cast<size_t>(p.top_k) < cand.size();
  if (top_k || p.top_p < 1.0f) {
    // The cut is a prefix of the rule's order; keep it, then restore id order for the draw.
    // Top-p alone: zero-weight candidates add no mass and the walk below stops at a candidate
    // that adds some (the first one, the max, weighs 2^26), so they cannot move the cut and are
    // never drawn: sort only the rest (a peaked row has few, a 129k-row sort was ~15 ms). With
    // top-k they keep their places in the first k, so they stay.
    std::vector<Cand> sorted;
    if (top_k) {
      sorted = cand;
    } else {
      sorted.reserve(cand.size());
      for (const Cand& c : cand)
        if (c.weight > 0) sorted.push_back(c);
    }
    size_t keep = top_k ? static_cast<size_t>(p.top_k) : sorted.size();
    if (top_k)
      std::partial_sort(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(keep),
                        sorted.end(), before);
    else
      std::sort(sorted.begin(), sorted.end(), before);
    if (p.top_p < 1.0f) {
      uint64_t total = 0;
      for (size_t i = 0; i < keep; ++i) total += sorted[i].weight;
      const uint64_t need = top_p_need(p.top_p, total);
      uint64_t mass = 0;
      size_t i = 0;
      while (i < keep) {
        mass += sorted[i++].weight;
        if (mass >= need) break;
      }
      keep = i;
    }
    const Cand last = sorted[keep - 1];
    std::erase_if(cand, [&](const Cand& c) { return before(last, c); });
  }
  uint64_t total = 0;
  for (const Cand& c : cand) total += c.weight;
  const uint64_t target = draw_target(philox_bits53(p.seed, p.stream, p.position), total);
  uint64_t cum = 0;
  for (const Cand& c : cand) {
    cum += c.weight;
    if (cum > target) return c.id;
  }
  return cand.back().id;  // unreachable: target < total
}

}  // namespace sample_rule

void Backend::sample(const Tensor& logits, const Tensor& row_params, Tensor& ids) {
  DI_CHECK(logits.ndim == 2 && logits.dtype == DType::F32 && logits.stride[1] == 1 &&
               logits.shape[1] > 0,
           "sample: logits ", logits.describe(), " must be F32 [rows, vocab > 0] with contiguous rows");
  const int64_t rows = logits.shape[0], vocab = logits.shape[1];
  DI_CHECK(row_params.dtype == DType::I32 && row_params.is_contiguous() &&
               row_params.numel() == rows * kSampleRowWords,
           "sample: row_params ", row_params.describe(), " must be contiguous I32 [", rows, ", ",
           kSampleRowWords, "] (SampleRowParams per row)");
  DI_CHECK(ids.dtype == DType::I32 && ids.is_contiguous() && ids.numel() == rows,
           "sample: ids ", ids.describe(), " must be contiguous I32 [", rows, "]");
  DI_CHECK(logits.device == device() && row_params.device == device() && ids.device == device(),
           "sample: logits, row_params and ids must live on the ", name(), " backend");
  if (rows == 0) return;
  // Off the host, bring rows and params over (the default is a reference, not fast).
  const bool on_host = device() == Device::CPU;
  std::vector<float> host_logits;
  std::vector<SampleRowParams> host_params(static_cast<size_t>(rows));
  std::vector<int32_t> host_ids(static_cast<size_t>(rows));
  const float* l = logits.ptr<float>();
  int64_t ld = logits.stride[0];
  if (on_host) {
    std::memcpy(host_params.data(), row_params.data, row_params.num_bytes());
  } else {
    host_logits.resize(static_cast<size_t>(rows * vocab));
    Tensor dst(host_logits.data(), DType::F32, {rows, vocab});
    copy(logits, dst);
    Tensor pdst(host_params.data(), DType::I32, {rows, kSampleRowWords});
    copy(row_params, pdst);
    synchronize();
    l = host_logits.data();
    ld = vocab;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t id = sample_rule::sample_row(l + r * ld, vocab, host_params[r]);
    host_ids[r] = id;  // kNoToken for a NaN row (or nothing finite to sample)
  }
  if (on_host) {
    std::memcpy(ids.data, host_ids.data(), host_ids.size() * sizeof(int32_t));
  } else {
    Tensor src(host_ids.data(), DType::I32, {rows});
    copy(src, ids);
    synchronize();
  }
}

}  // namespace deepinfer
