// fattn — the vector passes of the AMX backward for one key tile × query tile, and the
// prefetch that runs among its tile products.
//   split_probs   P = 2^(S − lse2), hidden pairs 0; split by rows
//   split_grads   dS = P ∘ (dP − Δ), hidden pairs 0; split by rows and by key pairs
// Layouts (AmxOps): st, dst [Bc][Br] (keys × queries); rows parts [Bc][3][Br] (A operands
// of rows_tile); key-pair parts [Bc/2][3][Br][2] (the B operand of pv_tile). Rows from nj
// to the next multiple of 32 (the products' reduction step) are written as zeros.
//
// The passes run between the products, not in slices among them as the forward's softmax
// does: interleaved, each took longer than on its own (the tile unit and the vector units
// did not overlap here), and the kernel was 2-3 % slower (docs/perf-log.md, "AMX backward").
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#include <cstdint>

#include "cpu/amx/ops.hpp"
#include "cpu/backward/workspace.hpp"

namespace fattn::cpu {

// Brings the next query tile's operands into L2 a few lines per step, during the products
// of the current one (AmxOps::mma_split calls step() after every four products). Without
// it the tile loads of operands from beyond L2 stall the products: S=4096 D=64 5-10 %
// slower (docs/perf-log.md, "AMX backward").
class PrefetchTask {
 public:
  // ~1800 lines a query tile over ~700 steps at D=64. 1, 2, 4 and 8 lines a step timed
  // alike within this VM's noise (S=4096 D=64: 364-404 ms, no order; perf-log).
  static constexpr int kLinesPerStep = 4;
  static constexpr int kMaxRanges = 4;

  void start() {
    n_ = 0;
    range_ = 0;
    at_ = 0;
  }
  void add(const void* data, std::int64_t bytes) {
    if (n_ < kMaxRanges) ranges_[n_++] = {static_cast<const char*>(data), bytes};
  }
  // Returns false: nothing here has to be finished (the products' drain loop stops).
  bool step() {
    for (int line = 0; line < kLinesPerStep; ++line) {
      while (range_ < n_ && at_ >= ranges_[range_].bytes) {
        ++range_;
        at_ = 0;
      }
      if (range_ == n_) return false;
      _mm_prefetch(ranges_[range_].data + at_, _MM_HINT_T1);
      at_ += 64;
    }
    return false;
  }

 private:
  struct Range {
    const char* data;
    std::int64_t bytes;
  };
  Range ranges_[kMaxRanges] = {};
  int n_ = 0, range_ = 0;
  std::int64_t at_ = 0;
};

template <class S>
struct AmxBackwardOps {
  using Ops = AmxOps<S>;
  using Fma = typename Ops::Fma;
  using Parts = typename Ops::Parts;
  using vec = typename S::vec;
  static constexpr int NV = Fma::NV, L = Fma::L, Br = Fma::Br;
  static constexpr std::int64_t kRowParts = Ops::kParts * Br;  // one key's row of parts
  static_assert(NV % 2 == 0, "row parts are stored two vectors at a time");

  // --- the operands, split once per call (naive) or per work item (fused) ----------------
  // Keys [first, first + n) of kv head (b, hk): K and V by rows [n_pad][3][Dp] (A of the
  // score products), Kᵀ per 96 keys [n_pad/96][Dp][3][96] (A of dQ). False: some value
  // does not split.
  static bool split_keys(const detail::Problem& p, std::int64_t b, std::int64_t hk,
                         std::int64_t first, std::int64_t n, bf16* k, bf16* v, bf16* kt) {
    auto from = [&](const detail::Strided<const float>& t) {
      return detail::Strided<const float>{t.data + first * t.seq, t.batch, t.head, t.seq, t.dim};
    };
    bool ok = Ops::pack_k(from(p.k), b, hk, n, p.head_dim, k);
    ok &= Ops::pack_k(from(p.v), b, hk, n, p.head_dim, v);
    ok &= Ops::pack_v_transposed(from(p.k), b, hk, n, p.head_dim, kt);
    return ok;
  }

  // A query tile's operands: Q·scale·log2(e) and dO with the dims paired [Dp/2][3][Br][2]
  // (B of the score products), Q and dO with the queries paired [Br/2][3][Dp][2] (B of dK
  // and dV; each 3·Dp·Br bf16), and its rows' lse2 and Δ. scratch: Dp·Br floats.
  struct QueryOperands {
    bf16 *q_dims, *do_dims, *q_rows, *do_rows;
    float *lse2, *delta;
  };
  static std::int64_t query_operand_floats(std::int64_t Dp) { return Ops::kParts * Dp * Br / 2; }
  static bool split_query_tile(const detail::Problem& p, const QueryTile& x, float* scratch,
                               const QueryOperands& to) {
    const std::int64_t D = p.head_dim, Dp = Ops::round_up(D), rows_end = x.i0 + x.rows;
    Fma::load_q_transposed(p.q, p.dtype, x.b, x.h, x.i0, x.rows, D,
                           static_cast<float>(p.scale) * Fma::kLog2e, scratch);
    bool ok = Ops::split_pairs(scratch, D, Dp, to.q_dims);
    Fma::load_q_transposed(p.dout, p.dtype, x.b, x.h, x.i0, x.rows, D, 1.0f, scratch);
    ok &= Ops::split_pairs(scratch, D, Dp, to.do_dims);
    ok &= Ops::pack_row_pairs(p.q, x.b, x.h, x.i0, rows_end, D, to.q_rows);
    ok &= Ops::pack_row_pairs(p.dout, x.b, x.h, x.i0, rows_end, D, to.do_rows);
    query_row_stats<S>(p, x, Br, to.lse2, to.delta);
    return ok;
  }

  // --- the vector passes ------------------------------------------------------------------
  // Lanes of query vector v that see key j of the tile: those from the band's first
  // seeing query to its last (all, on a tile no edge of the band crosses).
  static __mmask16 visible(const typename Fma::Band* band, std::int64_t j, int v) {
    if (!band) return 0xFFFF;
    return Ops::visible_lanes(band->first_seeing(j), v) &
           static_cast<__mmask16>(~Ops::visible_lanes(band->end_seeing(j), v));
  }

  // The parts of query vectors v, v+1 (x0, x1) of one key's row: per part one
  // AVX512-BF16 conversion of both (exact: a part's low 16 bits are zero), 64 bytes.
  // Against a shift and a 2-uop narrowing per part and vector: split_probs 16 → 12
  // cycles a vector on its own (docs/perf-log.md, "AMX backward").
  static void store_row_parts(bf16* row, int v, const Parts& x0, const Parts& x1) {
    auto both = [](__m512i a, __m512i b) {
      return (__m512i)_mm512_cvtne2ps_pbh(_mm512_castsi512_ps(b), _mm512_castsi512_ps(a));
    };
    _mm512_storeu_si512(row + v * L, both(x0.hi, x1.hi));
    _mm512_storeu_si512(row + Br + v * L, both(x0.mid, x1.mid));
    _mm512_storeu_si512(row + 2 * Br + v * L, both(x0.lo, x1.lo));
  }

  // st[j] ← P = 2^(st[j] − lse2) for the keys j < nj, 0 where hidden; P split by rows
  // into p_rows. P is finite (exp2 saturates at 2^127) unless a score or lse2 is NaN,
  // which reaches dS, where split_grads checks.
  static void split_probs(float* st, const float* lse2, std::int64_t nj,
                          const typename Fma::Band* diag, bf16* p_rows) {
    vec lse[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) lse[v] = S::load(lse2 + v * L);
    for (std::int64_t j = 0; j < Ops::round_up(nj); ++j) {
      float* s = st + j * Br;
      Parts parts[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        vec p = S::zero();
        if (j < nj) {
          p = _mm512_maskz_mov_ps(visible(diag, j, v), exp2<S>(S::load(s + v * L) - lse[v]));
          S::store(s + v * L, p);
        }
        parts[v] = Ops::split(p);
      }
#pragma GCC unroll 8
      for (int v = 0; v < NV; v += 2) store_row_parts(p_rows + j * kRowParts, v, parts[v], parts[v + 1]);
    }
  }

  // Rows [0, nj) of src ([keys][Br] float32: the naive backward's stored P or dS) split
  // by rows into rows parts; the rows from nj to the next multiple of 32 are zeros.
  static void split_rows(const float* src, std::int64_t nj, bf16* rows) {
    for (std::int64_t j = 0; j < Ops::round_up(nj); ++j) {
      Parts parts[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) parts[v] = Ops::split(j < nj ? S::load(src + j * Br + v * L) : S::zero());
#pragma GCC unroll 8
      for (int v = 0; v < NV; v += 2) store_row_parts(rows + j * kRowParts, v, parts[v], parts[v + 1]);
    }
  }

  // dS = P ∘ (dst − delta) (· cap, 1 − tanh² of the scores, with softcap) for the keys
  // j < nj, 0 where hidden (there dP and cap may be anything: the score products skip
  // hidden blocks), split by rows into ds_rows and by key pairs into ds_pairs. Returns
  // false if some dS does not split (an overflow, or a NaN).
  static bool split_grads(const float* probs, const float* dst, const float* delta,
                          const float* cap, std::int64_t nj, const typename Fma::Band* diag,
                          bf16* ds_rows, bf16* ds_pairs) {
    vec dl[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) dl[v] = S::load(delta + v * L);
    __mmask16 bad = 0;
    auto grad = [&](std::int64_t j, int v) -> vec {
      if (j >= nj) return S::zero();
      vec ds = S::load(probs + j * Br + v * L) * (S::load(dst + j * Br + v * L) - dl[v]);
      if (cap) ds = ds * S::load(cap + j * Br + v * L);
      const vec shown = _mm512_maskz_mov_ps(visible(diag, j, v), ds);
      bad |= Ops::not_splittable(shown);
      return shown;
    };
    for (std::int64_t j = 0; j < Ops::round_up(nj); j += 2) {  // a key pair: split once
      bf16* pairs = ds_pairs + j / 2 * Ops::kPairRows;
      Parts a[NV], b[NV];  // keys j and j+1
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        a[v] = Ops::split(grad(j, v));
        b[v] = Ops::split(grad(j + 1, v));
        _mm512_store_si512(pairs + 2 * v * L, Ops::pair(a[v].hi, b[v].hi));
        _mm512_store_si512(pairs + Ops::kPairRow + 2 * v * L, Ops::pair(a[v].mid, b[v].mid));
        _mm512_store_si512(pairs + 2 * Ops::kPairRow + 2 * v * L, Ops::pair(a[v].lo, b[v].lo));
      }
#pragma GCC unroll 8
      for (int v = 0; v < NV; v += 2) {
        store_row_parts(ds_rows + j * kRowParts, v, a[v], a[v + 1]);
        store_row_parts(ds_rows + (j + 1) * kRowParts, v, b[v], b[v + 1]);
      }
    }
    return bad == 0;
  }
};

}  // namespace fattn::cpu
#endif
