// fattn tests — the float64 references: the library's own (Impl::reference, through the
// public entry point) and an independent oracle written straight from the definition.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fattn/fattn.hpp"
#include "tensor.hpp"

namespace fattn_test {

using fattn::Causal;
using fattn::Impl;
using fattn::Options;

inline double default_scale(std::int64_t D) { return 1.0 / std::sqrt(static_cast<double>(D)); }

// Whether query i sees key j.
inline bool visible(Causal causal, std::int64_t i, std::int64_t j, std::int64_t Sq, std::int64_t Sk) {
  switch (causal) {
    case Causal::none: return true;
    case Causal::top_left: return j <= i;
    case Causal::bottom_right: return j <= i + (Sk - Sq);
  }
  return false;
}

// How many keys query i sees: keys 0 .. visible_keys − 1 (the masks hide a suffix).
inline std::int64_t visible_keys(Causal causal, std::int64_t i, std::int64_t Sq, std::int64_t Sk) {
  if (causal == Causal::none) return Sk;
  const std::int64_t diagonal = causal == Causal::bottom_right ? Sk - Sq : 0;
  return std::clamp<std::int64_t>(i + diagonal + 1, 0, Sk);
}

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

// One row of the oracle: writes D outputs to o and returns the logsumexp.
inline double oracle_row(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                         Causal causal, std::int64_t b, std::int64_t h, std::int64_t i, double* o) {
  const std::int64_t H = q.size(1), Sq = q.size(2), D = q.size(3);
  const std::int64_t Sk = k.size(2), hk = h / (H / k.size(1));
  std::vector<double> s(static_cast<std::size_t>(Sk));
  double mx = -std::numeric_limits<double>::infinity();
  bool any = false, nan = false;
  for (std::int64_t j = 0; j < Sk; ++j) {
    if (!visible(causal, i, j, Sq, Sk)) continue;
    long double dot = 0;
    for (std::int64_t d = 0; d < D; ++d)
      dot += static_cast<long double>(q.get(b, h, i, d)) * k.get(b, hk, j, d);
    s[static_cast<std::size_t>(j)] = static_cast<double>(dot) * scale;
    if (std::isnan(s[static_cast<std::size_t>(j)])) nan = true;
    mx = std::max(mx, s[static_cast<std::size_t>(j)]);
    any = true;
  }
  if (!any) {
    std::fill(o, o + D, 0.0);
    return -std::numeric_limits<double>::infinity();
  }
  if (nan) {
    std::fill(o, o + D, std::numeric_limits<double>::quiet_NaN());
    return std::numeric_limits<double>::quiet_NaN();
  }
  double sum = 0;
  std::vector<double> acc(static_cast<std::size_t>(D), 0.0);
  for (std::int64_t j = 0; j < Sk; ++j) {
    if (!visible(causal, i, j, Sq, Sk)) continue;
    const double p = std::exp(s[static_cast<std::size_t>(j)] - mx);
    sum += p;
    for (std::int64_t d = 0; d < D; ++d) acc[static_cast<std::size_t>(d)] += p * v.get(b, hk, j, d);
  }
  for (std::int64_t d = 0; d < D; ++d) o[d] = acc[static_cast<std::size_t>(d)] / sum;
  return mx + std::log(sum);
}

inline Oracle oracle(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Causal causal) {
  const std::int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), D = q.size(3);
  Oracle r{std::vector<double>(static_cast<std::size_t>(B * H * Sq * D)),
           std::vector<double>(static_cast<std::size_t>(B * H * Sq)), B, H, Sq, D};
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < Sq; ++i) {
        const auto row = static_cast<std::size_t>((b * H + h) * Sq + i);
        r.lse[row] = oracle_row(q, k, v, scale, causal, b, h, i, &r.out[row * static_cast<std::size_t>(D)]);
      }
  return r;
}

}  // namespace fattn_test
