// fattn — the tile operations of the decode kernel (cpu/decode/decode.hpp): a few query rows
// against many keys, K and V read in place.
//
// A tile's query rows are those of every query head that shares one kv head (row
// r = i·G + g is query i of head hk·G + g), so each K and V row is read from memory once
// per kv head. Head dims run along the vector lanes; in the scores the keys do:
//   qs [R][Dp]   query rows, pre-scaled by scale·log2(e)   (Dp: D rounded up to the lanes)
//   kt [D][Bk]   one key tile, transposed from the cache's rows
//   st [R][Bk]   scores, rows × keys; becomes the probabilities P in place
//   os [R][Dp]   output accumulator, rows × head dims
//   m, l, alpha [R]  running max (log2 units), running sum, this tile's rescale factor
// With one or a few query rows a row of K serves every lane of a score vector (64 keys
// at once) and a row of V every lane of an output vector, where the prefill kernel's
// layout (queries along the lanes) would leave 15 of 16 lanes idle.
#pragma once

#include "cpu/common/isa_target.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "model/problem.hpp"
#include "cpu/common/blocks.hpp"
#include "cpu/decode/direct.hpp"
#include "cpu/decode/direct_avx2.hpp"
#include "cpu/decode/prefetch.hpp"
#include "cpu/common/elements.hpp"
#include "cpu/common/exp2.hpp"
#include "cpu/common/online_softmax.hpp"
#include "cpu/common/simd.hpp"
#include "cpu/common/tiling.hpp"
#include "cpu/common/transpose.hpp"

namespace fattn::cpu {

template <class S>
struct DecodeOps {
  using vec = typename S::vec;
  using T = DecodeTiling<S::lanes * static_cast<int>(sizeof(float))>;
  static constexpr int L = S::lanes;
  static constexpr int KV = T::key_vecs;
  static constexpr int Bk = KV * L;    // keys per tile
  static constexpr int MR = T::row_block;
  static constexpr int SR = T::score_rows;
  static constexpr int DV = T::dim_vecs;
  static constexpr int kKeyGroup = 16;  // rows contiguous in memory (a page holds whole groups)
  static constexpr int kGroups = Bk / kKeyGroup;
  static_assert(Bk % kKeyGroup == 0, "a key tile is a whole number of key groups");

  static constexpr float kLog2e = 1.4426950408889634f;
  static constexpr float kLn2 = 0.6931471805599453f;
  static constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  static std::int64_t padded_dim(std::int64_t D) { return (D + L - 1) / L * L; }

  // Rows of one key tile of K or V, elements of type E (the cache's dtype when read in
  // place, float32 when staged): group g's first row and the stride between rows.
  template <class E>
  struct Rows {
    const E* group[kGroups];
    std::int64_t stride, dim_stride;
    const E* row(std::int64_t j) const { return group[j / kKeyGroup] + (j % kKeyGroup) * stride; }
  };
  // Row r of kv head hk's group: query r / G of query head hk·G + r % G (G query heads
  // per kv head), so a tile's rows take every head of the group, query by query.
  struct GroupRow {
    std::int64_t head, query;
  };
  static GroupRow group_row(const detail::Problem& p, std::int64_t hk, std::int64_t r) {
    const std::int64_t G = p.group_size();
    return {hk * G + r % G, r / G};
  }

  // qs[r][d] = q[i][h][d] · factor for the rows [r0, r0 + rows) of kv head hk's group,
  // and where qb is given (bfloat16 inputs) qb[r][d] = the bits of q[i][h][d], zero past D.
  static void load_q_rows(const detail::Problem& p, std::int64_t b, std::int64_t hk,
                          std::int64_t r0, std::int64_t rows, float factor, float* qs,
                          std::uint16_t* qb) {
    const std::int64_t D = p.head_dim, Dp = padded_dim(D);
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto [h, i] = group_row(p, hk, r0 + r);
      float* row = qs + r * Dp;
      load_row(p.q, p.dtype, b, h, i, D, row);
      for (std::int64_t d = 0; d < D; ++d) row[d] *= factor;
      for (std::int64_t d = D; d < Dp; ++d) row[d] = 0.0f;
      if (!qb) continue;
      const auto q16 = detail::retype<const BFloat16>(p.q);
      const BFloat16* from = q16.row(b, h, i);
      for (std::int64_t d = 0; d < Dp; ++d) qb[r * Dp + d] = d < D ? from[d * q16.dim].bits : 0;
    }
  }

  // The next tile's rows, asked of the memory between blocks of this one's compute
  // (cpu/decode/prefetch.hpp).
  using Prefetch = TilePrefetch<kGroups, kKeyGroup>;

  // kt[d][j] = k[j][d] for the tile's nj keys; keys past nj are zero.
  // With contiguous dims, whole 16-key × 16-dim blocks go through registers (AVX-512;
  // AVX2: two 8×8 blocks per 8 dims), 16-bit rows widened on the way in by load_vec.
  template <class E>
  static void transpose_keys(const Rows<E>& k, std::int64_t nj, std::int64_t D, float* kt,
                             Prefetch& next) {
    for (int g = 0; g < kGroups; ++g) {
      const std::int64_t n = std::clamp<std::int64_t>(nj - g * kKeyGroup, 0, kKeyGroup);
      float* dst = kt + g * kKeyGroup;
      std::int64_t dims_done = 0;
#if defined(FATTN_AVX512)
      if constexpr (L == 16) {
        if (n == kKeyGroup && k.dim_stride == 1) {
          dims_done = D / 16 * 16;
          for (std::int64_t d = 0; d < dims_done; d += 16) {
            __m512 r[kKeyGroup];
            for (int j = 0; j < kKeyGroup; ++j) r[j] = load_row_vec<S>(k.group[g] + j * k.stride, d);
            transpose16x16(r);
            for (int j = 0; j < kKeyGroup; ++j) _mm512_storeu_ps(dst + (d + j) * Bk, r[j]);
            next.issue(Prefetch::kRowsPerBlock);
          }
        }
      }
#elif defined(FATTN_AVX)
      if constexpr (L == 8) {
        if (n == kKeyGroup && k.dim_stride == 1) {
          dims_done = D / L * L;
          for (std::int64_t d = 0; d < dims_done; d += L) {
            for (int h = 0; h < kKeyGroup; h += L) {
              __m256 r[L];
              for (int j = 0; j < L; ++j) r[j] = load_row_vec<S>(k.group[g] + (h + j) * k.stride, d);
              transpose8x8(r);
              for (int j = 0; j < L; ++j) _mm256_storeu_ps(dst + (d + j) * Bk + h, r[j]);
            }
            // the rows asked for per 16 × 16 elements, as with AVX-512
            if (d % kKeyGroup == L) next.issue(Prefetch::kRowsPerBlock);
          }
        }
      }
#endif
      for (std::int64_t d = dims_done; d < D; ++d)
        for (std::int64_t j = 0; j < kKeyGroup; ++j)
          dst[d * Bk + j] = j < n ? row_value(k.group[g] + j * k.stride, d, k.dim_stride) : 0.0f;
      next.issue(Prefetch::kRowsPerBlock);
    }
  }

  // Copies keys [j0, j0 + nj) of kv heads [hk_begin, hk_end) of K or V into
  // stage[h][j][Dp] (contiguous, zero-padded dims), reading key by key and head by head:
  // in a (B, S, Hkv, D) cache that is address order, so the hardware prefetchers stream
  // whole pages, where one head's rows alone sit a page apart (Hkv·D = 1024 floats).
  // Decode, Sk = 64k, Hkv = 8, D = 128, 2 threads: 13.7 → 15.9 GB/s in that layout,
  // 16 → 20 GB/s in (B, Hkv, S, D) (docs/perf-log.md, "Decode kernel").
  static void stage_rows(const detail::Problem& p, const detail::Strided<const float>& t,
                         std::int64_t b, std::int64_t hk_begin, std::int64_t hk_end,
                         std::int64_t j0, std::int64_t nj, float* stage) {
    const std::int64_t D = p.head_dim, Dp = padded_dim(D);
    with_kv_element_type(t, p.kv_dtype(), [&](const auto& e) {
      for (std::int64_t j = 0; j < nj; ++j)
        for (std::int64_t hk = hk_begin; hk < hk_end; ++hk) {
          float* dst = stage + ((hk - hk_begin) * Bk + j) * Dp;
          convert_row(e.row(b, hk, j0 + j), e.dim, D, dst);
          std::fill(dst + D, dst + Dp, 0.0f);
        }
    });
  }
  // Whether the cache's K and V rows can be read where they are (dims contiguous, D a
  // whole number of vectors; float32, 16-bit or q8_0 elements, widened as they are
  // loaded) rather than staged.
  static bool reads_in_place(const detail::Problem& p) {
    return p.k.dim == 1 && p.v.dim == 1 && padded_dim(p.head_dim) == p.head_dim;
  }
  // Keys [j0, j0 + nj) of kv head hk where they lie in the cache (t retyped to its
  // element type). A key group sits in one page (block sizes are multiples of 16, j0 of
  // Bk); groups past nj are not looked up, so no block-table entry past the sequence is read.
  template <class E>
  static Rows<E> in_cache(const detail::Problem& p, const detail::Strided<const E>& t,
                          std::int64_t b, std::int64_t hk, std::int64_t j0, std::int64_t nj) {
    Rows<E> r{{}, t.seq, t.dim};
    for (int g = 0; g < kGroups; ++g)
      r.group[g] = g * kKeyGroup < nj ? t.row(b, hk, j0 + g * kKeyGroup) : nullptr;
    return r;
  }
  // One head's staged rows.
  static Rows<float> staged(const float* stage, std::int64_t head, std::int64_t D) {
    const std::int64_t Dp = padded_dim(D);
    Rows<float> r{{}, Dp, 1};
    for (int g = 0; g < kGroups; ++g) r.group[g] = stage + (head * Bk + g * kKeyGroup) * Dp;
    return r;
  }

  // st[r][·] = Σ_d qs[r][d] · kt[d][·] for R rows, the head dim in chains summed
  // pairwise (sum_chains).
  template <int R>
  static void scores_block(const float* qs, std::int64_t Dp, std::int64_t D, const float* kt,
                           float* st, Prefetch& next) {
    vec acc[R][KV];
    dim_sums<S>(
        D, acc, [&](std::int64_t d, int r) { return qs[r * Dp + d]; },
        [&](std::int64_t d, int u) { return S::load(kt + d * Bk + u * L); },
        [&] { next.issue_line(); });
    store_block<S>(acc, st, Bk);
  }

  // Scores of the key tile against `rows` query rows; the rows of `next` the transpose
  // left are asked for a line per dim of the row blocks, not all at once before them.
  static void scores(const float* qs, std::int64_t rows, std::int64_t D, const float* kt,
                     float* st, Prefetch& next) {
    const std::int64_t Dp = padded_dim(D);
    for_blocks<SR>(rows, [&](std::int64_t r, auto R) {
      scores_block<decltype(R)::value>(qs + r * Dp, Dp, D, kt, st + r * Bk, next);
    });
    next.issue_rest();
  }

  // Scores of one key tile: straight from the key rows for a few rows (AVX-512,
  // cpu/decode/direct.hpp; AVX2, cpu/decode/direct_avx2.hpp), else through the transposed tile kt. Either way `next` is
  // asked for between blocks, and for the rest at the end. (A bfloat16 cache on
  // AVX512-BF16 takes cpu/decode/bf16.hpp instead.)
  template <class E>
  static void tile_scores(const float* qs, std::int64_t rows, std::int64_t D, const Rows<E>& k,
                          std::int64_t nj, float* kt, float* st, Prefetch& next) {
#if defined(FATTN_AVX512)
    if constexpr (L == 16) {
      if (direct_scores(rows, k.dim_stride == 1)) {
#if defined(FATTN_AVX512_BF16)
        // The AVX512-BF16 table runs a bfloat16 cache's scores on vdpbf16ps (bf16.hpp);
        // the split pairs serve the AVX-512 table, where the FMA choice sends bfloat16.
        constexpr bool kSplitPairs = false;
#else
        constexpr bool kSplitPairs = std::is_same_v<E, BFloat16>;
#endif
        if constexpr (kSplitPairs) {
          // the rows arranged for SplitBf16Products in kt, which the direct scores leave
          // unused (kt holds Dp·Bk floats, rows ≤ kDirectRows < Bk)
          SplitBf16Products::split_pairs(qs, rows, padded_dim(D), kt);
          DirectScores<Rows<E>, SplitBf16Products>::scores(kt, rows, padded_dim(D), k, nj, Bk,
                                                           1.0f, st, next);
        } else if constexpr (std::is_same_v<E, Q8_0>) {
          DirectScores<Rows<E>, Q8_0Products>::scores(qs, rows, padded_dim(D), k, nj, Bk, 1.0f,
                                                      st, next);
        } else {
          DirectScores<Rows<E>, FmaProducts<E>>::scores(qs, rows, padded_dim(D), k, nj, Bk,
                                                        1.0f, st, next);
        }
        next.issue_rest();
        return;
      }
    }
#elif defined(FATTN_AVX)
    if constexpr (L == 8) {
      if (direct_scores(rows, k.dim_stride == 1)) {
        DirectScoresAvx2<Rows<E>>::scores(qs, rows, padded_dim(D), k, nj, Bk, st, next);
        next.issue_rest();
        return;
      }
    }
#endif
    transpose_keys(k, nj, D, kt, next);
    scores(qs, rows, D, kt, st, next);
  }
  // Rows up to which the scores skip the transpose (cpu/decode/direct.hpp, in blocks of 4
  // rows: GQA 8:1 in two passes over the tile's rows from L1/L2), for every element type.
  // At 4 rows (GQA 4:1), keys in L2: 37.7 → 48.9 GB/s per core. At 8 rows two passes cost
  // less than the transpose and its stores: on AVX2 for every element type (dev-zen3, B 8,
  // Hkv 4, 32k keys, 2 threads, ms: float32 140-149 → 113-126, float16 104-106 → 82-92,
  // bfloat16 112-125 → 71-89, q8_0 115-120 → 68-81; docs/perf-log.md 2026-12-07); on
  // AVX-512 for float32 and q8_0 (float32 B 8 32k 71-74 → 57-65 ms; 2026-12-06), and for
  // 16-bit caches since the direct block is inlined (one core, keys in L2, GFLOP/s: float16
  // 67-68 → 84, bfloat16 104-105 → 128-131; 2 threads, 32k keys, ms: float16 B 1
  // 4.8-5.0 → 3.6-3.9, B 8 39-42 → 29-33, bfloat16 B 1 4.3 → 2.7, B 8 37 → 26; dev-zen4,
  // docs/perf-log.md 2026-12-08).
  static constexpr std::int64_t kDirectRows = 8;
  // Whether tile_scores multiplies the key rows where they lie for `rows` query rows (keys
  // of any element type, their dims contiguous or not), rather than through the
  // transposed tile: the rule tile_scores follows and forward_plan reports.
  static constexpr bool direct_scores(std::int64_t rows, bool dims_contiguous) {
#if defined(FATTN_AVX512)
    if constexpr (L == 16) return dims_contiguous && rows <= kDirectRows;
#elif defined(FATTN_AVX)
    if constexpr (L == 8) return dims_contiguous && rows <= kDirectRows;
#endif
    return false;
  }

  // Across the lanes: with AVX-512 / AVX2 in a tree of shuffles (4 / 3 steps, not 15 / 7
  // scalar ones), the same tree for the max and the sum.
  // A NaN lane may or may not win the max; either way its row's probabilities become
  // NaN in softmax_update, through exp2 of the NaN score.
  enum class LaneReduction { max, sum };
  template <LaneReduction kOp>
  static float across_lanes(vec x) {
    constexpr bool kMax = kOp == LaneReduction::max;
#if defined(FATTN_AVX512)
    if constexpr (L == 16) return kMax ? _mm512_reduce_max_ps(x) : _mm512_reduce_add_ps(x);
#endif
#if defined(FATTN_AVX)
    if constexpr (L == 8) {
      __m128 h = kMax ? _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1))
                      : _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
      h = kMax ? _mm_max_ps(h, _mm_movehl_ps(h, h)) : _mm_add_ps(h, _mm_movehl_ps(h, h));
      return _mm_cvtss_f32(kMax ? _mm_max_ss(h, _mm_movehdup_ps(h))
                                : _mm_add_ss(h, _mm_movehdup_ps(h)));
    }
#endif
    if constexpr (kMax) {
      float m = x[0];
      for (int i = 1; i < L; ++i) m = x[i] > m ? x[i] : m;
      return m;
    }
    float s = 0.0f;
    for (int i = 0; i < L; ++i) s += x[i];
    return s;
  }
  // Named instances, not wrappers: a wrapper's extra call level changed GCC 12's inlining
  // across the kernel units (objdump).
  static constexpr float (*max_of)(vec) = across_lanes<LaneReduction::max>;
  static constexpr float (*sum_of)(vec) = across_lanes<LaneReduction::sum>;

  // Online softmax of each row over its visible keys: keys [visible[r], Bk) of row r get
  // probability 0; new running max m, alpha = 2^(m_old − m_new), st ← 2^(st − m_new),
  // l ← alpha·l + Σ st. A row that has seen no key keeps m = −inf and uses 0 as its
  // reference, so its probabilities are exactly 0 rather than NaN.
  static void softmax_update(float* st, std::int64_t rows, const std::int32_t* visible, float* m,
                             float* l, float* alpha) {
    for (std::int64_t r = 0; r < rows; ++r) {  // OnlineSoftmax's row form, reduced as above
      float* s = st + r * Bk;
      for (std::int64_t j = visible[r]; j < Bk; ++j) s[j] = kNegInf;
      OnlineSoftmax<S>::template update_row<KV, DecodeOps>(s, &m[r], &l[r], &alpha[r]);
    }
  }

  // os[r][d0 + ·] = alpha·os + Σ_j p[r][j] · v[j][d0 + ·] for R rows and NDV dim vectors.
  // Keys a row does not see (causal, on the diagonal tile) are skipped, not added with
  // p = 0, so a NaN or Inf in a value row reaches only the rows that see it.
  template <int R, int NDV, bool Masked, class E>
  static void pv_block(const float* p, const std::int32_t* visible, std::int64_t nj,
                       const Rows<E>& v, std::int64_t d0, const float* alpha, std::int64_t Dp,
                       float* os) {
    vec acc[R][NDV] = {};
    // Key group by key group: within one, the rows are a pointer step apart.
    for (std::int64_t j0 = 0; j0 < nj; j0 += kKeyGroup) {
      const E* vrow = v.group[j0 / kKeyGroup];
      const std::int64_t j1 = std::min<std::int64_t>(nj, j0 + kKeyGroup);
      for (std::int64_t j = j0; j < j1; ++j, vrow += v.stride) {
        vec vv[NDV];
        load_row_vecs<S>(vrow, d0, vv);
        rank1_update<S>(acc, [=](int r) { return p[r * Bk + j]; }, vv,
                        [=](int r) { return Masked && j >= visible[r]; });
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int u = 0; u < NDV; ++u) {
        float* o = os + r * Dp + d0 + u * L;
        S::store(o, S::fma(S::load(o), S::splat(alpha[r]), acc[r][u]));
      }
  }

  template <int R, bool Masked, class E>
  static void pv_rows(const float* p, const std::int32_t* visible, std::int64_t nj,
                      const Rows<E>& v, const float* alpha, std::int64_t Dp, float* os) {
    std::int64_t d = 0;
    for (; d + DV * L <= Dp; d += DV * L) pv_block<R, DV, Masked>(p, visible, nj, v, d, alpha, Dp, os);
    for (; d < Dp; d += L) pv_block<R, 1, Masked>(p, visible, nj, v, d, alpha, Dp, os);
  }
  // The rows of P·V in blocks of MR, the last one shorter: f(r, R, masked) for the block
  // of R rows (a std::integral_constant) starting at row r, masked where some of its rows
  // do not see every key of [0, nj). pv_accumulate and DecodeValuesBf16 run on it.
  template <class F>
  static void pv_row_blocks(std::int64_t rows, const std::int32_t* visible, std::int64_t nj, F&& f) {
    for_blocks<MR>(rows, [&](std::int64_t r, auto R) {
      bool masked = false;
      for (int i = 0; i < decltype(R)::value; ++i) masked |= visible[r + i] < nj;
      f(r, R, masked);
    });
  }

  // os ← alpha·os + P·V over the keys each row sees (visible[r] ≤ nj, nj ≤ Bk).
  // V rows must hold Dp contiguous elements (in place, or stage_rows).
  template <class E>
  static void pv_accumulate(const float* p, std::int64_t rows, const std::int32_t* visible,
                            std::int64_t nj, const Rows<E>& v, const float* alpha, std::int64_t D,
                            float* os) {
    const std::int64_t Dp = padded_dim(D);
    pv_row_blocks(rows, visible, nj, [&](std::int64_t r, auto R, bool masked) {
      constexpr int n = decltype(R)::value;
      if (masked) return pv_rows<n, true>(p + r * Bk, visible + r, nj, v, alpha + r, Dp, os + r * Dp);
      pv_rows<n, false>(p + r * Bk, visible + r, nj, v, alpha + r, Dp, os + r * Dp);
    });
  }

  // Fresh accumulators: m = −inf, l = 0, os = 0.
  static void start_rows(std::int64_t rows, std::int64_t D, float* m, float* l, float* os) {
    std::fill(m, m + rows, kNegInf);
    std::fill(l, l + rows, 0.0f);
    std::fill(os, os + rows * padded_dim(D), 0.0f);
  }

  // 1/l, and 0 for a row that saw no key (l = 0); NaN stays NaN.
  static float reciprocal(float l) { return l == 0.0f ? 0.0f : 1.0f / l; }
  static float logsumexp(float m, float l) { return (m + std::log2(l)) * kLn2; }
};

}  // namespace fattn::cpu
