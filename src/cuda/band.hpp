// fattn — the model's band of visible diagonals (model/problem.hpp: band_lo, band_hi) as the
// CUDA kernels' Params hold it (int edges, each present or not; visibility.cuh asks the
// questions). Plain C++: the host tests check it against the model (tests/test_cuda_band.cpp).
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/params.hpp"
#include "model/problem.hpp"

namespace fattn::cuda {

// Whether the band has a lower edge that hides a pair: every diagonal j - i lies in
// [-(q_len - 1), kv_len - 1].
inline bool has_lower_edge(const detail::Problem& pr) { return pr.band_lo > -(pr.q_len - 1); }

// The problem's band in int: an edge that hides nothing is no edge; one that hides everything
// is clamped to just past the diagonals, so i ± edge stays inside int (|edge| <= max(Sq, Sk)).
// A causal problem keeps its upper edge whatever it hides (the kernels order its blocks by it).
inline void set_band(Params& p, const detail::Problem& pr) {
  const std::int64_t lowest = -(pr.q_len - 1), highest = pr.kv_len - 1;
  p.has_band_hi = pr.causal != Causal::none || pr.band_hi < highest;
  p.band_hi = p.has_band_hi ? static_cast<int>(std::max(lowest - 1, std::min(pr.band_hi, highest))) : 0;
  p.has_band_lo = has_lower_edge(pr);
  p.band_lo = p.has_band_lo ? static_cast<int>(std::min(highest + 1, std::max(pr.band_lo, lowest))) : 0;
}

}  // namespace fattn::cuda
