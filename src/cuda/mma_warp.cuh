// fattn — a warp's products on mma.sync (sm_80+) over its 16-row slices: S = Q·Kᵀ for a key
// tile and O += P·V with P rounded to 16 bits in registers, K and V fragments by ldmatrix
// from shared memory. The main loop of fused_mma.cuh and the CUDA decode kernel
// (decode.cuh) are built on them.
#pragma once

#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/mma.cuh"

namespace fattn::cuda {

// acc[m][n] and acc[m][n + 1] += a[m]·b for every slice m: one ldmatrix_x4 of B (two
// 16×8 blocks, b[0..1] and b[2..3]) feeding 2·kM MMAs.
template <class T, int kM, int kN>
__device__ __forceinline__ void mma_slices(float (&acc)[kM][kN][4], int n,
                                           const std::uint32_t (&a)[kM][4],
                                           const std::uint32_t (&b)[4]) {
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    mma_16816<T>(acc[m][n], a[m], b[0], b[1]);
    mma_16816<T>(acc[m][n + 1], a[m], b[2], b[3]);
  }
}

// S = Q·Kᵀ for the warp's kM slices and the tile's Bc keys: each K fragment
// (ldmatrix) feeds kM·2 MMAs. q_frag: this lane's row address of slice 0 in the Q
// tile; k_frag: its row address in the K tile (see the kernel).
template <class T, int kM, int kBc, int kD, int kPitch>
__device__ __forceinline__ void qk_mma(float (&s)[kM][kBc / 8][4], const T* q_frag,
                                       const T* k_frag) {
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int n = 0; n < kBc / 8; ++n) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.0f;
  // Two slices: not unrolled over kk, to keep the compiler from hoisting every K
  // fragment of the tile into registers. (It did not remove the spills at D = 128 with
  // Bc = 64 — Bc = 32 did, tile_config.hpp — and was not timed against full unrolling.)
#pragma unroll(kM == 1 ? kD / 16 : 1)
  for (int kk = 0; kk < kD / 16; ++kk) {
    std::uint32_t a[kM][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) ldmatrix_x4(a[m], q_frag + m * 16 * kPitch + kk * 16);
#pragma unroll
    for (int nb = 0; nb < kBc / 16; ++nb) {
      std::uint32_t b[4];
      ldmatrix_x4(b, k_frag + nb * 16 * kPitch + kk * 16);
      mma_slices<T>(s, 2 * nb, a, b);
    }
  }
}

// O += P·V for one key tile, 16 keys per step: score blocks 2kk and 2kk+1 of each
// slice, rounded to T, are one A fragment; V's B fragments come transposed by
// ldmatrix (v_frag: this lane's row address in the tile, see the kernel), each
// feeding kM·2 MMAs.
template <class T, int kM, int kBc, int kD, int kPitch>
__device__ __forceinline__ void pv_mma(const float (&s)[kM][kBc / 8][4],
                                       float (&o)[kM][kD / 8][4], const T* v_frag) {
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) {
    std::uint32_t a[kM][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      a[m][0] = pack2<T>(s[m][2 * kk][0], s[m][2 * kk][1]);
      a[m][1] = pack2<T>(s[m][2 * kk][2], s[m][2 * kk][3]);
      a[m][2] = pack2<T>(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1]);
      a[m][3] = pack2<T>(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3]);
    }
#pragma unroll
    for (int db = 0; db < kD / 16; ++db) {
      std::uint32_t b[4];
      ldmatrix_x4_trans(b, v_frag + kk * 16 * kPitch + db * 16);
      mma_slices<T>(o, 2 * db, a, b);
    }
  }
}

}  // namespace fattn::cuda
