// fattn — the tile operations the CPU kernels are made of.
//
// Layouts (Br = query tile rows, D = head dim):
//   qt  [D][Br]   the query tile, transposed and pre-scaled by scale·log2(e)
//   kp  [D][key_rows] per panel: key_rows keys interleaved, so a broadcast walks forward
//   st  [Bc][Br]  scores, keys × queries; becomes the probabilities P in place
//   ot  [D][Br]   the output accumulator, transposed
//   m, l, alpha [Br]  running max (log2 units), running sum, this tile's rescale factor
// Queries run along the vector lanes, so the softmax needs no horizontal reductions.
#pragma once

#include "cpu/common/isa_target.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "model/problem.hpp"
#include "cpu/common/blocks.hpp"
#include "cpu/common/elements.hpp"
#include "cpu/common/exp2.hpp"
#include "cpu/common/online_softmax.hpp"
#include "cpu/common/simd.hpp"
#include "cpu/common/tiling.hpp"
#include "cpu/common/transpose.hpp"

namespace fattn::cpu {

template <class S>
struct TileOps {
  using Simd = S;
  using vec = typename S::vec;
  using ivec = typename S::ivec;
  using T = Tiling<S::lanes * static_cast<int>(sizeof(float))>;
  static constexpr int L = S::lanes;
  static constexpr int NV = T::query_vecs;
  static constexpr int Br = NV * L;
  static constexpr int Bc = T::key_tile;
  static constexpr int MK = T::key_rows;
  static constexpr int MD = T::dim_rows;
  static_assert(Bc % MK == 0, "a key tile is a whole number of key panels");

  // Which query lanes see key j of a tile in P·V: the visibility policy of pv_block, one
  // of three. A lane that does not see a key skips it (its p is not added, even as 0).
  // Every key ...
  struct AllVisible {
    static constexpr bool masks = false;
    void lanes(std::int64_t, ivec*) const {}
  };
  // ... a band edge (the tiles an edge of the band crosses; Problem: band_lo <= key −
  // query <= band_hi): query i0+i sees key j0+j iff first_seeing(j) <= i < end_seeing(j),
  // both clamped to [0, Br] by seeing_rows ...
  struct Band {
    static constexpr bool masks = true;
    std::int64_t j0, i0, lo, hi;
    std::int64_t first_seeing(std::int64_t j) const { return j0 + j - hi - i0; }
    std::int64_t end_seeing(std::int64_t j) const { return j0 + j - lo - i0 + 1; }
    static std::int64_t clamp_row(std::int64_t i) { return i < 0 ? 0 : i > Br ? Br : i; }
    void seeing_rows(std::int64_t j, std::int64_t* first, std::int64_t* end) const {
      *first = clamp_row(first_seeing(j));
      *end = clamp_row(end_seeing(j));
    }
    void lanes(std::int64_t j, ivec visible[NV]) const {
      std::int64_t first, end;
      seeing_rows(j, &first, &end);
#pragma GCC unroll 8
      for (int u = 0; u < NV; ++u) {
        const ivec lane = __builtin_convertvector(S::iota(), ivec) + u * L;
        visible[u] = (lane >= static_cast<std::int32_t>(first)) & (lane < static_cast<std::int32_t>(end));
      }
    }
  };
  // ... or each lane's own range: lane i sees keys [begin[i], end[i]) of the tile (the
  // decode kernel's rows, which mix query heads and positions).
  struct LaneRanges {
    static constexpr bool masks = true;
    ivec begin[NV], end[NV];
    void lanes(std::int64_t j, ivec visible[NV]) const {
      const auto key = static_cast<std::int32_t>(j);
#pragma GCC unroll 8
      for (int u = 0; u < NV; ++u) visible[u] = (key >= begin[u]) & (key < end[u]);
    }
  };

  // Where the values of a tile's keys lie, the value policy of pv_block: key j's row at
  // v + j·stride, dims contiguous (the decode kernel's rows of a paged cache are another).
  struct ValueRows {
    const float* v;
    std::int64_t stride;
    const float* row(std::int64_t j) const { return v + j * stride; }
    ValueRows from_dim(std::int64_t d) const { return {v + d, stride}; }
  };

  // Where the MK keys of a scores_block lie, its key policy: a packed panel kp[d][MK]
  // (pack_k_panels: a broadcast walks forward) ...
  struct KeyPanel {
    const float* kp;
    float at(std::int64_t d, int r) const { return kp[d * MK + r]; }
  };
  // ... or MK rows where they lie, dims contiguous (the decode kernel's cache).
  struct KeyRows {
    const float* row[MK];
    float at(std::int64_t d, int r) const { return row[r][d]; }
  };

  static Band band_of(const detail::Problem& p, std::int64_t j0, std::int64_t i0) {
    return {j0, i0, p.band_lo, p.band_hi};
  }

  static constexpr float kLog2e = 1.4426950408889634f;
  static constexpr float kLn2 = 0.6931471805599453f;
  static constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  // qt[d][i] = q[i0+i][d] · factor; rows past the end of the sequence are zero.
  // Dims outer, rows inner: the writes are contiguous and the loads become gathers
  // (0.42 → 0.32 ns an element at D=128, AVX-512, docs/perf-log.md).
  // With AVX-512 and contiguous float32 dims, whole 16×16 blocks go through registers
  // (transpose.hpp); the rest, other ISAs and 16-bit elements, element by element.
  static void load_q_transposed(const detail::Strided<const float>& q, DType dtype,
                                std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows,
                                std::int64_t D, float factor, float* qt) {
    std::int64_t rows_done = 0, dims_done = 0;  // the block-transposed corner
#if defined(FATTN_AVX512)
    if constexpr (L == 16) {
      if (q.dim == 1 && dtype == DType::float32) {
        const float* first = q.row(b, h, i0);
        rows_done = rows / L * L;
        dims_done = D / L * L;
        const __m512 scale = _mm512_set1_ps(factor);
        for (std::int64_t i = 0; i < rows_done; i += L)
          for (std::int64_t d = 0; d < dims_done; d += L)
            transpose_block16(first + i * q.seq + d, q.seq, qt + d * Br + i, Br, scale);
      }
    }
#endif
    with_element_type(q, dtype, [&](const auto& e) {
      const auto* first = e.row(b, h, i0);
      for (std::int64_t d = 0; d < D; ++d) {
        for (std::int64_t i = d < dims_done ? rows_done : 0; i < rows; ++i)
          qt[d * Br + i] = to_float(first[i * e.seq + d * e.dim]) * factor;
        for (std::int64_t i = rows; i < Br; ++i) qt[d * Br + i] = 0.0f;
      }
    });
  }

  // Packs keys [0, n) of head (b, h) into panels of MK keys; the last panel is zero-padded.
  // A q8_0 row is widened whole first (convert_row), the others element by element.
  static void pack_k_panels(const detail::Strided<const float>& k, DType dtype, std::int64_t b,
                            std::int64_t h, std::int64_t n, std::int64_t D, float* kp) {
    with_kv_element_type(k, dtype, [&](const auto& e) {
      using E = std::remove_const_t<std::remove_reference_t<decltype(*e.data)>>;
      float widened[kMaxHeadDim];
      float* panel = kp;
      for (std::int64_t g = 0; g * MK < n; ++g, panel += D * MK)
        for (int r = 0; r < MK; ++r) {
          const std::int64_t j = g * MK + r;
          const auto* row = j < n ? e.row(b, h, j) : nullptr;
          if constexpr (std::is_same_v<E, Q8_0>) {
            if (row) convert_row(row, e.dim, D, widened);
            for (std::int64_t d = 0; d < D; ++d) panel[d * MK + r] = row ? widened[d] : 0.0f;
          } else {
            for (std::int64_t d = 0; d < D; ++d)
              panel[d * MK + r] = row ? to_float(row[d * e.dim]) : 0.0f;
          }
        }
    });
  }

  // st[r][·] = Σ_d k(d, r) · qt[d][·] for MK keys (a KeyPanel or KeyRows), the head dim
  // in chains summed pairwise (sum_chains); each_dim() runs once per dim (the decode
  // kernel asks for a line of its next tile there).
  struct Nothing {
    void operator()() const {}
  };
  template <class Keys, class EachDim = Nothing>
  static void scores_block(const Keys& k, const float* qt, std::int64_t D, float* st,
                           EachDim each_dim = {}) {
    vec acc[MK][NV];
    dim_sums<S>(
        D, acc, [&](std::int64_t d, int r) { return k.at(d, r); },
        [&](std::int64_t d, int v) { return S::load(qt + d * Br + v * L); }, each_dim);
    store_block<S>(acc, st, Br);
  }

  // Scores of keys [j0, j0 + nj) against the query tile: nj rows of st.
  static void scores_tile(const float* kpanels, std::int64_t j0, std::int64_t nj, const float* qt,
                          std::int64_t D, float* st) {
    for (std::int64_t g = j0 / MK; g * MK < j0 + nj; ++g)
      scores_block(KeyPanel{kpanels + g * D * MK}, qt, D, st + (g * MK - j0) * Br);
  }

  // Hides key j0+j from the query lanes that do not see it (a Band's edge, or LaneRanges):
  // the score becomes `hidden` (−inf; the backward also zeroes its dS this way).
  template <class Vis>
  static void mask_tile(float* st, std::int64_t nj, const Vis& vis, float hidden = kNegInf) {
    for (std::int64_t j = 0; j < nj; ++j) {
      ivec visible[NV];
      vis.lanes(j, visible);
#pragma GCC unroll 8
      for (int u = 0; u < NV; ++u)
        S::store(st + j * Br + u * L, visible[u] ? S::load(st + j * Br + u * L) : S::splat(hidden));
    }
  }

  // Online softmax over nj rows of scores (OnlineSoftmax::update_lanes): new running
  // max m, alpha = 2^(m_old − m_new), st ← 2^(st − m_new), l ← alpha·l + Σ_j st.
  static void softmax_update(float* st, std::int64_t nj, float* m, float* l, float* alpha) {
    OnlineSoftmax<S>::template update_lanes<NV>(st, nj, m, l, alpha);
  }

  // ot[d0+r][·] = alpha·ot[d0+r][·] + Σ_{j<nj} v[j][d0+r] · p[j][·] for R dims, the rows
  // of v from `Values` (ValueRows) and the lanes that see each key from `Vis` (AllVisible,
  // Band, LaneRanges). A lane that does not see a key skips it rather than adding it with
  // p = 0, so a NaN or Inf in a value row reaches only the queries that see it (a boolean
  // attn_mask's hidden pairs are added with p = 0, as torch's math backend).
  template <int R, class Vis, class Values>
  static void pv_block(const Values& v, std::int64_t nj, const float* p, const float* alpha,
                       float* ot, const Vis& vis) {
    vec acc[R][NV] = {};
    for (std::int64_t j = 0; j < nj; ++j) {
      vec pv[NV];
      ivec visible[NV];
#pragma GCC unroll 8
      for (int u = 0; u < NV; ++u) pv[u] = S::load(p + j * Br + u * L);
      vis.lanes(j, visible);
      const float* vrow = v.row(j);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const vec vb = S::splat(vrow[r]);
#pragma GCC unroll 8
        for (int u = 0; u < NV; ++u) {
          const vec sum = S::fma(vb, pv[u], acc[r][u]);
          if constexpr (Vis::masks)
            acc[r][u] = visible[u] ? sum : acc[r][u];
          else
            acc[r][u] = sum;
        }
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int u = 0; u < NV; ++u) {
        float* o = ot + r * Br + u * L;
        S::store(o, S::fma(S::load(o), S::load(alpha + u * L), acc[r][u]));
      }
  }

  // ot ← alpha·ot + Vᵀ·P over nj keys; v points at key 0 of the tile, dims contiguous.
  // band: null for a tile no edge of the band crosses.
  static void pv_accumulate(const float* v, std::int64_t v_stride, std::int64_t nj, const float* p,
                            const float* alpha, std::int64_t D, float* ot,
                            const Band* band = nullptr) {
    if (band)
      pv_rows(ValueRows{v, v_stride}, nj, p, alpha, D, ot, *band);
    else
      pv_rows(ValueRows{v, v_stride}, nj, p, alpha, D, ot, AllVisible{});
  }

  // The same for any value and visibility policies, MD dims at a time.
  template <class Vis, class Values>
  static void pv_rows(const Values& v, std::int64_t nj, const float* p, const float* alpha,
                      std::int64_t D, float* ot, const Vis& vis) {
    for_blocks<MD>(D, [&](std::int64_t d, auto R) {
      pv_block<decltype(R)::value>(v.from_dim(d), nj, p, alpha, ot + d * Br, vis);
    });
  }

  // Fresh accumulators: m = −inf, l = 0, ot = 0.
  static void start_rows(float* m, float* l, float* ot, std::int64_t D) {
    for (int i = 0; i < Br; ++i) {
      m[i] = kNegInf;
      l[i] = 0.0f;
    }
    for (std::int64_t e = 0; e < D * Br; ++e) ot[e] = 0.0f;
  }

  // Natural-log logsumexp from the running max (log2 units) and sum.
  static float logsumexp(float m, float l) { return (m + std::log2(l)) * kLn2; }

  // 1/l, and 0 for a row that saw no key (l = 0); NaN stays NaN.
  static vec reciprocal(vec l) { return l == 0.0f ? S::zero() : 1.0f / l; }

  // st[j][i] ← st[j][i] / l[i] for nj rows (the naive path's normalise pass).
  static void normalize_rows(float* st, std::int64_t nj, const float* l) {
    vec inv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) inv[v] = reciprocal(S::load(l + v * L));
    for (std::int64_t j = 0; j < nj; ++j)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) S::store(st + j * Br + v * L, S::load(st + j * Br + v * L) * inv[v]);
  }

  // out[i0+i][d] = ot[d][i] / l[i] for the tile's rows; a row that saw no key is 0.
  static void store_output(const float* ot, const float* l, const detail::Problem& p,
                           std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t rows) {
    alignas(S::alignment) float inv[Br];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) S::store(inv + v * L, reciprocal(S::load(l + v * L)));
    const std::int64_t D = p.head_dim;
    with_element_type(p.out, p.out_dtype(), [&](const auto& e) {
      using E = std::remove_reference_t<decltype(*e.data)>;
      std::int64_t rows_done = 0, dims_done = 0;  // the block-transposed corner, as load_q
#if defined(FATTN_AVX512)
      if constexpr (L == 16) {
        // 16 rows × 16 dims through the registers, each row rounded to E 16 at a time.
        if (e.dim == 1) {
          rows_done = rows / L * L;
          dims_done = D / L * L;
          for (std::int64_t i = 0; i < rows_done; i += L)
            for (std::int64_t d = 0; d < dims_done; d += L) {
              __m512 block[L];
              for (int k = 0; k < L; ++k) block[k] = _mm512_load_ps(ot + (d + k) * Br + i);
              transpose16x16(block);
              for (int r = 0; r < L; ++r)
                store_rounded16(_mm512_mul_ps(block[r], _mm512_set1_ps(inv[i + r])), e.row(b, h, i0 + i + r) + d);
            }
        }
      }
#endif
      for (std::int64_t i = 0; i < rows; ++i) {
        E* orow = e.row(b, h, i0 + i);
        for (std::int64_t d = i < rows_done ? dims_done : 0; d < D; ++d)
          orow[d * e.dim] = from_float<E>(ot[d * Br + i] * inv[i]);
      }
    });
  }

  static void store_lse(const float* m, const float* l, const detail::Problem& p, std::int64_t b,
                        std::int64_t h, std::int64_t i0, std::int64_t rows) {
    if (!p.lse.data) return;
    for (std::int64_t i = 0; i < rows; ++i) *p.lse.row(b, h, i0 + i) = logsumexp(m[i], l[i]);
  }
};

}  // namespace fattn::cpu
