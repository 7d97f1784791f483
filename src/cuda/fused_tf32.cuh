// fattn — fused attention for float32 on tensor cores: 3xTF32 mma.sync m16n8k8.
//
// The warp layout, softmax and epilogue are the 16-bit kernel's (16 query rows per
// warp, the m16n8 C layout, warp_softmax.cuh). Every product goes through 3xTF32
// (mma.cuh): each operand is split into a tf32 big part and a tf32 remainder, and
// three MMAs (small·big, big·small, big·big) give float32-level accuracy — a plain
// TF32 MMA would lose 13 mantissa bits of every input (errors near 1e-3).
//
// Fragments come from shared memory by plain 32-bit loads (ldmatrix is 16-bit only).
// P·V needs P in the A layout, which puts key t and t+4 in a thread; the C layout of
// S gives the thread keys 2t and 2t+1 instead. Since P·V sums over keys, the kernel
// relabels them: k-index t ↔ key 2t and k-index t+4 ↔ key 2t+1, for P (taken from
// registers as is) and for V (rows 2t and 2t+1 read from shared memory). No shuffles.
//
// NaN / Inf values: every V tile is scanned (see the kernel); a tile holding one goes
// through pv_visible_keys (plain FMAs, each row's visible keys only), so infinities
// and hidden keys keep the reference's semantics. NaN / Inf in Q or K: the 3xTF32
// split gives NaN scores where a float32 dot product could give ±inf.
//
// Pipeline per key tile, one shared stage each for K and V (tile_config.hpp):
//   wait K_j → S = Q·K_jᵀ → K_{j+1} starts loading → softmax → wait V_j → O += P·V_j
//   → V_{j+1} starts loading.
#pragma once

#include "cuda/async_copy.cuh"
#include "cuda/common.cuh"
#include "cuda/mma.cuh"
#include "cuda/tile_config.hpp"
#include "cuda/warp_softmax.cuh"

namespace fattn::cuda {

template <int kD>
struct Tf32Shape {
  static constexpr int kWarps = tf32_tiles(kD).warps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBr = 16 * kWarps;
  static constexpr int kBc = tf32_tiles(kD).bc;
  static constexpr int kPitch = kD + 4;  // +4 floats: conflict-free fragment loads
  static constexpr int kNS = kBc / 8;
  static constexpr int kDB = kD / 8;
  static constexpr int kSmemBytes = (kBr + 2 * kBc) * kPitch * 4;  // Q, K, V
  static_assert(kD % 8 == 0 && kBc % 8 == 0, "whole 8-wide mma steps");
};

// O += P·V for one key tile, 8 keys per step, in 3xTF32. P's A fragment takes the
// score registers as they are, with keys relabelled (k-index t = key 2t, t+4 = key
// 2t+1); v_frag points at this thread's B element (key 2t, dim g) of the V tile.
template <int kNS, int kDB, int kPitch>
__device__ __forceinline__ void pv_3xtf32(const float (&s)[kNS][4], float (&o)[kDB][4],
                                          const float* v_frag) {
#pragma unroll
  for (int n = 0; n < kNS; ++n) {
    const Tf32Split a[4] = {split_tf32(s[n][0]), split_tf32(s[n][2]), split_tf32(s[n][1]),
                            split_tf32(s[n][3])};
    const float* const vb = v_frag + n * 8 * kPitch;
#pragma unroll
    for (int db = 0; db < kDB; ++db)
      mma_1688_3xtf32(o[db], a, split_tf32(vb[db * 8]), split_tf32(vb[kPitch + db * 8]));
  }
}

template <int kD>
__global__ void __launch_bounds__(Tf32Shape<kD>::kThreads, 1) fused_tf32x3_kernel(const Params p) {
  using S = Tf32Shape<kD>;
  extern __shared__ __align__(16) unsigned char smem[];
  float* const sq = reinterpret_cast<float*>(smem);
  float* const sk = sq + S::kBr * S::kPitch;
  float* const sv = sk + S::kBc * S::kPitch;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const BlockCoord c = block_coord(p, S::kBr);
  const float* const q = head_ptr<float>(p.q, p.q_stride, c.b, c.h) + c.q0 * p.q_stride.seq;
  const float* const k = head_ptr<float>(p.k, p.k_stride, c.b, c.kv_head);
  const float* const v = head_ptr<float>(p.v, p.v_stride, c.b, c.kv_head);
  const int q_rows = min(S::kBr, p.q_len - c.q0);
  const int kv_end = p.kv_end(c.q0 + q_rows);
  const int tiles = (kv_end + S::kBc - 1) / S::kBc;

  auto load = [&](float* dst, const float* src, std::int64_t stride, int j) {
    const int k0 = j * S::kBc;
    load_tile_async<float, S::kBc, kD, S::kPitch, S::kThreads>(
        dst, src + k0 * stride, stride, min(S::kBc, p.kv_len - k0), p.head_dim, tid);
  };

  float o[S::kDB][4];
#pragma unroll
  for (int d = 0; d < S::kDB; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  WarpRows rows;
  rows.start();

  if (tiles > 0) {  // three groups: Q, K_0, V_0
    load_tile_async<float, S::kBr, kD, S::kPitch, S::kThreads>(sq, q, p.q_stride.seq, q_rows,
                                                              p.head_dim, tid);
    cp_async_commit();
    load(sk, k, p.k_stride.seq, 0);
    cp_async_commit();
    load(sv, v, p.v_stride.seq, 0);
    cp_async_commit();
  }

  const int warp_row0 = c.q0 + warp * 16;
  const int row0 = warp_row0 + g;
  const float* const q_frag = sq + (warp * 16 + g) * S::kPitch + t;  // A: (g, t)
  const float* const k_frag = sk + g * S::kPitch + t;                 // B: (key g, dim t)
  const float* const v_frag = sv + 2 * t * S::kPitch + g;             // B: (key 2t, dim g)

  for (int j = 0; j < tiles; ++j) {
    cp_async_wait<1>();  // all but the newest group (V_j): Q and K_j have landed
    __syncthreads();

    float s[S::kNS][4];
#pragma unroll
    for (int n = 0; n < S::kNS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll 1
    for (int kk = 0; kk < kD / 8; ++kk) {
      const float* const qa = q_frag + kk * 8;
      const Tf32Split a[4] = {split_tf32(qa[0]), split_tf32(qa[8 * S::kPitch]),
                              split_tf32(qa[4]), split_tf32(qa[8 * S::kPitch + 4])};
#pragma unroll
      for (int n = 0; n < S::kNS; ++n) {
        const float* const kb = k_frag + n * 8 * S::kPitch + kk * 8;
        mma_1688_3xtf32(s[n], a, split_tf32(kb[0]), split_tf32(kb[4]));
      }
    }
    __syncthreads();  // every warp is done with K_j
    if (j + 1 < tiles) load(sk, k, p.k_stride.seq, j + 1);
    cp_async_commit();

    const int k0 = j * S::kBc;
    const bool mask = k0 + S::kBc > p.kv_len ||
                      (p.causal && k0 + S::kBc - 1 > warp_row0 + p.causal_offset);
    scale_and_mask(s, p, mask, row0, k0 + 2 * t);
    softmax_update(s, o, rows);

    cp_async_wait<1>();  // all but K_{j+1}: V_j has landed
    __syncthreads();
    // Every V tile is scanned for NaN / Inf (block-wide, a few shared loads per
    // thread): 3xTF32 would turn an infinite value into NaN (inf - inf in the split,
    // inf·0 in the small products), and a masked tile would add 0·NaN to rows that
    // do not see the key. Such a tile takes the plain-FMA path with visible keys only.
    const bool v_nonfinite = tile_has_nonfinite<float, S::kBc, kD, S::kPitch, S::kThreads>(
        sv, min(S::kBc, p.kv_len - k0), tid);
    if (v_nonfinite)  // rare
      pv_visible_keys(s, o, sv, S::kPitch, p, row0, k0, lane);
    else
      pv_3xtf32<S::kNS, S::kDB, S::kPitch>(s, o, v_frag);
    __syncthreads();  // every warp is done with V_j
    if (j + 1 < tiles) load(sv, v, p.v_stride.seq, j + 1);
    cp_async_commit();
  }

  float* const out = head_ptr<float>(p.out, p.out_stride, c.b, c.h);
  float* const lse = p.lse ? p.lse + c.b * p.lse_stride.batch + c.h * p.lse_stride.head : nullptr;
  store_rows<float>(o, rows, p, out, lse, row0, lane);
}

template <int D>
void launch_fused_tf32x3(const Params& p, cudaStream_t stream) {
  launch_per_query_tile<Tf32Shape<D>>(fused_tf32x3_kernel<D>, "fused_tf32x3_kernel", p, stream);
}

}  // namespace fattn::cuda
