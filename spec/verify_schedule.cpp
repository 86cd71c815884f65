#include "spec/verify_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace deepinfer {

StepCost::StepCost(SpecStepTimes table) : t_(std::move(table)) {
  const size_t nb = t_.batches.size(), q = static_cast<size_t>(std::max(t_.max_tokens_per_seq, 0));
  DI_CHECK(nb > 0 && q > 0, "spec step times: ", nb, " batches and ", q, " tokens per sequence (need >= 1 each)");
  for (size_t i = 0; i < nb; ++i)
    DI_CHECK(t_.batches[i] >= 1 && (i == 0 || t_.batches[i] > t_.batches[i - 1]), "spec step times: batch ", i,
             " (", t_.batches[i], ") must be >= 1 and ascending");
  // zero_ok: a block drafter's chained passes cost nothing (its block forward drafts them all).
  auto check = [&](const std::vector<double>& v, const char* name, size_t size, bool may_be_empty,
                   bool zero_ok = false) {
    DI_CHECK((may_be_empty && v.empty()) || v.size() == size, "spec step times: ", name, " has ", v.size(),
             " entries, expected ", size);
    for (double s : v)
      DI_CHECK(std::isfinite(s) && (s > 0 || (zero_ok && s == 0)), "spec step times: ", name, " holds ", s,
               zero_ok ? " (seconds must be >= 0)" : " (seconds must be > 0)");
  };
  check(t_.verify_s, "verify_s", nb * q, false);
  check(t_.mixed_s, "mixed_s", nb, true);
  check(t_.decode_ahead_s, "decode_ahead_s", nb, true);
  check(t_.mtp_first_s, "mtp_first_s", nb, true);
  check(t_.mtp_chain_s, "mtp_chain_s", nb, true, true);
  DI_CHECK(t_.mtp_first_s.empty() == t_.mtp_chain_s.empty(), "spec step times: mtp_first_s and mtp_chain_s ",
           "come together");
}

double StepCost::at(std::span<const double> v, int num_seqs) const {
  const std::vector<int>& b = t_.batches;
  const double s = std::max(num_seqs, 1);
  if (s <= b[0]) return v[0];
  if (b.size() == 1) return v[0] * s / b[0];
  size_t hi = 1;
  while (hi + 1 < b.size() && b[hi] < s) ++hi;
  const double y = v[hi - 1] + (v[hi] - v[hi - 1]) * (s - b[hi - 1]) / (b[hi] - b[hi - 1]);
  return std::max(y, std::min(v[hi - 1], v[hi]));  // beyond the last batch: never below the measured
}

double StepCost::verify_seconds(int num_seqs, double tokens_per_seq, bool mixed) const {
  DI_CHECK(!empty(), "spec step times: empty");
  const int Q = t_.max_tokens_per_seq;
  const size_t nb = t_.batches.size();
  auto column = [&](int q) {  // seconds of q tokens per sequence at num_seqs
    std::vector<double> col(nb);
    for (size_t i = 0; i < nb; ++i) col[i] = t_.verify_s[i * static_cast<size_t>(Q) + static_cast<size_t>(q - 1)];
    return at(col, num_seqs);
  };
  const double q = std::max(tokens_per_seq, 1.0);
  double s;
  if (Q == 1) {
    s = column(1) * q;
  } else {
    const int lo = std::min(static_cast<int>(std::floor(q)), Q - 1);  // q in [lo, lo + 1] or beyond Q
    const double a = column(lo), b = column(lo + 1);
    s = std::max(a + (b - a) * (q - lo), std::min(a, b));
  }
  if (mixed && !t_.mixed_s.empty()) s += std::max(0.0, at(t_.mixed_s, num_seqs) - column(Q));
  return s;
}

double StepCost::step_seconds(std::span<const int> drafts) const {
  if (drafts.empty()) return 0.0;
  int64_t total = 0;
  bool mixed = false;
  for (int d : drafts) {
    total += d;
    mixed = mixed || d != drafts[0];
  }
  const int n = static_cast<int>(drafts.size());
  return verify_seconds(n, 1.0 + static_cast<double>(total) / n, mixed);
}

double StepCost::decode_seconds(int num_seqs, bool ahead) const {
  if (ahead && !t_.decode_ahead_s.empty()) return at(t_.decode_ahead_s, num_seqs);
  return verify_seconds(num_seqs, 1.0);
}

double StepCost::draft_seconds(int num_seqs, int depth) const {
  if (depth <= 0 || t_.mtp_first_s.empty()) return 0.0;
  return at(t_.mtp_first_s, num_seqs) + (depth - 1) * at(t_.mtp_chain_s, num_seqs);
}

int choose_draft_depth(std::span<const double> survival, int num_seqs, int max_depth, const StepCost& cost,
                       bool ahead, double min_gain) {
  max_depth = std::min(max_depth, static_cast<int>(survival.size()));
  if (cost.empty() || num_seqs <= 0 || max_depth <= 0) return std::max(max_depth, 0);
  double best = min_gain * num_seqs / cost.decode_seconds(num_seqs, ahead), tau = 1.0;
  int best_d = 0;
  for (int d = 1; d <= max_depth; ++d) {
    tau += std::clamp(survival[static_cast<size_t>(d - 1)], 0.0, 1.0);
    const double theta = num_seqs * tau / (cost.verify_seconds(num_seqs, 1.0 + d) + cost.draft_seconds(num_seqs, d));
    if (theta > best) best = theta, best_d = d;
  }
  return best_d;
}

std::vector<int> schedule_verify_lengths(std::span<const std::vector<float>> conf, const StepCost& cost) {
  const int n = static_cast<int>(conf.size());
  std::vector<int> lengths(conf.size(), 0);
  if (n == 0 || cost.empty()) {
    for (size_t r = 0; r < conf.size(); ++r) lengths[r] = static_cast<int>(conf[r].size());
    return lengths;
  }
  // cum[r][j]: expected accepted drafts of r when verifying j (sum of survivals).
  struct Item {
    double survival;
    size_t r;
  };
  std::vector<std::vector<double>> cum(conf.size());
  std::vector<Item> items;
  int max_k = 0;
  for (size_t r = 0; r < conf.size(); ++r) {
    double a = 1.0;
    cum[r].push_back(0.0);
    for (float c : conf[r]) {
      a *= std::clamp(static_cast<double>(c), 0.0, 1.0);
      cum[r].push_back(cum[r].back() + a);
      items.push_back({a, r});
    }
    max_k = std::max(max_k, static_cast<int>(conf[r].size()));
  }
  auto theta = [&](double tau, int64_t drafts, bool mixed) {
    return tau / cost.verify_seconds(n, 1.0 + static_cast<double>(drafts) / n, mixed);
  };
  // Uniform candidates: every request verifies min(l, k_r).
  double best = theta(n, 0, false);
  int best_uniform = 0;
  size_t best_admitted = 0;  // > 0: DSpark's first best_admitted admissions
  for (int l = 1; l <= max_k; ++l) {
    double tau = n;
    int64_t drafts = 0;
    bool mixed = false;
    for (size_t r = 0; r < conf.size(); ++r) {
      const int m = std::min(l, static_cast<int>(conf[r].size()));
      tau += cum[r][static_cast<size_t>(m)];
      drafts += m;
      mixed = mixed || m != l;
    }
    const double t = theta(tau, drafts, mixed);
    if (t > best) best = t, best_uniform = l;
  }
  // DSpark: admit (r, j) by descending survival (a is non-increasing in j and the sort is
  // stable, so r's admissions come in j order); the step is uniform when every request
  // has the same length.
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.survival > b.survival; });
  std::vector<int> len(conf.size(), 0), count_at(static_cast<size_t>(max_k) + 1, 0);
  count_at[0] = n;
  double tau = n;
  for (size_t i = 0; i < items.size(); ++i) {
    const size_t r = items[i].r;
    --count_at[static_cast<size_t>(len[r])];
    ++count_at[static_cast<size_t>(++len[r])];
    tau += items[i].survival;
    const double t = theta(tau, static_cast<int64_t>(i) + 1, count_at[static_cast<size_t>(len[r])] != n);
    if (t > best) best = t, best_admitted = i + 1;
  }
  if (best_admitted > 0) {
    for (size_t i = 0; i < best_admitted; ++i) ++lengths[items[i].r];
  } else {
    for (size_t r = 0; r < conf.size(); ++r) lengths[r] = std::min(best_uniform, static_cast<int>(conf[r].size()));
  }
  return lengths;
}

}  // namespace deepinfer
