#include "routing_replay.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/error.h"

namespace deepinfer::test {
namespace {

// Choice scores of token t as the recording backend's moe_routing defines them (backend.h):
// sigmoid(logit) + bias, or softmax over the experts.
std::vector<double> choice_scores(const RoutingLog::Call& call, int64_t t) {
  const int E = call.routing.num_experts;
  const float* x = call.logits.data() + t * E;
  std::vector<double> c(static_cast<size_t>(E));
  if (call.sqrt_softplus) {
    for (int e = 0; e < E; ++e) {
      const double v = x[e];
      c[e] = std::sqrt(v > 20 ? v : std::log1p(std::exp(v)));
      if (call.routing.use_bias) c[e] += call.bias[e];
    }
  } else if (call.routing.scoring == MoeRouting::Scoring::Sigmoid) {
    for (int e = 0; e < E; ++e) {
      c[e] = 1.0 / (1.0 + std::exp(-double(x[e])));
      if (call.routing.use_bias) c[e] += call.bias[e];
    }
  } else {
    const double mx = *std::max_element(x, x + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += c[e] = std::exp(double(x[e]) - mx);
    for (double& v : c) v /= sum;
  }
  return c;
}

}  // namespace

double routing_flip_margin(const RoutingLog::Call& call, int64_t t, const int32_t* chosen) {
  const MoeRouting& r = call.routing;
  const int E = r.num_experts, K = r.top_k;
  const int32_t* want = call.ids.data() + t * K;
  const std::vector<double> c = choice_scores(call, t);
  double kth = INFINITY;  // weakest recorded choice
  for (int j = 0; j < K; ++j) kth = std::min(kth, c[want[j]]);
  // Group scores (backend.h: sum of the top-2 biased scores with bias, else the max).
  const int G = r.group_limited ? r.num_groups : 1, per_group = E / G;
  std::vector<double> group(static_cast<size_t>(G));
  for (int g = 0; g < G; ++g) {
    std::vector<double> s(c.begin() + g * per_group, c.begin() + (g + 1) * per_group);
    std::sort(s.begin(), s.end(), std::greater<>());
    group[g] = r.use_bias && per_group >= 2 ? s[0] + s[1] : s[0];
  }
  std::vector<double> sorted_groups = group;
  std::sort(sorted_groups.begin(), sorted_groups.end(), std::greater<>());
  const double kept = sorted_groups[static_cast<size_t>(r.group_limited ? r.top_k_groups - 1 : 0)];
  double margin = 0;
  for (int j = 0; j < K; ++j) {
    const int e = chosen[j];
    DI_CHECK(e >= 0 && e < E, "routing replay: token ", t, " chose expert ", e, " of ", E);
    if (std::find(want, want + K, e) != want + K) continue;
    margin = std::max(margin, kth - c[e]);
    if (r.group_limited) margin = std::max(margin, kept - group[e / per_group]);
  }
  return margin;
}

template <typename T>
std::vector<T> RoutingReplayBackend::download(const Tensor& t) {
  HostBuffer host(t.dtype, t.dims());
  Tensor h = host.tensor();
  inner_.copy(t, h);
  inner_.synchronize();
  return std::vector<T>(host.ptr<T>(), host.ptr<T>() + t.numel());
}

template <typename T>
void RoutingReplayBackend::upload(const std::vector<T>& values, Tensor& t) {
  HostBuffer host(t.dtype, t.dims());
  std::copy(values.begin(), values.end(), host.ptr<T>());
  inner_.copy(host.tensor(), t);
  inner_.synchronize();  // `host` dies here
}

void RoutingReplayBackend::moe_routing(const Tensor& logits, const Tensor& bias,
                                       const MoeRouting& routing, Tensor& topk_ids,
                                       Tensor& topk_weights) {
  inner_.moe_routing(logits, bias, routing, topk_ids, topk_weights);
  const int64_t T = logits.size(0), K = routing.top_k;
  if (mode_ == Mode::Record) {
    RoutingLog::Call call;
    call.routing = routing;
    call.num_tokens = T;
    call.logits = download<float>(logits);
    if (routing.use_bias) call.bias = download<float>(bias);
    call.ids = download<int32_t>(topk_ids);
    call.weights = download<float>(topk_weights);
    log_.calls.push_back(std::move(call));
    return;
  }
  DI_CHECK(log_.next < log_.calls.size(), "routing replay: call ", log_.next,
           " was never recorded (", log_.calls.size(), " recorded)");
  const RoutingLog::Call& want = log_.calls[log_.next++];
  DI_CHECK(want.num_tokens == T && want.routing.num_experts == routing.num_experts &&
               want.routing.top_k == routing.top_k,
           "routing replay: call ", log_.next - 1, " has ", T, " tokens x top ", K,
           ", the recorded one ", want.num_tokens, " x ", want.routing.top_k);
  replay_routing(want, T, K, topk_ids, topk_weights);
}

void RoutingReplayBackend::replay_routing(const RoutingLog::Call& want, int64_t T, int64_t K, Tensor& topk_ids,
                                          Tensor& topk_weights) {
  std::vector<int32_t> ids = download<int32_t>(topk_ids);
  std::vector<float> weights = download<float>(topk_weights);
  bool replaced = false;
  for (int64_t t = 0; t < T; ++t) {
    ++log_.compared_tokens;
    const double margin = routing_flip_margin(want, t, ids.data() + t * K);
    if (margin == 0 && std::is_permutation(ids.begin() + t * K, ids.begin() + (t + 1) * K,
                                           want.ids.begin() + t * K)) {
      continue;
    }
    DI_CHECK(margin <= max_margin_, "routing replay: call ", log_.next - 1, " token ", t,
             " chose experts that score ", margin, " below the reference's choice (more than the ",
             max_margin_, " a near-tie may explain)");
    ++log_.flipped_tokens;
    log_.max_flip_margin = std::max(log_.max_flip_margin, margin);
    std::copy(want.ids.begin() + t * K, want.ids.begin() + (t + 1) * K, ids.begin() + t * K);
    std::copy(want.weights.begin() + t * K, want.weights.begin() + (t + 1) * K,
              weights.begin() + t * K);
    replaced = true;
  }
  if (replaced) {
    upload(ids, topk_ids);
    upload(weights, topk_weights);
  }
}

double topk_flip_margin(const RoutingLog::TopkCall& call, int64_t t, const int32_t* chosen) {
  const int64_t K = call.k, N = call.num_cols;
  const float* score = call.scores.data() + t * N;
  const int32_t* want = call.indices.data() + t * K;
  double kth = INFINITY, scale = 0;
  for (int64_t j = 0; j < K; ++j) {
    if (want[j] >= 0) kth = std::min(kth, double(score[want[j]]));
  }
  for (int64_t j = 0; j < N; ++j) {
    if (std::isfinite(score[j])) scale = std::max(scale, std::fabs(double(score[j])));
  }
  scale = std::max(scale, 1e-30);
  double margin = 0;
  for (int64_t j = 0; j < K; ++j) {
    const int32_t p = chosen[j];
    if (p < 0 && want[j] < 0) continue;  // both padded here (contexts shorter than k)
    DI_CHECK(p >= 0 && p < N && std::isfinite(score[p]), "indexer replay: row ", t, " slot ", j,
             " chose position ", p, " where the reference chose ", want[j],
             " (outside the causal positions, or a padding difference)");
    if (std::find(want, want + K, p) != want + K) continue;
    margin = std::max(margin, (kth - double(score[p])) / scale);
  }
  return margin;
}

void RoutingReplayBackend::indexer_topk(const Tensor& scores, const PagedKV& kv, Tensor& indices) {
  inner_.indexer_topk(scores, kv, indices);
  topk_of_scores(scores, indices, /*ordered=*/true, "indexer");
}

void RoutingReplayBackend::topk_finite(const Tensor& scores, Tensor& out) {
  inner_.topk_finite(scores, out);
  topk_of_scores(scores, out, /*ordered=*/false, "topk_finite");
}

void RoutingReplayBackend::topk_of_scores(const Tensor& scores, Tensor& indices, bool ordered, const char* op) {
  const int64_t T = indices.size(0), K = indices.size(1), N = scores.size(1);
  if (mode_ == Mode::Record) {
    RoutingLog::TopkCall call;
    call.num_tokens = T;
    call.num_cols = N;
    call.k = K;
    // scores may be a strided view of a wider workspace: read it row by row.
    call.scores.resize(static_cast<size_t>(T * N));
    for (int64_t t = 0; t < T; ++t) {
      Tensor row = scores.slice_rows(t, t + 1);
      const std::vector<float> v = download<float>(row);
      std::copy(v.begin(), v.end(), call.scores.begin() + t * N);
    }
    call.indices = download<int32_t>(indices);
    log_.topk_calls.push_back(std::move(call));
    return;
  }
  DI_CHECK(log_.next_topk < log_.topk_calls.size(), op, " replay: call ", log_.next_topk,
           " was never recorded (", log_.topk_calls.size(), " recorded)");
  const RoutingLog::TopkCall& want = log_.topk_calls[log_.next_topk++];
  DI_CHECK(want.num_tokens == T && want.k == K && want.num_cols == N, op, " replay: call ",
           log_.next_topk - 1, " is [", T, ", top ", K, "] over ", N, " columns, the recorded one [",
           want.num_tokens, ", top ", want.k, "] over ", want.num_cols);
  std::vector<int32_t> got = download<int32_t>(indices);
  replay_topk(want, got, indices, ordered);
}

void RoutingReplayBackend::replay_topk(const RoutingLog::TopkCall& want, std::vector<int32_t>& got, Tensor& indices,
                                       bool ordered) {
  const int64_t T = want.num_tokens, K = want.k;
  bool replaced = false;
  for (int64_t t = 0; t < T; ++t) {
    ++log_.compared_rows;
    if (std::equal(got.begin() + t * K, got.begin() + (t + 1) * K, want.indices.begin() + t * K))
      continue;
    const bool same_set =
        std::is_permutation(got.begin() + t * K, got.begin() + (t + 1) * K, want.indices.begin() + t * K);
    DI_CHECK(!ordered || !same_set, "indexer replay: call ", log_.next_topk - 1, " row ", t,
             " kept the reference's positions in another order (they must be ascending)");
    // V4 writes best first: the same set in another order is a near-tie of the order only.
    const double margin = same_set ? 0.0 : topk_flip_margin(want, t, got.data() + t * K);
    DI_CHECK(margin <= max_topk_margin_, "indexer replay: call ", log_.next_topk - 1, " row ", t,
             " kept positions scoring ", margin, " (relative) below the reference's k-th (more than the ",
             max_topk_margin_, " a near-tie may explain)");
    ++log_.flipped_rows;
    log_.max_topk_margin = std::max(log_.max_topk_margin, margin);
    std::copy(want.indices.begin() + t * K, want.indices.begin() + (t + 1) * K, got.begin() + t * K);
    replaced = true;
  }
  if (replaced) upload(got, indices);
}

void RoutingReplayBackend::moe_routing_sqrt_softplus(const Tensor& logits, const Tensor& bias,
                                                     const Tensor& hash_ids, int top_k, float scaling,
                                                     Tensor& topk_ids, Tensor& topk_weights) {
  inner_.moe_routing_sqrt_softplus(logits, bias, hash_ids, top_k, scaling, topk_ids, topk_weights);
  if (hash_ids.defined()) return;  // hash routing: the ids are given, nothing can flip
  const int64_t T = logits.size(0), E = logits.size(1), K = top_k;
  if (mode_ == Mode::Record) {
    RoutingLog::Call call;
    call.sqrt_softplus = true;
    call.routing.num_experts = static_cast<int>(E);
    call.routing.top_k = top_k;
    call.routing.use_bias = bias.defined();
    call.num_tokens = T;
    call.logits = download<float>(logits);
    if (bias.defined()) call.bias = download<float>(bias);
    call.ids = download<int32_t>(topk_ids);
    call.weights = download<float>(topk_weights);
    log_.calls.push_back(std::move(call));
    return;
  }
  DI_CHECK(log_.next < log_.calls.size(), "routing replay: call ", log_.next, " was never recorded (",
           log_.calls.size(), " recorded)");
  const RoutingLog::Call& want = log_.calls[log_.next++];
  DI_CHECK(want.sqrt_softplus && want.num_tokens == T && want.routing.num_experts == E && want.routing.top_k == K,
           "routing replay: call ", log_.next - 1, " (sqrt-softplus, ", T, " tokens x top ", K,
           ") does not match the recorded one");
  replay_routing(want, T, K, topk_ids, topk_weights);
}

void RoutingReplayBackend::indexer_topk(const Tensor& q, const Tensor& keys, const Tensor& weights,
                                        const Tensor& positions, int ratio, float softmax_scale, float weights_scale,
                                        Tensor& out) {
  inner_.indexer_topk(q, keys, weights, positions, ratio, softmax_scale, weights_scale, out);
  // keys [S, d], or [T, S, d]: each query its own (a decode step's sequences).
  const int64_t T = out.size(0), K = out.size(1), S = keys.size(keys.ndim - 2);
  const int64_t key_stride = keys.ndim == 3 ? S * q.size(2) : 0;
  if (mode_ == Mode::Record) {
    // The recorded scores, from the recording backend's inputs (backend.h's formula, in double).
    const int64_t H = q.size(1), d = q.size(2);
    const std::vector<float> qv = download<float>(q), kv = download<float>(keys), wv = download<float>(weights);
    const std::vector<int32_t> pos = download<int32_t>(positions);
    RoutingLog::TopkCall call;
    call.num_tokens = T;
    call.num_cols = S;
    call.k = K;
    call.scores.assign(static_cast<size_t>(T * S), -INFINITY);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t visible = std::min<int64_t>(S, (pos[t] + 1) / ratio);
      for (int64_t s = 0; s < visible; ++s) {
        double total = 0;
        for (int64_t h = 0; h < H; ++h) {
          double dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += double(qv[(t * H + h) * d + i]) * kv[t * key_stride + s * d + i];
          total += std::max(dot, 0.0) * softmax_scale * (double(wv[t * H + h]) * weights_scale);
        }
        call.scores[t * S + s] = static_cast<float>(total);
      }
    }
    call.indices = download<int32_t>(out);
    log_.topk_calls.push_back(std::move(call));
    return;
  }
  DI_CHECK(log_.next_topk < log_.topk_calls.size(), "indexer replay: call ", log_.next_topk,
           " was never recorded (", log_.topk_calls.size(), " recorded)");
  const RoutingLog::TopkCall& want = log_.topk_calls[log_.next_topk++];
  DI_CHECK(want.num_tokens == T && want.k == K && want.num_cols == S, "indexer replay: call ", log_.next_topk - 1,
           " is [", T, ", top ", K, "] over ", S, " keys, the recorded one [", want.num_tokens, ", top ", want.k,
           "] over ", want.num_cols);
  std::vector<int32_t> got = download<int32_t>(out);
  replay_topk(want, got, out, /*ordered=*/false);
}

void RoutingReplayBackend::candidate_blocks(const Tensor& scores, const Tensor& positions, int ratio,
                                            int64_t topk_blocks, int64_t block_size, Tensor& bias) {
  inner_.candidate_blocks(scores, positions, ratio, topk_blocks, block_size, bias);
  const int64_t T = scores.size(0), S = scores.size(1);
  if (mode_ == Mode::Record) {
    RoutingLog::BlockCall call;
    call.num_tokens = T;
    call.num_cols = S;
    call.topk_blocks = topk_blocks;
    call.block_size = block_size;
    call.ratio = ratio;
    call.scores = download<float>(scores);
    call.bias = download<float>(bias);
    call.positions = download<int32_t>(positions);
    log_.block_calls.push_back(std::move(call));
    return;
  }
  DI_CHECK(log_.next_block < log_.block_calls.size(), "candidate_blocks replay: call ", log_.next_block,
           " was never recorded (", log_.block_calls.size(), " recorded)");
  const RoutingLog::BlockCall& want = log_.block_calls[log_.next_block++];
  DI_CHECK(want.num_tokens == T && want.num_cols == S && want.topk_blocks == topk_blocks &&
               want.block_size == block_size && want.ratio == ratio,
           "candidate_blocks replay: call ", log_.next_block - 1, " [", T, ", ", S, "] does not match the recorded one");
  std::vector<float> got = download<float>(bias);
  const int64_t nb = (S + block_size - 1) / block_size;
  bool replaced = false;
  for (int64_t t = 0; t < T; ++t) {
    ++log_.compared_rows;
    const float* g = got.data() + t * S;
    const float* w = want.bias.data() + t * S;
    if (std::equal(g, g + S, w)) continue;
    // Block scores in the recorded scores (the newest visible block: +inf, always kept).
    std::vector<double> block(static_cast<size_t>(nb), -INFINITY);
    for (int64_t s = 0; s < S; ++s)
      if (!std::isnan(want.scores[t * S + s]))
        block[s / block_size] = std::max(block[s / block_size], double(want.scores[t * S + s]));
    const int64_t visible = (want.positions[t] + 1) / ratio;
    if (visible > 0 && (visible - 1) / block_size < nb) block[(visible - 1) / block_size] = INFINITY;
    double kth = INFINITY, scale = 1e-30;
    for (int64_t b = 0; b < nb; ++b) {
      if (w[b * block_size] == 0.0f) kth = std::min(kth, block[b]);
      if (std::isfinite(block[b])) scale = std::max(scale, std::fabs(block[b]));
    }
    double margin = 0;
    for (int64_t b = 0; b < nb; ++b) {
      if (g[b * block_size] != 0.0f || w[b * block_size] == 0.0f) continue;  // not kept instead
      DI_CHECK(std::isfinite(block[b]), "candidate_blocks replay: call ", log_.next_block - 1, " row ", t,
               " kept block ", b, " whose recorded score is ", block[b]);
      margin = std::max(margin, (kth - block[b]) / scale);
    }
    DI_CHECK(margin <= max_topk_margin_, "candidate_blocks replay: call ", log_.next_block - 1, " row ", t,
             " kept blocks scoring ", margin, " (relative) below the reference's k-th (more than the ",
             max_topk_margin_, " a near-tie may explain)");
    ++log_.flipped_rows;
    log_.max_topk_margin = std::max(log_.max_topk_margin, margin);
    std::copy(w, w + S, got.begin() + t * S);
    replaced = true;
  }
  if (replaced) upload(got, bias);
}

}  // namespace deepinfer::test
