// fattn — the variants on a warp's score tile, for the kernels that take them (the TMA
// kernel's variant instantiation, fused_tma.cuh): softcap, ALiBi, the band's lower edge and
// the sinks, in the CPU kernels' order and units (cpu/common/score_mods.hpp, the Triton
// kernels' triton/scores.py, the float64 reference.cu):
//   x = scale·q·kᵀ → softcap (c·tanh(x/c)) → ·log2(e) → − slope·log2(e)·|i + Sk − Sq − j|
//     → hidden pairs (the sequence end, both edges of the band: visibility.cuh) −inf
// and, at the end of the row, the sink's logit joins the denominator:
//   m' = max(m, sink·log2(e)), l' = l·2^(m − m') + 2^(sink·log2(e) − m'), o' = o·2^(m − m').
// Scores are in the m16n8 C layout of warp_softmax.cuh: s[n][e] is row row0 + 8·(e/2), key
// col0 + 8n + (e%2).
#pragma once

#include "cuda/common.cuh"
#include "cuda/warp_softmax.cuh"
#include "model/tanh_fit.hpp"

namespace fattn::cuda {

// The per-head values of one (batch, query head) of a block: its ALiBi slope and sink in
// log2 units (0 and -inf where the problem has none), and the softcap's reciprocal.
struct HeadMods {
  float slope2, sink2, inv_softcap;

  __device__ __forceinline__ static HeadMods of(const Params& p, int b, int h) {
    HeadMods m;
    m.slope2 = p.alibi ? p.alibi[b * p.alibi_batch + h] * kLog2e : 0.0f;
    m.sink2 = p.sinks ? p.sinks[h] * kLog2e : neg_inf();
    m.inv_softcap = p.softcap != 0.0f ? 1.0f / p.softcap : 0.0f;
    return m;
  }
};

// cap·tanh(x / cap), model/tanh_fit.hpp's fit (relative error 3.1e-7); inv_cap = 1 / cap.
__device__ __forceinline__ float softcapped(float x, float cap, float inv_cap) {
  using namespace detail;  // the fit's coefficients
  // The clamp by comparison, not fminf: fminf would turn a NaN score into the clamp (a NaN
  // score keeps its row NaN, as on the CPU and in the Triton kernels).
  const float a = fabsf(x), limit = kTanhClamp * cap;
  const float u = (a > limit ? limit : a) * inv_cap;
  const float z = u * u;
  const float num = fmaf(fmaf(fmaf(fmaf(kTanhP4, z, kTanhP3), z, kTanhP2), z, kTanhP1), z, kTanhP0);
  const float den = fmaf(fmaf(fmaf(fmaf(kTanhQ4, z, kTanhQ3), z, kTanhQ2), z, kTanhQ1), z, kTanhQ0);
  const float t = u * num / den;
  return copysignf(t, x) * cap;
}

// f(x, row, col) for each score of a warp's blocks s[n][e] (mma.sync m16n8's accumulator
// layout, as scale_and_mask walks it): element e of block n is the pair
// (row0 + 8·(e / 2), col0 + 8·n + e % 2).
template <int kN, class F>
__device__ __forceinline__ void for_each_score(float (&s)[kN][4], int row0, int col0, F&& f) {
#pragma unroll
  for (int n = 0; n < kN; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) f(s[n][e], row0 + (e >> 1) * 8, col0 + n * 8 + (e & 1));
}

// The variants' scale_and_mask (warp_softmax.cuh): raw products s → scores in log2 units with
// softcap and ALiBi; `mask` set: pairs outside the sequence or the band −inf (the caller
// knows when no pair of the warp's tile is hidden).
template <int kN>
__device__ __forceinline__ void scale_modify_mask(float (&s)[kN][4], const Params& p,
                                                  const HeadMods& head, bool mask, int row0,
                                                  int col0) {
  const Visibility band = visibility(p);
  const int alibi_offset = p.kv_len - p.q_len;  // ALiBi's diagonal: bottom-right aligned
  for_each_score(s, row0, col0, [&](float& score, int row, int col) {
    float x = score;
    if (p.softcap != 0.0f) {
      x = softcapped(x * static_cast<float>(p.scale), p.softcap, head.inv_softcap) * kLog2e;
    } else {
      x *= p.scale_log2;
    }
    if (p.alibi) x -= head.slope2 * static_cast<float>(abs(row + alibi_offset - col));
    if (mask && band.hidden(row, col)) x = neg_inf();
    score = x;
  });
}

// The sink's term, folded into a warp's rows before store_rows (warp_softmax.cuh): each
// thread's partial sum and its output values are rescaled to the new max, and one thread of
// each quad (t = 0) adds the sink's 2^(sink − m'), so that store_rows' quad sum is l'. A row
// that saw no key gets out = 0 and lse = sink; with a sink of −inf it is unchanged.
template <int kDB>
__device__ __forceinline__ void fold_sink(float (&o)[kDB][4], WarpRows& rows, float sink2,
                                          int lane) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float m_new = isnan(sink2) ? sink2 : fmaxf(rows.m[half], sink2);  // a NaN sink: NaN rows
    const float m_ref = m_new == neg_inf() ? 0.0f : m_new;
    const float factor = exp2f(rows.m[half] - m_ref);
    const float sink_term = lane % 4 == 0 ? exp2f(sink2 - m_ref) : 0.0f;
    rows.l[half] = fmaf(rows.l[half], factor, sink_term);
    rows.m[half] = m_new;
#pragma unroll
    for (int d = 0; d < kDB; ++d) {
      o[d][2 * half] *= factor;
      o[d][2 * half + 1] *= factor;
    }
  }
}

}  // namespace fattn::cuda
