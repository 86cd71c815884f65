#include "spec/verify_schedule.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace deepinfer {

StepTimeTable::StepTimeTable(std::vector<int> tokens, std::vector<double> seconds)
    : tokens_(std::move(tokens)), seconds_(std::move(seconds)) {
  DI_CHECK(!tokens_.empty() && tokens_.size() == seconds_.size(), "step time table: ", tokens_.size(),
           " token counts and ", seconds_.size(), " times");
  for (size_t i = 0; i < tokens_.size(); ++i) {
    DI_CHECK(tokens_[i] >= 1 && seconds_[i] > 0 && (i == 0 || tokens_[i] > tokens_[i - 1]),
             "step time table: entry ", i, " (", tokens_[i], " tokens, ", seconds_[i],
             " s) must have tokens >= 1 ascending and time > 0");
  }
}

double StepTimeTable::seconds(int tokens) const {
  DI_CHECK(!tokens_.empty(), "step time table: empty");
  if (tokens_.size() == 1) return seconds_[0] * std::max(1.0, static_cast<double>(tokens) / tokens_[0]);
  size_t hi = 1;
  while (hi + 1 < tokens_.size() && tokens_[hi] < tokens) ++hi;
  if (tokens <= tokens_[0]) return seconds_[0];
  const double t0 = tokens_[hi - 1], t1 = tokens_[hi];
  const double s = seconds_[hi - 1] + (seconds_[hi] - seconds_[hi - 1]) * (tokens - t0) / (t1 - t0);
  return std::max(s, seconds_[0]);
}

std::vector<int> schedule_verify_lengths(std::span<const std::vector<float>> conf, const StepTimeTable& table) {
  struct Item {
    double survival;
    size_t r;
    int j;
  };
  std::vector<Item> items;
  int tokens = 0;
  double tau = 0.0;
  for (size_t r = 0; r < conf.size(); ++r) {
    double a = 1.0;
    for (size_t j = 0; j < conf[r].size(); ++j) {
      a *= std::clamp(static_cast<double>(conf[r][j]), 0.0, 1.0);
      items.push_back({a, r, static_cast<int>(j) + 1});
    }
    tokens += 1;  // the request's own token
    tau += 1.0;
  }
  std::vector<int> lengths(conf.size(), 0);
  if (items.empty()) return lengths;
  // Descending survival; ties keep request then position order (prefixes stay prefixes).
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.survival > b.survival; });
  double best = tau / table.seconds(tokens);
  size_t best_n = 0;
  for (size_t n = 0; n < items.size(); ++n) {
    tau += items[n].survival;
    tokens += 1;
    const double theta = tau / table.seconds(tokens);
    if (theta > best) best = theta, best_n = n + 1;
  }
  for (size_t n = 0; n < best_n; ++n) lengths[items[n].r] = std::max(lengths[items[n].r], items[n].j);
  return lengths;
}

}  // namespace deepinfer
