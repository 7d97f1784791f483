// fattn — the online softmax, written once: a row's running state (m: the max of its
// scores so far, log2 units; l: the sum of 2^(s − m) so far) joined by new scores.
//
//   m_new = max(m, new scores)
//   ref   = m_new, or 0 while the row has seen no key (m_new = −inf), so that its
//           probabilities are exactly 0 rather than NaN (−inf − −inf)
//   p     = 2^(s − ref)                                   (weight)
//   alpha = 2^(m − ref), l ← alpha·l + Σp, m ← m_new       (rescale; the caller scales
//                                                            what it accumulated by alpha)
//
// The layouts of the CPU kernels' score tiles take it in two forms:
//   update_lanes  st [nj][Br], rows along the vector lanes: the fused and naive kernels'
//                 tiles (tile_ops.hpp), the decode kernel's query-lane tiles
//   update_row    one row's keys along the lanes, reduced across them: the decode
//                 kernel's keys-on-lanes tiles (cpu/decode/ops.hpp)
// and as scalars where a state joins one more term (a sink: score_mods.hpp) or other
// states (the split-KV merge: decode.hpp). The AMX softmax task (cpu/amx/softmax.hpp) runs
// the same steps in slices between tile products, from the same functions.
#pragma once

#include "cpu/common/isa_target.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/common/exp2.hpp"
#include "cpu/common/simd.hpp"

namespace fattn::cpu {

template <class S>
struct OnlineSoftmax {
  using vec = typename S::vec;
  static constexpr int L = S::lanes;
  static constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  // The reference of a row whose new max is m_new.
  static vec reference(vec m_new) { return m_new == kNegInf ? S::zero() : m_new; }
  static float reference(float m_new) { return m_new == kNegInf ? 0.0f : m_new; }

  // A score's weight against the reference, 2^(s − ref).
  static vec weight(vec s, vec ref) { return exp2<S>(s - ref); }
  static float weight(float s, float ref) { return std::exp2(s - ref); }

  // alpha = 2^(m_old − ref), the rescale of what the row accumulated; l ← alpha·l + sum.
  static vec rescale(vec m_old, vec ref, vec sum, vec* l) {
    const vec alpha = weight(m_old, ref);
    *l = S::fma(*l, alpha, sum);
    return alpha;
  }
  // (Scalars as a·b + c: contracted to an FMA where the unit's ISA has one, never a call.)
  static float rescale(float m_old, float ref, float sum, float* l) {
    const float alpha = weight(m_old, ref);
    *l = *l * alpha + sum;
    return alpha;
  }

  // Rows along the lanes: st [nj][NV·L] becomes the probabilities; m, l, alpha [NV·L].
  template <int NV>
  static void update_lanes(float* st, std::int64_t nj, float* m, float* l, float* alpha) {
    constexpr int Br = NV * L;
    vec m_new[NV], ref[NV], sum[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) m_new[v] = S::load(m + v * L);
    for (std::int64_t j = 0; j < nj; ++j)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) m_new[v] = S::max(S::load(st + j * Br + v * L), m_new[v]);
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      ref[v] = reference(m_new[v]);
      sum[v] = S::zero();
    }
    for (std::int64_t j = 0; j < nj; ++j)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        const vec p = weight(S::load(st + j * Br + v * L), ref[v]);
        S::store(st + j * Br + v * L, p);
        sum[v] += p;
      }
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      vec lv = S::load(l + v * L);
      S::store(alpha + v * L, rescale(S::load(m + v * L), ref[v], sum[v], &lv));
      S::store(l + v * L, lv);
      S::store(m + v * L, m_new[v]);
    }
  }

  // One row's keys along the lanes: s [KV·L] becomes its probabilities (keys it does not
  // see are −inf already); its m, l and alpha are scalars. Across: the reductions across
  // the lanes, Across::max_of and Across::sum_of (DecodeOps': shuffle trees per ISA).
  template <int KV, class Across>
  static void update_row(float* s, float* m, float* l, float* alpha) {
    vec mx = S::splat(*m);
#pragma GCC unroll 8
    for (int u = 0; u < KV; ++u) mx = S::max(S::load(s + u * L), mx);
    const float m_new = Across::max_of(mx);
    const vec ref = S::splat(reference(m_new));
    vec sum = S::zero();
#pragma GCC unroll 8
    for (int u = 0; u < KV; ++u) {
      const vec p = weight(S::load(s + u * L), ref);
      S::store(s + u * L, p);
      sum += p;
    }
    // alpha from the vector exp2, as the probabilities: the lanes agree, lane 0 is taken.
    const float a = weight(S::splat(*m), ref)[0];
    *alpha = a;
    *l = *l * a + Across::sum_of(sum);
    *m = m_new;
  }
};

}  // namespace fattn::cpu
