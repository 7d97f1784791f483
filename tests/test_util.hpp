// fattn tests — shared helpers: seeded random tensors in several memory layouts,
// NaN-poisoned outputs, the float64 reference, an independent oracle, and
// element-by-element comparisons.
//
// Conventions used by every test:
//  * Random data is fresh per test and seeded from the test's full name, so a
//    failure reproduces exactly (set FATTN_TEST_SEED to perturb every seed).
//  * Every storage buffer is larger than the view it holds. Input padding is a
//    quiet NaN with payload kInputPadBits: a kernel that reads outside its view
//    turns outputs into NaN. Outputs are fully poisoned with kPoisonBits before
//    every run: an element the kernel forgot to write stays poison (detected),
//    and anything it writes outside the view is detected too.
//  * Outputs are compared element by element against the float64 reference with
//    max_abs_err <= 1e-5 * max(1, max|ref|); the logsumexp with
//    |err| <= 1e-5 * max(1, |ref|) per element, and -inf / NaN must match exactly.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "fattn/fattn.hpp"

namespace fattn_test {

using fattn::Causal;
using fattn::Impl;
using fattn::Isa;
using fattn::Options;
using fattn::TensorView;

constexpr double kOutTol = 1e-5;  // relative to max(1, max|ref|), for outputs
constexpr double kLseTol = 1e-5;  // relative to max(1, |ref|), for each logsumexp

// Quiet NaNs with payloads the kernels never produce (they only ever make the
// default NaN or propagate the payload of an input NaN).
constexpr std::uint32_t kPoisonBits = 0x7fc0beefu;    // outputs, before each run
constexpr std::uint32_t kInputPadBits = 0x7fc1deadu;  // input storage outside the view

inline float from_bits(std::uint32_t bits) { return std::bit_cast<float>(bits); }
inline std::uint32_t to_bits(float f) { return std::bit_cast<std::uint32_t>(f); }
inline const float kPoison = from_bits(kPoisonBits);
inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---- seeding --------------------------------------------------------------------------

inline std::uint64_t test_seed() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name =
      info ? std::string(info->test_suite_name()) + "." + info->name() : std::string("none");
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  if (const char* env = std::getenv("FATTN_TEST_SEED")) h ^= std::strtoull(env, nullptr, 0);
  return h;
}

class Rng {
 public:
  Rng() : Rng(test_seed()) {}
  explicit Rng(std::uint64_t seed) : engine_(seed) {}
  float normal() { return normal_(engine_); }
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(engine_); }
  std::int64_t index(std::int64_t n) {  // uniform in [0, n)
    return std::uniform_int_distribution<std::int64_t>(0, n - 1)(engine_);
  }
  std::mt19937_64& engine() { return engine_; }

 private:
  std::mt19937_64 engine_;
  std::normal_distribution<float> normal_{0.0f, 1.0f};
};

// ---- layouts ---------------------------------------------------------------------------

// How a logical (B, H, S, D) tensor sits in memory.
//   bhsd:    contiguous (B, H, S, D)
//   bshd:    contiguous (B, S, H, D)
//   strided: every other element of a bigger buffer (dim stride 2), dimension order
//            S, B, H, D in memory, odd padding between heads, batches and rows, and
//            an odd start offset — nothing is contiguous
//   slice:   a head-dim slice of a packed buffer (dim stride 1, rows D + 19 apart,
//            like one of q/k/v inside a packed qkv tensor), start misaligned
enum class Layout { bhsd, bshd, strided, slice };

inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::bhsd: return "bhsd";
    case Layout::bshd: return "bshd";
    case Layout::strided: return "strided";
    case Layout::slice: return "slice";
  }
  return "?";
}

// Layout of the rank-3 logsumexp output.
enum class LseLayout { none, contiguous, strided };

inline const char* lse_layout_name(LseLayout l) {
  switch (l) {
    case LseLayout::none: return "nolse";
    case LseLayout::contiguous: return "lse";
    case LseLayout::strided: return "lsestrided";
  }
  return "?";
}

// A view plus the storage it lives in (storage is larger than the view).
// Move-only: the view points into the storage.
class Tensor {
 public:
  Tensor() = default;
  Tensor(Tensor&&) = default;
  Tensor& operator=(Tensor&&) = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  // Storage of `elements` floats filled with `fill`; the view starts at `offset`.
  Tensor(int rank, std::array<std::int64_t, 4> sizes, std::array<std::int64_t, 4> strides,
         std::int64_t offset, float fill) {
    std::int64_t reach = 0;
    for (int d = 0; d < rank; ++d) reach += (sizes[d] - 1) * strides[d];
    storage_.assign(static_cast<std::size_t>(offset + reach + 1 + 5), fill);  // 5 floats of tail
    offset_ = offset;
    view_.data = storage_.data() + offset;
    view_.rank = rank;
    view_.sizes = sizes;
    view_.strides = strides;
  }

  const TensorView& view() const { return view_; }
  TensorView& view() { return view_; }
  const TensorView* view_ptr() const { return &view_; }
  int rank() const { return view_.rank; }
  std::int64_t size(int d) const { return view_.sizes[static_cast<std::size_t>(d)]; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int d = 0; d < rank(); ++d) n *= size(d);
    return n;
  }
  std::vector<float>& storage() { return storage_; }
  const std::vector<float>& storage() const { return storage_; }

  std::int64_t offset_of(std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3 = 0) const {
    return offset_ + i0 * view_.strides[0] + i1 * view_.strides[1] + i2 * view_.strides[2] +
           (rank() == 4 ? i3 * view_.strides[3] : 0);
  }
  float& at(std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3 = 0) {
    return storage_[static_cast<std::size_t>(offset_of(i0, i1, i2, i3))];
  }
  float at(std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3 = 0) const {
    return storage_[static_cast<std::size_t>(offset_of(i0, i1, i2, i3))];
  }

  // Calls f(i0, i1, i2, i3) for every logical index (i3 = 0 for rank 3).
  template <class F>
  void for_each(F&& f) const {
    const std::int64_t n3 = rank() == 4 ? size(3) : 1;
    for (std::int64_t a = 0; a < size(0); ++a)
      for (std::int64_t b = 0; b < size(1); ++b)
        for (std::int64_t c = 0; c < size(2); ++c)
          for (std::int64_t d = 0; d < n3; ++d) f(a, b, c, d);
  }

  // Which storage elements the view covers.
  std::vector<char> coverage() const {
    std::vector<char> in(storage_.size(), 0);
    for_each([&](auto a, auto b, auto c, auto d) { in[static_cast<std::size_t>(offset_of(a, b, c, d))] = 1; });
    return in;
  }

  void poison() { std::fill(storage_.begin(), storage_.end(), kPoison); }

  Tensor clone() const {
    Tensor t;
    t.storage_ = storage_;
    t.offset_ = offset_;
    t.view_ = view_;
    t.view_.data = t.storage_.data() + offset_;
    return t;
  }

 private:
  std::vector<float> storage_;
  std::int64_t offset_ = 0;
  TensorView view_;
};

// Strides (in elements) and start offset of a (B, H, S, D) tensor in a layout.
struct Placement {
  std::array<std::int64_t, 4> strides;
  std::int64_t offset;
};

inline Placement placement(Layout layout, std::int64_t B, std::int64_t H, std::int64_t S,
                           std::int64_t D) {
  switch (layout) {
    case Layout::bhsd: return {{H * S * D, S * D, D, 1}, 0};
    case Layout::bshd: return {{S * H * D, D, H * D, 1}, 0};
    case Layout::strided: {
      const std::int64_t sd = 2, sh = 2 * D + 1, sb = H * sh + 3, ss = B * sb + 7;
      return {{sb, sh, ss, sd}, 5};
    }
    case Layout::slice: {
      const std::int64_t pitch = D + 19;
      return {{H * S * pitch, S * pitch, pitch, 1}, 3};
    }
  }
  return {{0, 0, 0, 0}, 0};
}

// A (B, H, S, D) input filled with N(0, 1) · multiplier; padding is kInputPadBits NaN.
inline Tensor make_input(Layout layout, std::int64_t B, std::int64_t H, std::int64_t S,
                         std::int64_t D, Rng& rng, float multiplier = 1.0f) {
  const Placement p = placement(layout, B, H, S, D);
  Tensor t(4, {B, H, S, D}, p.strides, p.offset, from_bits(kInputPadBits));
  t.for_each([&](auto b, auto h, auto s, auto d) { t.at(b, h, s, d) = rng.normal() * multiplier; });
  return t;
}

// A (B, H, S, D) output, all of its storage poisoned.
inline Tensor make_output(Layout layout, std::int64_t B, std::int64_t H, std::int64_t S,
                          std::int64_t D) {
  const Placement p = placement(layout, B, H, S, D);
  return Tensor(4, {B, H, S, D}, p.strides, p.offset, kPoison);
}

// A (B, H, S) logsumexp output, poisoned; strided: every third float, heads and
// batches padded, dimension order S, B, H.
inline Tensor make_lse(LseLayout layout, std::int64_t B, std::int64_t H, std::int64_t S) {
  if (layout == LseLayout::strided) {
    const std::int64_t sh = 3, sb = H * sh + 1, ss = B * sb + 2;
    return Tensor(3, {B, H, S, 0}, {sb, sh, ss, 0}, 1, kPoison);
  }
  return Tensor(3, {B, H, S, 0}, {H * S, S, 1, 0}, 0, kPoison);
}

// ---- running ---------------------------------------------------------------------------

struct Result {
  Tensor out;
  Tensor lse;  // empty storage when not asked for
};

// The float64 reference through the public entry point (Impl::reference), into
// contiguous poisoned outputs.
inline Result run_reference(const Tensor& q, const Tensor& k, const Tensor& v, Options options,
                            bool with_lse = true) {
  options.impl = Impl::reference;
  Result r{make_output(Layout::bhsd, q.size(0), q.size(1), q.size(2), q.size(3)), Tensor()};
  if (with_lse) r.lse = make_lse(LseLayout::contiguous, q.size(0), q.size(1), q.size(2));
  fattn::attention_forward(q.view(), k.view(), v.view(), r.out.view(),
                           with_lse ? r.lse.view_ptr() : nullptr, options);
  return r;
}

inline double default_scale(std::int64_t D) { return 1.0 / std::sqrt(static_cast<double>(D)); }

// ---- an independent oracle -------------------------------------------------------------

// Straight from the definition, in float64, written independently of
// src/cpu/reference.cpp: a full score matrix per head, masked entries skipped.
struct Oracle {
  std::vector<double> out;  // (B, Hq, Sq, D) contiguous
  std::vector<double> lse;  // (B, Hq, Sq)
  std::int64_t B, H, Sq, D;
  double o(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t d) const {
    return out[static_cast<std::size_t>(((b * H + h) * Sq + i) * D + d)];
  }
  double l(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return lse[static_cast<std::size_t>((b * H + h) * Sq + i)];
  }
};

inline bool visible(Causal causal, std::int64_t i, std::int64_t j, std::int64_t Sq, std::int64_t Sk) {
  switch (causal) {
    case Causal::none: return true;
    case Causal::top_left: return j <= i;
    case Causal::bottom_right: return j <= i + (Sk - Sq);
  }
  return false;
}

inline Oracle oracle(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Causal causal) {
  const std::int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), D = q.size(3);
  const std::int64_t Hkv = k.size(1), Sk = k.size(2), group = H / Hkv;
  Oracle r{std::vector<double>(static_cast<std::size_t>(B * H * Sq * D)),
           std::vector<double>(static_cast<std::size_t>(B * H * Sq)), B, H, Sq, D};
  std::vector<double> s(static_cast<std::size_t>(Sk));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < Sq; ++i) {
        const std::int64_t hk = h / group;
        double mx = -std::numeric_limits<double>::infinity();
        bool any = false, nan = false;
        for (std::int64_t j = 0; j < Sk; ++j) {
          if (!visible(causal, i, j, Sq, Sk)) continue;
          long double dot = 0;
          for (std::int64_t d = 0; d < D; ++d)
            dot += static_cast<long double>(q.at(b, h, i, d)) * k.at(b, hk, j, d);
          s[static_cast<std::size_t>(j)] = static_cast<double>(dot) * scale;
          if (std::isnan(s[static_cast<std::size_t>(j)])) nan = true;
          mx = std::max(mx, s[static_cast<std::size_t>(j)]);
          any = true;
        }
        double* o = &r.out[static_cast<std::size_t>(((b * H + h) * Sq + i) * D)];
        double& lse = r.lse[static_cast<std::size_t>((b * H + h) * Sq + i)];
        if (!any) {
          std::fill(o, o + D, 0.0);
          lse = -std::numeric_limits<double>::infinity();
          continue;
        }
        if (nan) {
          std::fill(o, o + D, std::numeric_limits<double>::quiet_NaN());
          lse = std::numeric_limits<double>::quiet_NaN();
          continue;
        }
        double sum = 0;
        std::vector<double> acc(static_cast<std::size_t>(D), 0.0);
        for (std::int64_t j = 0; j < Sk; ++j) {
          if (!visible(causal, i, j, Sq, Sk)) continue;
          const double p = std::exp(s[static_cast<std::size_t>(j)] - mx);
          sum += p;
          for (std::int64_t d = 0; d < D; ++d) acc[static_cast<std::size_t>(d)] += p * v.at(b, hk, j, d);
        }
        for (std::int64_t d = 0; d < D; ++d) o[d] = acc[static_cast<std::size_t>(d)] / sum;
        lse = mx + std::log(sum);
      }
  return r;
}

// ---- comparisons -----------------------------------------------------------------------

inline std::string index_string(const Tensor& t, std::int64_t a, std::int64_t b, std::int64_t c,
                                std::int64_t d) {
  std::ostringstream s;
  s << "(" << a << ", " << b << ", " << c;
  if (t.rank() == 4) s << ", " << d;
  s << ")";
  return s.str();
}

// Every element of `got` (any layout) against `ref` (any layout, same logical shape):
// NaN where ref is NaN (and not the poison), equal where ref is ±inf, and otherwise
// |got − ref| <= rel_tol · max(1, max|ref|) over the finite elements of ref.
inline ::testing::AssertionResult outputs_near(const Tensor& got, const Tensor& ref,
                                               double rel_tol = kOutTol) {
  if (got.rank() != ref.rank() || got.numel() != ref.numel())
    return ::testing::AssertionFailure() << "shape mismatch";
  double max_ref = 0.0;
  ref.for_each([&](auto a, auto b, auto c, auto d) {
    const double r = ref.at(a, b, c, d);
    if (std::isfinite(r)) max_ref = std::max(max_ref, std::fabs(r));
  });
  const double bound = rel_tol * std::max(1.0, max_ref);
  double max_err = 0.0;
  std::int64_t bad = 0;
  std::ostringstream first;
  ref.for_each([&](auto a, auto b, auto c, auto d) {
    const float g = got.at(a, b, c, d);
    const float r = ref.at(a, b, c, d);
    bool ok;
    if (to_bits(g) == kPoisonBits)
      ok = false;  // never written
    else if (std::isnan(r))
      ok = std::isnan(g);
    else if (std::isinf(r))
      ok = g == r;
    else {
      const double err = std::fabs(static_cast<double>(g) - r);
      ok = std::isfinite(g) && err <= bound;
      if (std::isfinite(g)) max_err = std::max(max_err, err);
    }
    if (!ok) {
      if (bad < 5)
        first << "\n  at " << index_string(got, a, b, c, d) << ": got " << g
              << (to_bits(g) == kPoisonBits ? " (poison: never written)" : "") << ", expected " << r;
      ++bad;
    }
  });
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.numel() << " elements differ (bound " << bound
         << ", max finite abs error " << max_err << "; max|ref| " << max_ref << ")" << first.str();
}

// Logsumexp: -inf and NaN must match exactly; finite values to
// max(abs_tol, rel_tol·max(1, |ref|)).
inline ::testing::AssertionResult lse_near(const Tensor& got, const Tensor& ref,
                                           double rel_tol = kLseTol, double abs_tol = 0.0) {
  if (got.numel() != ref.numel()) return ::testing::AssertionFailure() << "shape mismatch";
  std::int64_t bad = 0;
  double max_err = 0.0;
  std::ostringstream first;
  ref.for_each([&](auto a, auto b, auto c, auto d) {
    const float g = got.at(a, b, c, d);
    const float r = ref.at(a, b, c, d);
    bool ok;
    if (to_bits(g) == kPoisonBits)
      ok = false;
    else if (std::isnan(r))
      ok = std::isnan(g);
    else if (std::isinf(r))
      ok = g == r;
    else {
      const double err = std::fabs(static_cast<double>(g) - r);
      ok = std::isfinite(g) &&
           err <= std::max(abs_tol, rel_tol * std::max(1.0, std::fabs(static_cast<double>(r))));
      if (std::isfinite(g)) max_err = std::max(max_err, err);
    }
    if (!ok) {
      if (bad < 5)
        first << "\n  lse at " << index_string(got, a, b, c, d) << ": got " << g
              << (to_bits(g) == kPoisonBits ? " (poison: never written)" : "") << ", expected " << r;
      ++bad;
    }
  });
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.numel()
                                       << " logsumexp values differ (max finite abs error "
                                       << max_err << ")" << first.str();
}

// Bit-for-bit equality of two outputs (any layouts, same logical shape).
inline ::testing::AssertionResult bitwise_equal(const Tensor& a, const Tensor& b) {
  std::int64_t bad = 0;
  std::ostringstream first;
  a.for_each([&](auto i, auto j, auto k, auto l) {
    if (to_bits(a.at(i, j, k, l)) != to_bits(b.at(i, j, k, l))) {
      if (bad < 5)
        first << "\n  at " << index_string(a, i, j, k, l) << ": " << a.at(i, j, k, l) << " vs "
              << b.at(i, j, k, l);
      ++bad;
    }
  });
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " elements differ" << first.str();
}

// Storage outside the view must still hold the poison: nothing was written there.
inline ::testing::AssertionResult outside_view_untouched(const Tensor& t) {
  const std::vector<char> in = t.coverage();
  std::int64_t bad = 0;
  std::size_t first = 0;
  for (std::size_t e = 0; e < in.size(); ++e)
    if (!in[e] && to_bits(t.storage()[e]) != kPoisonBits) {
      if (bad == 0) first = e;
      ++bad;
    }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " storage elements outside the view were written"
                                       << " (first at storage offset " << first << ": "
                                       << t.storage()[first] << ")";
}

// Every storage element still holds the poison (a failed call touched nothing).
inline ::testing::AssertionResult all_poison(const Tensor& t) {
  for (std::size_t e = 0; e < t.storage().size(); ++e)
    if (to_bits(t.storage()[e]) != kPoisonBits)
      return ::testing::AssertionFailure() << "storage element " << e << " was written";
  return ::testing::AssertionSuccess();
}

// Inputs must not be modified: storage (view and padding) byte-identical to a snapshot.
inline ::testing::AssertionResult unchanged(const Tensor& now, const Tensor& before) {
  if (now.storage().size() != before.storage().size() ||
      std::memcmp(now.storage().data(), before.storage().data(),
                  now.storage().size() * sizeof(float)) != 0)
    return ::testing::AssertionFailure() << "an input tensor was modified";
  return ::testing::AssertionSuccess();
}

// ---- errors ----------------------------------------------------------------------------

// call() throws fattn::Error with `part` in its message.
inline void expect_error(const std::function<void()>& call, const std::string& part) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning '" << part << "'";
  } catch (const fattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// ---- kernel variants -------------------------------------------------------------------

struct Variant {
  Impl impl;
  Isa isa;
};

inline std::string variant_name(const Variant& v) {
  return std::string(fattn::to_string(v.impl)) + "_" + fattn::to_string(v.isa);
}

// For gtest's parameter printing (and so ctest's test list).
inline void PrintTo(const Variant& v, std::ostream* os) { *os << variant_name(v); }

// naive and fused, each on amx, avx512, avx2 and portable.
inline std::vector<Variant> kernel_variants() {
  std::vector<Variant> vs;
  for (Impl impl : {Impl::naive, Impl::fused})
    for (Isa isa : {Isa::amx, Isa::avx512, Isa::avx2, Isa::portable}) vs.push_back({impl, isa});
  return vs;
}

// The forward kernels: naive, fused and decode, each on amx, avx512, avx2 and portable.
inline std::vector<Variant> forward_variants() {
  std::vector<Variant> vs = kernel_variants();
  for (Isa isa : {Isa::amx, Isa::avx512, Isa::avx2, Isa::portable}) vs.push_back({Impl::decode, isa});
  return vs;
}

#define FATTN_SKIP_IF_UNSUPPORTED(isa)                                                    \
  do {                                                                                     \
    if (!fattn::cpu_supports(isa))                                                         \
      GTEST_SKIP() << "this CPU does not support isa " << fattn::to_string(isa)            \
                   << " (best: " << fattn::to_string(fattn::best_cpu_isa()) << ")";        \
  } while (0)

}  // namespace fattn_test
