// fattn tests — the packed sequences of the varlen suites (test_varlen.cpp,
// test_varlen_paged.cpp): their lengths, cases, packed tensors, variants and offsets.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <utility>
#include <vector>

#include "fattn/attention.hpp"
#include "fattn/kv_cache.hpp"
#include "util/elements.hpp"
#include "util/seed.hpp"

namespace fattn_test::varlen {

using fattn::Causal;
using fattn::DType;
using fattn::Impl;
using fattn::Isa;
using fattn::Options;
using fattn::TensorView;

constexpr double kInf = std::numeric_limits<double>::infinity();

enum class Variant { plain, window, softcap, sinks, alibi, alibi_per_sequence };
inline const char* variant_name(Variant v) {
  switch (v) {
    case Variant::window: return "window";
    case Variant::softcap: return "softcap";
    case Variant::sinks: return "sinks";
    case Variant::alibi: return "alibi";
    case Variant::alibi_per_sequence: return "alibi_BxH";
    default: return "plain";
  }
}

using Lengths = std::vector<std::pair<std::int32_t, std::int32_t>>;  // (Sq, Sk) per sequence

// Odd lengths, sequences without queries, without keys or without both, Sq > Sk and Sq < Sk.
inline Lengths odd_lengths() {
  return {{1, 1},  {0, 5},  {7, 0},   {13, 13},  {17, 40}, {33, 9},
          {70, 70}, {5, 130}, {129, 131}, {0, 0}, {3, 64}, {65, 64}};
}
// Many short sequences of random lengths (0 to 90 queries, equal or random keys).
inline Lengths many_lengths(std::uint64_t seed) {
  Rng rng(seed);
  Lengths l;
  for (int b = 0; b < 41; ++b) {
    const auto sq = static_cast<std::int32_t>(rng.index(91));
    l.push_back({sq, b % 2 ? sq : static_cast<std::int32_t>(rng.index(121))});
  }
  return l;
}

// Sequences of ~2000 keys at Hkv = 8, D = 64 (8 MB of K and V packed as float32 each):
// more than one wave of the fused kernel (run_fused_in_waves: 16 MiB a wave up to 8 threads),
// and among them sequences of few queries, which impl auto runs on the decode kernel, and
// one without keys.
inline Lengths wave_lengths() {
  return {{70, 2100}, {3, 40}, {80, 1900}, {5, 0}, {66, 2300}, {1, 500}, {90, 2050}, {0, 300}};
}

// Two sequences of few queries against thousands of keys (the decode kernel's, under impl
// auto), each with over 1/4 of the work, among short ones.
inline Lengths long_decode_lengths() {
  return {{1, 6000}, {17, 17}, {2, 3000}, {30, 40}, {5, 0}, {64, 64}, {0, 7}};
}

struct Case {
  DType dtype = DType::float32;
  Causal causal = Causal::bottom_right;
  Variant variant = Variant::plain;
  std::int64_t Hq = 8, Hkv = 2, D = 64;
  int threads = 2;
  Impl impl = Impl::automatic;
  Isa isa = Isa::automatic;
  bool many = false;
  bool waves = false;  // wave_lengths (with Hkv = 8, D = 64)
  bool long_decode = false;  // long_decode_lengths
};
inline void PrintTo(const Case& c, std::ostream* os) {
  *os << fattn::to_string(c.dtype) << "_" << fattn::to_string(c.causal) << "_"
      << variant_name(c.variant) << "_H" << c.Hq << "x" << c.Hkv << "_D" << c.D << "_t"
      << c.threads << "_" << fattn::to_string(c.impl) << "_" << fattn::to_string(c.isa)
      << (c.waves ? "_waves" : c.many ? "_many" : c.long_decode ? "_long_decode" : "_odd");
}

// Packed (total, H, D) rows drawn in float32, rounded to the case's dtype: `values` holds
// the numbers the kernel reads (as doubles, for the reference), `bytes` the tensor itself.
struct Packed {
  std::int64_t rows, heads, D;
  DType dtype;
  std::vector<double> values;
  std::vector<std::uint8_t> bytes;
  Packed(std::int64_t r, std::int64_t h, std::int64_t d, DType t, Rng* rng)
      : rows(r), heads(h), D(d), dtype(t),
        values(static_cast<std::size_t>(r * h * d)),
        bytes(values.size() * static_cast<std::size_t>(fattn::element_size(t)) + 1) {
    for (std::size_t e = 0; e < values.size(); ++e) {
      const float x = rng ? rng->normal() : std::numeric_limits<float>::quiet_NaN();
      write(e, x);
      values[e] = read(e);
    }
  }
  void write(std::size_t e, double x) {
    if (dtype == DType::float64) std::memcpy(at(e), &x, sizeof x);
    else element_from_float(dtype, static_cast<float>(x), at(e));
  }
  double read(std::size_t e) {
    double x = 0.0;
    if (dtype == DType::float64) std::memcpy(&x, at(e), sizeof x);
    else x = element_to_float(dtype, at(e));
    return x;
  }
  std::uint8_t* at(std::size_t e) { return bytes.data() + e * fattn::element_size(dtype); }
  double read(std::int64_t row, std::int64_t h, std::int64_t d) {
    return read(static_cast<std::size_t>((row * heads + h) * D + d));
  }
  TensorView view() { return TensorView::bshd(bytes.data(), 1, rows, heads, D, dtype); }
  // Rows [begin, begin + n) as float64 (1, n, H, D).
  std::vector<double> slice(std::int64_t begin, std::int64_t n) const {
    return {values.begin() + begin * heads * D, values.begin() + (begin + n) * heads * D};
  }
};

inline TensorView vector_view(void* data, std::int64_t n, DType dtype) {
  return {data, 1, {n, 0, 0, 0}, {1, 0, 0, 0}, dtype};
}

// The variants of a case: float32 slopes and sinks for the kernels (float64 for the
// reference), one ALiBi row per sequence for alibi_per_sequence.
struct Variants {
  std::vector<float> slopes, sinks;
  std::vector<double> slopes64, sinks64;
  TensorView slopes_view, sinks_view;
  Variants(const Case& c, std::int64_t batch, Rng& rng) {
    const std::int64_t rows = c.variant == Variant::alibi_per_sequence ? batch : 1;
    if (c.variant == Variant::alibi || c.variant == Variant::alibi_per_sequence)
      for (std::int64_t e = 0; e < rows * c.Hq; ++e) slopes.push_back(static_cast<float>(rng.uniform(0.01, 0.5)));
    if (c.variant == Variant::sinks)
      for (std::int64_t h = 0; h < c.Hq; ++h) sinks.push_back(static_cast<float>(rng.uniform(-1.0, 2.0)));
    slopes64.assign(slopes.begin(), slopes.end());
    sinks64.assign(sinks.begin(), sinks.end());
    slopes_view = c.variant == Variant::alibi_per_sequence
                      ? TensorView{slopes.data(), 2, {batch, c.Hq, 0, 0}, {c.Hq, 1, 0, 0}}
                      : vector_view(slopes.data(), c.Hq, DType::float32);
    sinks_view = vector_view(sinks.data(), c.Hq, DType::float32);
  }
  Options options(const Case& c) const {
    Options o;
    o.causal = c.causal;
    o.impl = c.impl;
    o.isa = c.isa;
    o.num_threads = c.threads;
    if (c.variant == Variant::window) o.window_left = 19, o.window_right = 6;
    if (c.variant == Variant::softcap) o.softcap = 3.5;
    if (!slopes.empty()) o.alibi_slopes = &slopes_view;
    if (!sinks.empty()) o.sinks = &sinks_view;
    return o;
  }
  // The reference's options for sequence b: float64 slopes (that sequence's row) and sinks.
  Options reference_options(const Case& c, std::int64_t b, TensorView* s64, TensorView* k64) {
    Options o = options(c);
    o.impl = Impl::reference;
    o.isa = Isa::automatic;
    o.num_threads = 1;
    if (!slopes.empty()) {
      const std::int64_t row = c.variant == Variant::alibi_per_sequence ? b : 0;
      *s64 = vector_view(slopes64.data() + row * c.Hq, c.Hq, DType::float64);
      o.alibi_slopes = s64;
    }
    if (!sinks.empty()) {
      *k64 = vector_view(sinks64.data(), c.Hq, DType::float64);
      o.sinks = k64;
    }
    return o;
  }
};

struct Offsets {
  std::vector<std::int32_t> q{0}, k{0};
  explicit Offsets(const Lengths& l) {
    for (const auto& [sq, sk] : l) q.push_back(q.back() + sq), k.push_back(k.back() + sk);
  }
  std::int64_t batch() const { return static_cast<std::int64_t>(q.size()) - 1; }
  TensorView q_view() { return TensorView::int32_vector(q.data(), batch() + 1); }
  TensorView k_view() { return TensorView::int32_vector(k.data(), batch() + 1); }
};

// Outputs within float32's error of the reference (relative to max(1, |ref|)), or half a
// unit in the last place of a 16-bit output plus the bfloat16 dot products' rounding of p.
inline double out_tolerance(DType dtype) { return dtype == DType::float32 ? 2e-5 : 1e-2; }
inline double lse_tolerance(DType dtype) { return dtype == DType::float32 ? 1e-5 : 1e-4; }

// The forward cases: every kernel, isa, dtype and variant varlen takes.
inline std::vector<Case> forward_cases() {
  std::vector<Case> all;
  for (DType dtype : {DType::float32, DType::bfloat16})
    for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right})
      for (Variant variant : {Variant::plain, Variant::window, Variant::softcap, Variant::sinks,
                              Variant::alibi, Variant::alibi_per_sequence}) {
        Case c;
        c.dtype = dtype, c.causal = causal, c.variant = variant;
        all.push_back(c);
      }
  auto with = [&](auto&& change) {
    Case c;
    change(c);
    all.push_back(c);
  };
  with([](Case& c) { c.many = true, c.Hq = 4, c.Hkv = 4, c.D = 128, c.threads = 3; });
  with([](Case& c) { c.many = true, c.dtype = DType::bfloat16, c.D = 128, c.threads = 3; });
  with([](Case& c) { c.many = true, c.dtype = DType::float16, c.variant = Variant::sinks; });
  // 8 threads: the four long sequences each need every thread, and run through the fused
  // kernel's items together, in two waves.
  auto waves = [](Case& c) { c.waves = true, c.Hq = 8, c.Hkv = 8, c.D = 64, c.threads = 8; };
  with(waves);
  with([&](Case& c) { waves(c), c.impl = Impl::fused, c.variant = Variant::sinks; });
  with([&](Case& c) {
    waves(c), c.dtype = DType::bfloat16, c.variant = Variant::alibi_per_sequence;
  });
  // Many threads: the sequences with 1/threads of the work each run through the fused
  // kernel's items together (at 2-3 threads most run side by side, one thread each).
  with([](Case& c) { c.many = true, c.threads = 32, c.Hq = c.Hkv = 8, c.impl = Impl::fused; });
  with([](Case& c) { c.threads = 16, c.variant = Variant::alibi_per_sequence, c.causal = Causal::top_left; });
  // 4 threads: the two long decode sequences each need every thread (run_decode, one after
  // the other), the rest side by side.
  with([](Case& c) { c.long_decode = true, c.threads = 4, c.variant = Variant::sinks; });
  with([](Case& c) { c.dtype = DType::bfloat16, c.D = 80, c.Hq = 6, c.Hkv = 3; });
  with([](Case& c) { c.D = 80, c.Hq = 6, c.Hkv = 1, c.threads = 1; });
  with([](Case& c) { c.isa = Isa::avx2, c.variant = Variant::window; });
  with([](Case& c) { c.isa = Isa::avx2, c.dtype = DType::bfloat16; });
  with([](Case& c) { c.isa = Isa::portable, c.variant = Variant::alibi_per_sequence; });
  with([](Case& c) { c.impl = Impl::fused, c.variant = Variant::sinks; });
  with([](Case& c) { c.impl = Impl::naive, c.variant = Variant::sinks; });
  with([](Case& c) { c.impl = Impl::decode, c.variant = Variant::sinks, c.Hkv = 8; });
  with([](Case& c) { c.impl = Impl::decode, c.dtype = DType::bfloat16, c.causal = Causal::top_left; });
  with([](Case& c) { c.impl = Impl::reference, c.variant = Variant::softcap; });
  return all;
}

// The AMX kernels (isa amx; on a CPU without AMX, skipped, or built with emulated tiles):
// the fused forward and backward take the ragged batch whole, the forward every variant
// varlen takes.
inline std::vector<Case> amx_cases() {
  std::vector<Case> all;
  for (Variant variant : {Variant::plain, Variant::window, Variant::softcap, Variant::sinks,
                          Variant::alibi_per_sequence})
    for (Causal causal : {Causal::none, Causal::bottom_right}) {
      Case c;
      c.isa = Isa::amx, c.variant = variant, c.causal = causal;
      all.push_back(c);
    }
  Case many;
  many.isa = Isa::amx, many.many = true, many.impl = Impl::fused, many.threads = 16;
  all.push_back(many);
  Case waves;
  waves.isa = Isa::amx, waves.waves = true, waves.Hq = waves.Hkv = 8, waves.threads = 8;
  waves.causal = Causal::top_left;
  all.push_back(waves);
  return all;
}
}  // namespace fattn_test::varlen
