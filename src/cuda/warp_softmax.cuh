// fattn — the online softmax of one warp's 16 query rows, in the m16n8 C layout.
//
// A warp owns 16 query rows. Its scores for a key tile are kN blocks of 16×8
// (s[n][0..3]); each thread holds two rows (g and g+8, g = lane/4) and in each block
// two columns (2t, 2t+1, t = lane%4). A row is spread over the 4 threads of a quad,
// so a row reduction is 2 shuffles. The running max m is in log2 units of the
// scaled scores, shared by the quad; the running sum l is this thread's partial
// sum (the quad's partials are added once, in finish_rows), as in FlashAttention-2.
// Both are per row half: index 0 for row g, 1 for row g+8.
#pragma once

#include "cuda/common.cuh"

namespace fattn::cuda {

struct WarpRows {
  float m[2];  // running max of scale·log2(e)·s, -inf until a key is seen
  float l[2];  // this thread's part of the running sum of 2^(x - m)

  __device__ __forceinline__ void start() {
    m[0] = m[1] = neg_inf();
    l[0] = l[1] = 0.0f;
  }
};

// Fresh accumulators for a warp's kM slices: o = 0, m = -inf, l = 0.
template <int kM, int kDB>
__device__ __forceinline__ void start_slices(float (&o)[kM][kDB][4], WarpRows (&rows)[kM]) {
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int d = 0; d < kDB; ++d) o[m][d][0] = o[m][d][1] = o[m][d][2] = o[m][d][3] = 0.0f;
    rows[m].start();
  }
}

// Scales the raw scores to log2 units (s ← s·scale·log2(e)) and, when `mask` is set,
// hides key columns outside the sequence or, for causal problems, after the query's
// last visible key: s = -inf. Masking after scaling keeps -inf for any sign of the
// scale. row0 is the sequence index of row g, col0 that of column 2t in block 0.
// (Folding the scale into softmax_update's exp2 as one FFMA, FlashAttention-2's way,
// was measured on the H100 on 2026-11-23: no change at D = 64, 5-8 % slower at
// D = 128 with 128-row tiles, where the kernel sits at 245 registers; not kept.)
template <int kN>
__device__ __forceinline__ void scale_and_mask(float (&s)[kN][4], const Params& p, bool mask,
                                               int row0, int col0) {
#pragma unroll
  for (int n = 0; n < kN; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] *= p.scale_log2;
  if (!mask) return;
#pragma unroll
  for (int n = 0; n < kN; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = row0 + (e >> 1) * 8;
      const int col = col0 + n * 8 + (e & 1);
      if (col >= p.kv_len || (p.has_band_hi && col > row + p.band_hi)) s[n][e] = neg_inf();
    }
}

// One key tile of the online softmax on scaled scores (log2 units): new running max,
// rescale of the output accumulator o (kDB blocks of 16×8) by alpha = 2^(m_old - m_new),
// s ← 2^(s - m_new), l ← alpha·l + Σ s. A row that has seen no key keeps
// m = -inf and uses 0 as its reference, so its probabilities are exactly 0, not NaN.
// NaN scores propagate (fmaxf skips them, 2^NaN is NaN).
// The rescale of o (kDB·4 multiplies per thread, as many instructions as the tile's
// MMAs at Bc = 32) is skipped when no row of the warp has a new max (alpha = 1 for
// all; a warp vote, so the branch is uniform): after the first tiles of a long row
// the max rarely moves.
// The two halves of softmax_update, for a kernel that must rescale o later than it
// computes the probabilities (wgmma_consumer.cuh's pipelined schedule, where the last
// tile's P·V is still adding into o meanwhile): softmax_scores updates m, l and s and
// returns alpha per row half; rescale_rows applies it.
template <int kN>
__device__ __forceinline__ void softmax_scores(float (&s)[kN][4], WarpRows& rows,
                                               float (&alphas)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float mx = rows.m[half];
#pragma unroll
    for (int n = 0; n < kN; ++n)
      mx = fmaxf(mx, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
    mx = quad_max(mx);
    const float m_ref = mx == neg_inf() ? 0.0f : mx;
    const float alpha = exp2f(rows.m[half] - m_ref);
    rows.m[half] = mx;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < kN; ++n)
#pragma unroll
      for (int e = 2 * half; e < 2 * half + 2; ++e) {
        const float x = exp2f(s[n][e] - m_ref);
        s[n][e] = x;
        sum += x;
      }
    rows.l[half] = fmaf(rows.l[half], alpha, sum);
    alphas[half] = alpha;
  }
}

template <int kDB>
__device__ __forceinline__ void rescale_rows(float (&o)[kDB][4], const float (&alphas)[2]) {
  if (!__any_sync(0xffffffffu, alphas[0] != 1.0f || alphas[1] != 1.0f)) return;
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int d = 0; d < kDB; ++d) {
      o[d][2 * half] *= alphas[half];
      o[d][2 * half + 1] *= alphas[half];
    }
}

template <int kN, int kDB>
__device__ __forceinline__ void softmax_update(float (&s)[kN][4], float (&o)[kDB][4],
                                               WarpRows& rows) {
  float alphas[2];
  softmax_scores(s, rows, alphas);
  rescale_rows(o, alphas);
}

// O += P·V for one key tile where each row sums only the keys it sees: the slow path
// for a masked tile whose V holds a NaN or an infinity (a tensor-core P·V would add
// 0·NaN = NaN into rows that do not see that key). Row g of the thread's quad gets
// the probabilities of the other quad lanes by shuffles; V is read from the shared
// tile (key-major, row pitch `pitch`): the output fragment (rows g, g+8; columns
// d·8 + 2t, +1) accumulates p·v over the visible keys only.
template <class TV, int kN, int kDB>
__device__ __forceinline__ void pv_visible_keys(const float (&s)[kN][4], float (&o)[kDB][4],
                                                const TV* v_tile, int pitch, const Params& p,
                                                int row0, int k0, int lane) {
  const int t = lane % 4, quad = lane & ~3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + half * 8;
#pragma unroll
    for (int n = 0; n < kN; ++n)
#pragma unroll 1
      for (int src = 0; src < 4; ++src) {  // not unrolled: a slow path, kept small
        const float p0 = __shfl_sync(0xffffffffu, s[n][2 * half], quad + src);
        const float p1 = __shfl_sync(0xffffffffu, s[n][2 * half + 1], quad + src);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = n * 8 + 2 * src + e, col = k0 + key;
          if (col >= p.kv_len || (p.has_band_hi && col > row + p.band_hi)) continue;
          const float pe = e ? p1 : p0;
          const TV* const vrow = v_tile + key * pitch + 2 * t;
#pragma unroll
          for (int d = 0; d < kDB; ++d) {
            o[d][2 * half] = fmaf(pe, to_float(vrow[d * 8]), o[d][2 * half]);
            o[d][2 * half + 1] = fmaf(pe, to_float(vrow[d * 8 + 1]), o[d][2 * half + 1]);
          }
        }
      }
  }
}

// Epilogue: out = o / l for the warp's rows inside the sequence (columns < head_dim),
// lse = ln 2 · (m + log2 l). A row that saw no key gets 0 and -inf.
template <class T, int kDB>
__device__ __forceinline__ void store_rows(const float (&o)[kDB][4], WarpRows& rows,
                                           const Params& p, T* out_head, float* lse_head,
                                           int row0, int lane) {
  const int t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float l = quad_sum(rows.l[half]);
    const int row = row0 + half * 8;
    if (row >= p.q_len) continue;
    const float inv = reciprocal_or_zero(l);
    T* dst = out_head + row * p.out_stride.seq;
#pragma unroll
    for (int d = 0; d < kDB; ++d) {
      const int col = d * 8 + 2 * t;
      if (col < p.head_dim)
        store2(dst + col, o[d][2 * half] * inv, o[d][2 * half + 1] * inv, p.out_pairs,
               col + 1 < p.head_dim);
    }
    if (lse_head && t == 0) lse_head[row * p.lse_stride.seq] = logsumexp(rows.m[half], l);
  }
}

}  // namespace fattn::cuda
