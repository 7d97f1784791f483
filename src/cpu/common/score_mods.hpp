// fattn — the variants on the CPU kernels' score tiles: softcap, ALiBi, attn_mask, sinks.
//
// Tiles as in tile_ops.hpp: st [Bc][Br], keys × queries, scores in log2 units (Q carries
// scale·log2(e)), so every change below is made in log2 units too:
//   softcap  st ← c·tanh(st / c) with c = softcap·log2(e)   (the same function, rescaled)
//   ALiBi    st ← st − slope·log2(e)·|i + Sk − Sq − j|
//   mask     boolean false → −inf; additive: st ← st + mask·log2(e)
// The causal limit and the window are not here: they are the band (tile_ops.hpp), whose
// tiles outside are never visited.
//
// A tile's attn_mask is read once, before its scores are computed (mask_cover): a tile
// whose mask hides every pair is skipped like a tile outside the band, and a tile whose
// mask hides none (boolean all true, additive all zero) is left as it is. Reading the
// mask is a compare per byte (a boolean padding mask broadcast over queries: Bc bytes per
// tile), against the tile's Bc·Br·D multiply-adds.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/common/online_softmax.hpp"
#include "cpu/common/tile_ops.hpp"
#include "model/tanh_fit.hpp"

namespace fattn::cpu {

// What an attn_mask says of a tile: every pair hidden, every pair unchanged, or mixed.
enum class MaskCover : std::uint8_t { hidden, unchanged, mixed };

template <class S>
struct ScoreModOps {
  using Ops = TileOps<S>;
  using vec = typename S::vec;
  static constexpr int L = S::lanes, NV = Ops::NV, Br = Ops::Br;

  // A query row of a tile: query `query` of head `head`.
  struct LanePair {
    std::int64_t head, query;
  };
  // The pairs of one score tile: sequence b's keys [j0, j0 + nj) against `rows` query rows
  // along the lanes. Lane r is query i0 + r of head h (the fused kernel's tiles), or, where
  // `lanes` is set, lanes[r] (the decode kernel's query-lane tiles, whose rows mix the
  // query heads of one kv head: DecodeOps::group_row).
  struct Tile {
    std::int64_t b, h, i0, rows, j0, nj;
    const LanePair* lanes = nullptr;
    // Lane r's pair; lanes past the rows (never stored) take the last row's.
    LanePair pair(std::int64_t r) const {
      if (r >= rows) r = rows - 1;
      return lanes ? lanes[r] : LanePair{h, i0 + r};
    }
  };

  // The mask's elements of the tile's row r: keys j0.. at stride `key`.
  template <class E>
  static const E* mask_row(const detail::ScoreMods& m, const Tile& t, std::int64_t r) {
    const LanePair at = t.pair(r);
    return static_cast<const E*>(m.mask) + t.b * m.mask_batch + at.head * m.mask_head +
           at.query * m.mask_seq + t.j0 * m.mask_key;
  }
  // Rows whose mask rows differ: 1 when every row reads the same one (a mask broadcast
  // over queries, and over heads where the rows mix them).
  static std::int64_t mask_rows(const detail::ScoreMods& m, const Tile& t) {
    return m.mask_seq == 0 && (!t.lanes || m.mask_head == 0) ? 1 : t.rows;
  }

  // Calls f with a null pointer of the mask's element type.
  template <class F>
  static decltype(auto) with_mask_type(const detail::ScoreMods& m, F&& f) {
    switch (m.mask_dtype) {
      case DType::boolean: return f(static_cast<const std::uint8_t*>(nullptr));
      case DType::bfloat16: return f(static_cast<const BFloat16*>(nullptr));
      case DType::float16: return f(static_cast<const Float16*>(nullptr));
      default: return f(static_cast<const float*>(nullptr));
    }
  }

  static MaskCover mask_cover(const detail::Problem& p, const Tile& t) {
    const detail::ScoreMods& m = p.mods;
    if (!m.mask) return MaskCover::unchanged;
    return with_mask_type(m, [&](auto type) {
      using E = std::remove_cv_t<std::remove_pointer_t<decltype(type)>>;
      bool any_visible = false, any_changed = false;
      for (std::int64_t i = 0; i < mask_rows(m, t); ++i) {
        const E* row = mask_row<E>(m, t, i);
        if constexpr (std::is_same_v<E, std::uint8_t>) {
          unsigned any = 0, all = 1;  // OR and AND of the bytes: vectorised reductions
          for (std::int64_t j = 0; j < t.nj; ++j) {
            any |= row[j * m.mask_key];
            all &= row[j * m.mask_key] != 0;
          }
          any_visible |= any != 0;
          any_changed |= all == 0;
        } else {
          for (std::int64_t j = 0; j < t.nj; ++j) {
            const float x = to_float(row[j * m.mask_key]);
            any_visible |= x != -INFINITY;
            any_changed |= x != 0.0f;
          }
        }
        if (any_visible && any_changed) return MaskCover::mixed;
      }
      return !any_visible ? MaskCover::hidden : any_changed ? MaskCover::mixed
                                                            : MaskCover::unchanged;
    });
  }

  // cap2·tanh(u), u = x / cap2, for scores x in log2 units (cap2 = softcap·log2(e));
  // grad ← 1 − tanh². tanh is model/tanh_fit.hpp's rational fit (relative error 3.1e-7).
  // One division and nine FMAs: the first form, (1 − e)/(1 + e) with e = e^(−2|u|) and a
  // series where 1 − e cancels, cost +17 % over the plain kernel at D = 64 (perf-log).
  static vec softcap(vec x, float cap2, vec* grad) {
    using namespace detail;  // the fit's coefficients
    const vec u = S::at_most(x < 0.0f ? -x : x, kTanhClamp * cap2) * S::splat(1.0f / cap2);
    const vec z = u * u;
    const vec num = horner<S>(z, kTanhP4, kTanhP3, kTanhP2, kTanhP1, kTanhP0);
    const vec den = horner<S>(z, kTanhQ4, kTanhQ3, kTanhQ2, kTanhQ1, kTanhQ0);
    vec t = u * num / den;
    t = x < 0.0f ? -t : t;
    if (grad) *grad = S::splat(1.0f) - t * t;
    return t * S::splat(cap2);
  }

  // Applies softcap, ALiBi and (unless the cover says unchanged) the mask to the tile's
  // scores st. cap_grad [nj][Br], when not null, receives d(capped)/d(score) = 1 − tanh²
  // (the backward's chain rule through the softcap).
  static void apply(const detail::Problem& p, const Tile& t, MaskCover cover, float* st,
                    float* cap_grad = nullptr) {
    const detail::ScoreMods& m = p.mods;
    if (m.softcap != 0.0) {
      const float cap2 = static_cast<float>(m.softcap) * Ops::kLog2e;
      for (std::int64_t e = 0; e < t.nj * Br; e += L) {
        vec grad;
        S::store(st + e, softcap(S::load(st + e), cap2, cap_grad ? &grad : nullptr));
        if (cap_grad) S::store(cap_grad + e, grad);
      }
    }
    if (m.alibi) add_alibi(p, t, st);
    if (m.mask && cover == MaskCover::mixed) apply_mask(p, t, st);
  }

  // A tile's scores as the softmax takes them, on every kernel whose tiles are st [Bc][Br]
  // (the fused forward and backward, the AMX forward's float32 tiles): the variants
  // (apply), then, on a tile an edge of the band crosses (band not null), the pairs
  // outside it hidden (−inf, by selection: whatever the variants made of those scores).
  static void finish_scores(const detail::Problem& p, const Tile& t, MaskCover cover,
                            const typename Ops::Band* band, float* st, float* cap_grad = nullptr) {
    if (p.mods.any()) apply(p, t, cover, st, cap_grad);
    if (band) Ops::mask_tile(st, t.nj, *band);
  }

  // st[j][r] −= slope·log2(e)·|i + Sk − Sq − j0 − j| for lane r's pair (head, i): the
  // slope and the offset i + Sk − Sq − j0 per lane (integers, exact in float32 below 2^24).
  static void add_alibi(const detail::Problem& p, const Tile& t, float* st) {
    alignas(S::alignment) float slope[Br], offset[Br];
    const std::int64_t shift = p.keys_of(t.b) - p.q_len - t.j0;
    for (int r = 0; r < Br; ++r) {
      const LanePair at = t.pair(r);
      slope[r] = -static_cast<float>(p.mods.slope(t.b, at.head)) * Ops::kLog2e;
      offset[r] = static_cast<float>(at.query + shift);
    }
    vec slope2[NV], lane[NV];
#pragma GCC unroll 8
    for (int u = 0; u < NV; ++u) {
      slope2[u] = S::load(slope + u * L);
      lane[u] = S::load(offset + u * L);
    }
    for (std::int64_t j = 0; j < t.nj; ++j) {
      const vec key = S::splat(static_cast<float>(j));
#pragma GCC unroll 8
      for (int u = 0; u < NV; ++u) {
        const vec distance = lane[u] - key;
        float* s = st + j * Br + u * L;
        S::store(s, S::fma(distance < 0.0f ? -distance : distance, slope2[u], S::load(s)));
      }
    }
  }

  // An additive mask's factor for head h in log2 units: log2(e) · attn_mask_scale[h].
  static float mask_factor(const detail::ScoreMods& m, std::int64_t h) {
    return static_cast<float>(m.mask_scale_of(h)) * Ops::kLog2e;
  }

  // A score (log2 units) changed by one mask element: hidden (boolean false) or shifted
  // by the element times `factor` (mask_factor; a −inf element stays −inf, factor > 0).
  template <class E>
  static float masked(float s, E x, float factor) {
    if constexpr (std::is_same_v<E, std::uint8_t>)
      return x ? s : Ops::kNegInf;
    else
      return s + to_float(x) * factor;
  }

  // A mixed tile's mask, pair by pair (one mask row for every lane: key by key).
  static void apply_mask(const detail::Problem& p, const Tile& t, float* st) {
    const detail::ScoreMods& m = p.mods;
    float factor[Br];  // per lane: its head's
    for (int r = 0; r < Br; ++r) factor[r] = mask_factor(m, t.pair(r).head);
    with_mask_type(m, [&](auto type) {
      using E = std::remove_cv_t<std::remove_pointer_t<decltype(type)>>;
      if (mask_rows(m, t) == 1) {
        const E* row = mask_row<E>(m, t, 0);
        for (std::int64_t j = 0; j < t.nj; ++j)
          for (int i = 0; i < Br; ++i)
            st[j * Br + i] = masked(st[j * Br + i], row[j * m.mask_key], factor[i]);
        return;
      }
      for (std::int64_t i = 0; i < t.rows; ++i) {
        const E* row = mask_row<E>(m, t, i);
        for (std::int64_t j = 0; j < t.nj; ++j)
          st[j * Br + i] = masked(st[j * Br + i], row[j * m.mask_key], factor[i]);
      }
    });
  }

  // Head h's sink in log2 units, as the kernels' scores.
  static float sink_log2(const detail::Problem& p, std::int64_t h) {
    return static_cast<float>(p.mods.sinks[h]) * Ops::kLog2e;
  }

  // One row's softmax state (m: running max, log2 units; l: running sum) joined by a sink:
  // m ← max(m, sink), l ← alpha·l + 2^(sink − m); returns alpha = 2^(m_old − m), the
  // rescale of what the row accumulated against m_old. A row with no key and a sink of
  // −inf keeps m = −inf, l = 0.
  static float join_sink(float sink, float* m, float* l) {
    using Softmax = OnlineSoftmax<S>;
    const float m_new = *m > sink ? *m : sink;
    const float ref = Softmax::reference(m_new);
    const float alpha = Softmax::rescale(*m, ref, Softmax::weight(sink, ref), l);
    *m = m_new;
    return alpha;
  }

  // The sink of head h joins the softmax state of the tile's rows (join_sink); alpha
  // receives each row's rescale, for what it accumulated against the old max (scale_rows).
  static void add_sink(const detail::Problem& p, std::int64_t h, float* m, float* l,
                       float* alpha) {
    const float sink = sink_log2(p, h);
    for (int i = 0; i < Br; ++i) alpha[i] = join_sink(sink, &m[i], &l[i]);
  }

  // x[r][i] ← x[r][i] · alpha[i] for n rows of Br.
  static void scale_rows(float* x, std::int64_t n, const float* alpha) {
    vec a[NV];
#pragma GCC unroll 8
    for (int u = 0; u < NV; ++u) a[u] = S::load(alpha + u * L);
    for (std::int64_t r = 0; r < n; ++r)
#pragma GCC unroll 8
      for (int u = 0; u < NV; ++u) S::store(x + r * Br + u * L, S::load(x + r * Br + u * L) * a[u]);
  }
};

}  // namespace fattn::cpu
