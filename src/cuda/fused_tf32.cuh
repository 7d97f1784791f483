// fattn — fused attention for float32 on tensor cores: mma.sync m16n8k8 in
//   kExact = true   3xTF32 for Q·Kᵀ and P·V: float32-level accuracy (the default)
//   kExact = false  TF32 mode (Options::allow_tf32): Q·Kᵀ in plain TF32 (1 MMA), P·V
//                   with V split (2 MMAs: P·V_big + P·V_small) — half the MMAs of
//                   3xTF32. V is kept near float32 because a row that sees one key
//                   outputs that key's value: plain TF32 would round it by 2^-11
//                   relative, and max_err over randn inputs reached 1.7e-3 on the H100
//                   (causal, S = 512; results/report/gpu/history/); P in [0, 1] and the scores
//                   tolerate 11 bits.
//
// The warp layout, softmax and epilogue are the 16-bit kernel's (kM slices of 16
// query rows per warp, the m16n8 C layout, warp_softmax.cuh). Every product goes through 3xTF32
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

// kM: 16-row slices per warp (tile_config.hpp).
template <int kD, int kM>
struct Tf32Shape : SliceShape<kD, kM, tf32_tiles(kD).warps, tf32_tiles(kD).keys_per_tile(kM)> {
  using Slices = SliceShape<kD, kM, tf32_tiles(kD).warps, tf32_tiles(kD).keys_per_tile(kM)>;
  static constexpr int kPitch = kD + 4;  // +4 floats: conflict-free fragment loads
  // Q, K, V: one stage each (tile_config.hpp).
  static constexpr int kSmemBytes =
      (Slices::kBr + 2 * Slices::kBc) * kPitch * static_cast<int>(sizeof(float));
  static_assert(kD % 8 == 0 && Slices::kBc % 8 == 0, "whole 8-wide mma steps");
};

// S = Q·Kᵀ for the warp's kM slices: each K fragment is loaded and split once for
// the kM slices. q_frag: this thread's A element (row g, column t) of slice 0;
// k_frag: its B element (key g, dim t) of the K tile.
template <bool kExact, int kM, int kNS, int kD, int kPitch>
__device__ __forceinline__ void qk_tf32(float (&s)[kM][kNS][4], const float* q_frag,
                                        const float* k_frag) {
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int n = 0; n < kNS; ++n) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.0f;
#pragma unroll 1
  for (int kk = 0; kk < kD / 8; ++kk) {
    Tf32Split a[kM][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      const float* const qa = q_frag + m * 16 * kPitch + kk * 8;
      a[m][0] = split_tf32<kExact>(qa[0]);
      a[m][1] = split_tf32<kExact>(qa[8 * kPitch]);
      a[m][2] = split_tf32<kExact>(qa[4]);
      a[m][3] = split_tf32<kExact>(qa[8 * kPitch + 4]);
    }
#pragma unroll
    for (int n = 0; n < kNS; ++n) {
      const float* const kb = k_frag + n * 8 * kPitch + kk * 8;
      const Tf32Split b0 = split_tf32<kExact>(kb[0]), b1 = split_tf32<kExact>(kb[4]);
#pragma unroll
      for (int m = 0; m < kM; ++m) mma_1688_3xtf32<kExact, kExact>(s[m][n], a[m], b0, b1);
    }
  }
}

// O += P·V for one key tile, 8 keys per step. P's A fragment takes the score
// registers as they are, with keys relabelled (k-index t = key 2t, t+4 = key 2t+1);
// v_frag points at this thread's B element (key 2t, dim g) of the V tile, loaded and
// split once for the kM slices. V is always split (see the top of this file).
template <bool kExact, int kM, int kNS, int kDB, int kPitch>
__device__ __forceinline__ void pv_tf32(const float (&s)[kM][kNS][4], float (&o)[kM][kDB][4],
                                        const float* v_frag) {
#pragma unroll
  for (int n = 0; n < kNS; ++n) {
    Tf32Split a[kM][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      a[m][0] = split_tf32<kExact>(s[m][n][0]);
      a[m][1] = split_tf32<kExact>(s[m][n][2]);
      a[m][2] = split_tf32<kExact>(s[m][n][1]);
      a[m][3] = split_tf32<kExact>(s[m][n][3]);
    }
    const float* const vb = v_frag + n * 8 * kPitch;
#pragma unroll
    for (int db = 0; db < kDB; ++db) {
      const Tf32Split b0 = split_tf32(vb[db * 8]), b1 = split_tf32(vb[kPitch + db * 8]);
#pragma unroll
      for (int m = 0; m < kM; ++m) mma_1688_3xtf32<kExact, true>(o[m][db], a[m], b0, b1);
    }
  }
}

template <int kD, bool kExact, int kM>
__global__ void __launch_bounds__(Tf32Shape<kD, kM>::kThreads, 1) fused_tf32_kernel(const Params p) {
  using S = Tf32Shape<kD, kM>;
  extern __shared__ __align__(16) unsigned char smem[];
  float* const sq = reinterpret_cast<float*>(smem);
  float* const sk = sq + S::kBr * S::kPitch;
  float* const sv = sk + S::kBc * S::kPitch;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;
  const FusedBlock<float> block = fused_block<float>(p, S::kBr, S::kBc);
  const BlockCoord c = block.c;
  const int tiles = block.tiles;

  const KeyTileLoader<float, S, kD> load{p, tid};

  float o[kM][S::kDB][4];
  WarpRows rows[kM];
  start_slices(o, rows);

  load_first_tiles<S::kBr, S::kBc, kD, S::kPitch, S::kThreads>(sq, sk, sv, block, p, tid);

  const int warp_row0 = c.q0 + warp * kM * 16;  // slice m starts 16·m rows later
  const int row0 = warp_row0 + g;
  const float* const q_frag = sq + (warp * kM * 16 + g) * S::kPitch + t;  // A: (g, t)
  const float* const k_frag = sk + g * S::kPitch + t;                      // B: (key g, dim t)
  const float* const v_frag = sv + 2 * t * S::kPitch + g;                  // B: (key 2t, dim g)

  for (int j = 0; j < tiles; ++j) {
    cp_async_wait<1>();  // all but the newest group (V_j): Q and K_j have landed
    __syncthreads();

    float s[kM][S::kNS][4];
    qk_tf32<kExact, kM, S::kNS, kD, S::kPitch>(s, q_frag, k_frag);
    __syncthreads();  // every warp is done with K_j
    if (j + 1 < tiles) load(sk, block.k, p.k_stride.seq, j + 1);
    cp_async_commit();

    const int k0 = j * S::kBc;
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      const bool mask = k0 + S::kBc > p.kv_len ||
                        (p.has_band_hi && k0 + S::kBc - 1 > warp_row0 + m * 16 + p.band_hi);
      scale_and_mask(s[m], p, mask, row0 + m * 16, k0 + 2 * t);
      softmax_update(s[m], o[m], rows[m]);
    }

    cp_async_wait<1>();  // all but K_{j+1}: V_j has landed
    __syncthreads();
    // Every V tile is scanned for NaN / Inf (block-wide, a few shared loads per
    // thread): splitting an infinite value gives NaN (inf - inf in the split,
    // inf·0 in the small products), and a masked tile would add 0·NaN to rows that
    // do not see the key. Such a tile takes the plain-FMA path with visible keys only.
    const bool v_nonfinite = tile_has_nonfinite<float, S::kBc, kD, S::kPitch, S::kThreads>(
        sv, min(S::kBc, p.kv_len - k0), tid);
    if (v_nonfinite) {  // rare
#pragma unroll
      for (int m = 0; m < kM; ++m)
        pv_visible_keys(s[m], o[m], sv, S::kPitch, p, row0 + m * 16, k0, lane);
    } else {
      pv_tf32<kExact, kM, S::kNS, S::kDB, S::kPitch>(s, o, v_frag);
    }
    __syncthreads();  // every warp is done with V_j
    if (j + 1 < tiles) load(sv, block.v, p.v_stride.seq, j + 1);
    cp_async_commit();
  }

  float* const out = head_ptr<float>(p.out, p.out_stride, c.b, c.h);
  float* const lse = lse_head(p, c.b, c.h);
#pragma unroll
  for (int m = 0; m < kM; ++m) store_rows<float>(o[m], rows[m], p, out, lse, row0 + m * 16, lane);
}

template <int D, bool kExact>
void launch_tf32_mode(const Params& p, int tile_rows, cudaStream_t stream) {
  const char* const name = kExact ? "fused_tf32_kernel (3xTF32)" : "fused_tf32_kernel (TF32)";
  if constexpr (tf32_tiles(D).max_slices >= 2) {
    if (tile_rows == Tf32Shape<D, 2>::kBr) {
      launch_per_query_tile<Tf32Shape<D, 2>>(fused_tf32_kernel<D, kExact, 2>, name, p, stream);
      return;
    }
  }
  launch_per_query_tile<Tf32Shape<D, 1>>(fused_tf32_kernel<D, kExact, 1>, name, p, stream);
}

// Kernel::fused_tf32x3: 3xTF32, Kernel::fused_tf32: the TF32 mode; launch.tile_rows: 64,
// or 128 where tf32_tiles(D) allows it (plan.hpp chooses).
template <int D>
void launch_fused_tf32(const Params& p, const FusedLaunch& launch, cudaStream_t stream) {
  if (launch.kernel == Kernel::fused_tf32x3)
    launch_tf32_mode<D, true>(p, launch.tile_rows, stream);
  else
    launch_tf32_mode<D, false>(p, launch.tile_rows, stream);
}

}  // namespace fattn::cuda
