// Parity harness helpers: every CUDA op against the CPU reference on fresh random inputs.
// Inputs are drawn in F32, rounded to BF16 so both backends see the same values (the CPU
// computes in F32, CUDA reads BF16); CUDA outputs are poisoned with NaN before each run
// and compared by normalised error ||gpu - cpu|| / ||cpu|| with a tolerance per dtype.
// Seeds are fresh per run (std::random_device) and printed on failure.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/settings.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace deepinfer::ops_test {

// Normalised-error tolerances: BF16 outputs (8-bit mantissa) and attention (P in BF16).
constexpr double kTolBF16 = 1e-2;
constexpr double kTolAttention = 2e-2;

// The CUDA switches of the DEEPINFER_* settings table (e.g. DEEPINFER_CUDA_SYNC=1 to locate
// a faulting op), passed as options as the engine does; tests override fields, not getenv.
inline BackendOptions env_backend_options() {
  BackendOptions o;
  o.cuda = cuda_options(env_settings());
  return o;
}

class Parity : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      gpu_ = make_cuda_backend(env_backend_options());
    } catch (const Error& e) {
      GTEST_SKIP() << "no usable CUDA device: " << e.what();
    }
    if (!gpu_) GTEST_SKIP() << "built without CUDA";
    BackendOptions inv = env_backend_options();
    inv.batch_invariant = true;
    gpu_inv_ = make_cuda_backend(inv);
    cpu_ = make_cpu_backend(BackendOptions{});
    seed_ = std::random_device{}();
    rng_.seed(seed_);
    ::testing::Test::RecordProperty("seed", std::to_string(seed_));
  }

  // Both CUDA configurations (default, batch-invariant), and the suffix naming one in messages.
  std::vector<Backend*> gpus() { return {gpu_.get(), gpu_inv_.get()}; }
  static std::string tag(const Backend& b) { return b.batch_invariant() ? " (batch-invariant)" : ""; }

  // Host values, rounded to BF16 when `bf16_exact`.
  std::vector<float> randn(int64_t n, float scale = 1.0f, bool bf16_exact = true) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) {
      x = d(rng_);
      if (bf16_exact) x = bf16_to_float(float_to_bf16(x));
    }
    return v;
  }
  int randint(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  // A CPU F32 tensor holding `v`.
  Tensor cpu_f32(const std::vector<float>& v, std::vector<int64_t> dims) {
    keep_.push_back(std::make_shared<HostBuffer>(DType::F32, dims));
    Tensor t = keep_.back()->tensor();
    std::copy(v.begin(), v.end(), t.ptr<float>());
    return t;
  }
  Tensor cpu_i32(const std::vector<int32_t>& v, std::vector<int64_t> dims) {
    keep_.push_back(std::make_shared<HostBuffer>(DType::I32, dims));
    Tensor t = keep_.back()->tensor();
    std::copy(v.begin(), v.end(), t.ptr<int32_t>());
    return t;
  }
  // A CPU tensor of raw bytes (BF16 / F8 weights).
  Tensor cpu_raw(DType dtype, const void* bytes, std::vector<int64_t> dims) {
    keep_.push_back(std::make_shared<HostBuffer>(dtype, dims));
    Tensor t = keep_.back()->tensor();
    std::memcpy(t.data, bytes, t.num_bytes());
    return t;
  }
  // A device tensor of dtype (F32 or BF16) holding v; or of raw bytes.
  Tensor gpu_float(Backend& b, const std::vector<float>& v, std::vector<int64_t> dims, DType dtype) {
    DeviceBuffer buf = b.alloc(dtype, dims);
    Tensor t = buf.tensor();
    HostBuffer host(dtype, dims);
    for (size_t i = 0; i < v.size(); ++i) {
      if (dtype == DType::BF16)
        host.ptr<uint16_t>()[i] = float_to_bf16(v[i]);
      else
        host.ptr<float>()[i] = v[i];
    }
    b.copy(host.tensor(), t);
    dev_.push_back(buf);
    return t;
  }
  Tensor gpu_copy(Backend& b, const Tensor& host) {
    DeviceBuffer buf = b.alloc(host.dtype, host.dims());
    Tensor t = buf.tensor();
    b.copy(host, t);
    dev_.push_back(buf);
    return t;
  }
  // Device tensor filled with NaN (floats) or a poison integer.
  Tensor gpu_poisoned(Backend& b, DType dtype, std::vector<int64_t> dims) {
    DeviceBuffer buf = b.alloc(dtype, dims);
    Tensor t = buf.tensor();
    poison(b, t);
    dev_.push_back(buf);
    return t;
  }
  static void poison(Backend& b, Tensor& t) {
    HostBuffer host(t.dtype, t.dims());
    poison_host(host.tensor());
    b.copy(host.tensor(), t);
  }
  // Device tensor poisoned as gpu_poisoned, inside kGuardBytes of sentinel bytes on each side;
  // expect_guards_intact() checks that no op wrote past its output.
  static constexpr size_t kGuardBytes = 256;
  static constexpr uint8_t kSentinel = 0xA5;
  Tensor gpu_guarded(Backend& b, DType dtype, std::vector<int64_t> dims) {
    Tensor inner(nullptr, dtype, dims);
    const size_t bytes = inner.num_bytes(), total = bytes + 2 * kGuardBytes;
    DeviceBuffer buf = b.alloc(DType::U8, {static_cast<int64_t>(total)});
    std::vector<uint8_t> host(total, kSentinel);
    Tensor mid(host.data() + kGuardBytes, dtype, dims);
    HostBuffer poisoned(dtype, dims);
    poison_host(poisoned.tensor());
    std::memcpy(mid.data, poisoned.tensor().data, bytes);
    Tensor whole = buf.tensor();
    b.copy(Tensor(host.data(), DType::U8, {static_cast<int64_t>(total)}), whole);
    dev_.push_back(buf);
    guarded_.push_back({&b, whole});
    return Tensor(static_cast<uint8_t*>(whole.data) + kGuardBytes, dtype, dims, whole.device);
  }
  void expect_guards_intact(const std::string& what) {
    for (const auto& [b, whole] : guarded_) {
      std::vector<uint8_t> host(static_cast<size_t>(whole.numel()));
      Tensor h(host.data(), DType::U8, {whole.numel()});
      b->copy(whole, h);
      for (size_t i = 0; i < host.size(); ++i) {
        if (i >= kGuardBytes && i < host.size() - kGuardBytes) continue;
        ASSERT_EQ(host[i], kSentinel) << what << ": guard byte " << i << " of " << host.size()
                                      << " overwritten, seed " << seed_;
      }
    }
    guarded_.clear();
  }
  static void poison_host(Tensor& host) {
    for (int64_t i = 0, n = host.numel(); i < n; ++i) {
      switch (host.dtype) {
        case DType::BF16: host.ptr<uint16_t>()[i] = 0x7fc0; break;
        case DType::F32: host.ptr<float>()[i] = std::nanf(""); break;
        case DType::I32: host.ptr<int32_t>()[i] = -123456789; break;
        default: host.ptr<uint8_t>()[i] = 0x7f; break;
      }
    }
  }
  // Device tensor (F32/BF16/I32) read back as floats.
  static std::vector<float> download(Backend& b, const Tensor& t) {
    HostBuffer host(t.dtype, t.dims());
    b.copy(t, host.tensor());
    std::vector<float> v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) {
      switch (t.dtype) {
        case DType::BF16: v[i] = bf16_to_float(host.ptr<uint16_t>()[i]); break;
        case DType::F32: v[i] = host.ptr<float>()[i]; break;
        case DType::I32: v[i] = static_cast<float>(host.ptr<int32_t>()[i]); break;
        default: v[i] = fp8_e4m3_to_float(host.ptr<uint8_t>()[i]); break;
      }
    }
    return v;
  }
  static std::vector<float> values(const Tensor& cpu) {
    return std::vector<float>(cpu.ptr<float>(), cpu.ptr<float>() + cpu.numel());
  }

  // A step over a scattered paged cache: sequence s computes q_lens[s] new tokens at the end of
  // its seq_lens[s] positions; its blocks come from a shuffled pool (tables never contiguous).
  struct PagedLayout {
    std::vector<int32_t> seq_lens, tables, query_start;
    std::vector<int32_t> ctx;  // causal positions of each token
    int64_t T = 0, num_blocks = 0, max_blocks = 0;
    int max_seq_len = 0, max_q = 0;
  };
  PagedLayout paged_layout(const std::vector<int32_t>& q_lens, const std::vector<int32_t>& seq_lens,
                           int64_t block_size) {
    PagedLayout d;
    const int S = static_cast<int>(q_lens.size());
    d.seq_lens = seq_lens;
    d.query_start.push_back(0);
    for (int s = 0; s < S; ++s) {
      d.query_start.push_back(d.query_start.back() + q_lens[s]);
      d.max_seq_len = std::max(d.max_seq_len, seq_lens[s]);
      d.max_q = std::max(d.max_q, q_lens[s]);
      d.max_blocks = std::max<int64_t>(d.max_blocks, (seq_lens[s] + block_size - 1) / block_size);
      for (int32_t i = 0; i < q_lens[s]; ++i) d.ctx.push_back(seq_lens[s] - q_lens[s] + i + 1);
    }
    d.T = d.query_start.back();
    d.num_blocks = d.max_blocks * S + 3;
    std::vector<int32_t> perm(static_cast<size_t>(d.num_blocks));
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int32_t>(i);
    std::shuffle(perm.begin(), perm.end(), rng_);
    d.tables.assign(static_cast<size_t>(S * d.max_blocks), 0);
    for (int s = 0, next = 0; s < S; ++s)
      for (int64_t b = 0; b < d.max_blocks; ++b) d.tables[s * d.max_blocks + b] = perm[next++];
    return d;
  }
  // The layout's addressing over `cache` on backend b (nullptr: the CPU).
  PagedKV paged_addressing(Backend* b, const PagedLayout& d, Tensor cache) {
    const int S = static_cast<int>(d.seq_lens.size());
    PagedKV kv;
    kv.cache = cache;
    Tensor tables = cpu_i32(d.tables, {S, d.max_blocks});
    Tensor lens = cpu_i32(d.seq_lens, {S});
    Tensor qs = cpu_i32(d.query_start, {S + 1});
    kv.block_tables = b ? gpu_copy(*b, tables) : tables;
    kv.seq_lens = b ? gpu_copy(*b, lens) : lens;
    kv.query_start = b ? gpu_copy(*b, qs) : qs;
    kv.num_seqs = S;
    kv.max_query_len = d.max_q;
    kv.max_seq_len = d.max_seq_len;
    return kv;
  }

  // ||got - want|| / ||want|| <= tol, and no NaN in got (every element written).
  void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol,
                    const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double num = 0, den = 0;
    int64_t nan_count = 0, first_nan = -1;
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::isnan(got[i])) {
        if (first_nan < 0) first_nan = static_cast<int64_t>(i);
        ++nan_count;
        continue;
      }
      num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
      den += double(want[i]) * want[i];
    }
    EXPECT_EQ(nan_count, 0) << what << ": " << nan_count << " elements unwritten or NaN (first at "
                            << first_nan << "), seed " << seed_;
    const double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    EXPECT_LE(err, tol) << what << ": normalised error " << err << " > " << tol << ", seed " << seed_;
  }

  std::unique_ptr<Backend> cpu_, gpu_, gpu_inv_;
  uint32_t seed_ = 0;
  std::mt19937_64 rng_;
  std::vector<std::shared_ptr<HostBuffer>> keep_;
  std::vector<DeviceBuffer> dev_;
  std::vector<std::pair<Backend*, Tensor>> guarded_;  // gpu_guarded's whole allocations
};

// BF16 or FP8 (128x128 block-scaled) weight [N, K] with identical values on both backends.
struct WeightPair {
  Weight cpu, gpu;
};

}  // namespace deepinfer::ops_test
