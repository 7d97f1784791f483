// fattn — the tile operations the CPU backward adds to the forward's.
//
// Layouts, as in tile_ops.hpp (Br query rows along the vector lanes, Bc keys):
//   st   [Bc][Br]  scores → probabilities P (recomputed from the saved logsumexp)
//   dst  [Bc][Br]  dP = V·dOᵀ → dS = P ∘ (dP − Δ)
//   x    [Br][Dp]  query-side rows (Q or dO), x_stride floats apart (their own rows
//                  when the dims are contiguous and fill whole vectors, else copies
//                  padded with zeros to Dp, a multiple of the vector width)
//   acc  [Bc][Dp]  a key tile's dK or dV accumulator
//   lse2, delta [Br]  per query: logsumexp in log2 units, Δ = rowsum(dO ∘ O) − dlse
// The products that reduce over keys (dQ += dS·K) reuse the forward's pv_accumulate;
// the ones that reduce over queries (dV += P·dO, dK += dS·Q) are rows_accumulate.
#pragma once

#include <cstdint>

#include "cpu/common/blocks.hpp"
#include "cpu/common/tile_ops.hpp"

namespace fattn::cpu {

template <class S>
struct BackwardOps {
  using Ops = TileOps<S>;
  using vec = typename S::vec;
  static constexpr int L = S::lanes, NV = Ops::NV, Br = Ops::Br, MK = Ops::MK,
                       DV = Ops::T::dim_vecs;

  // Head dim rounded up to whole vectors: the row buffers' and accumulators' width.
  static std::int64_t padded_dim(std::int64_t D) { return (D + L - 1) / L * L; }

  // t[j][i] ← f(t[j][i], c[i], j·Br + i) for the nj rows of a tile, c one float per
  // query lane: each element against its lane's value, the lane vectors loaded once.
  template <class F>
  [[gnu::always_inline]] static void update_rows(float* t, std::int64_t nj, const float* c, F f) {
    vec cv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) cv[v] = S::load(c + v * L);
    for (std::int64_t j = 0; j < nj; ++j)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        float* e = t + j * Br + v * L;
        S::store(e, f(S::load(e), cv[v], j * Br + v * L));
      }
  }

  // st[j][i] ← 2^(st[j][i] − lse2[i]) for nj rows: the forward's probabilities, from
  // scores in log2 units. A query that sees no key has lse2 = +inf, so its P is 0.
  static void probs_from_lse(float* st, std::int64_t nj, const float* lse2) {
    update_rows(st, nj, lse2, [](vec s, vec m, std::int64_t) { return exp2<S>(s - m); });
  }

  // dst[j][i] ← P[j][i] · (dst[j][i] − delta[i]): dS from dP, for nj rows.
  static void grad_scores(const float* p, float* dst, std::int64_t nj, const float* delta) {
    update_rows(dst, nj, delta,
                [p](vec dp, vec dl, std::int64_t e) { return S::load(p + e) * (dp - dl); });
  }

  // dst[j][i] ← dst[j][i] · factor[j][i] for nj rows (dS through the softcap).
  static void multiply(float* dst, const float* factor, std::int64_t nj) {
    for (std::int64_t e = 0; e < nj * Br; e += L)
      S::store(dst + e, S::load(dst + e) * S::load(factor + e));
  }

  // acc[r][d0 + ·] += Σ_{i<n} p[r][i] · x[i][d0 + ·] for KR keys × W vectors of dims.
  template <int KR, int W>
  static void rows_block(float* acc, std::int64_t Dp, const float* p, const float* x,
                         std::int64_t x_stride, std::int64_t n) {
    vec a[KR][W];
#pragma GCC unroll 16
    for (int r = 0; r < KR; ++r)
#pragma GCC unroll 8
      for (int w = 0; w < W; ++w) a[r][w] = S::load(acc + r * Dp + w * L);
    for (std::int64_t i = 0; i < n; ++i) {
      vec xv[W];
#pragma GCC unroll 8
      for (int w = 0; w < W; ++w) xv[w] = S::load(x + i * x_stride + w * L);
      rank1_update<S>(a, [&](int r) { return p[r * Br + i]; }, xv);
    }
#pragma GCC unroll 16
    for (int r = 0; r < KR; ++r)
#pragma GCC unroll 8
      for (int w = 0; w < W; ++w) S::store(acc + r * Dp + w * L, a[r][w]);
  }

  // acc[r][·] += Σ_{i<n} p[r][i] · x[i][·] for the keys r < nj rounded up to a whole
  // panel (the rows past nj hold padding and are never stored).
  static void rows_accumulate(float* acc, std::int64_t nj, std::int64_t Dp, const float* p,
                              const float* x, std::int64_t x_stride, std::int64_t n) {
    for (std::int64_t r = 0; r < nj; r += MK)
      for_blocks<DV>(Dp / L, [&](std::int64_t w, auto W) {  // DV vectors of dims a block
        const std::int64_t d = w * L;
        rows_block<MK, decltype(W)::value>(acc + r * Dp + d, Dp, p + r * Br, x + d, x_stride, n);
      });
  }
};

}  // namespace fattn::cpu
