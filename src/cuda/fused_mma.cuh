// fattn — fused attention for float16 / bfloat16: FlashAttention-2 on mma.sync.
//
// One block = one query tile of Br = 16·kM·warps rows of one (batch, head); each warp
// owns kM slices of 16 rows (kM = 1 or 2: a K or V fragment loaded from shared memory
// then feeds kM MMAs, see tile_config.hpp). For each key tile of Bc keys (the next one loading by cp.async into
// the other shared-memory stage meanwhile):
//   S  = Q·Kᵀ                 mma m16n8k16, Q and K fragments by ldmatrix
//   S ← S·scale·log2(e), masked (tiles crossing the sequence end or the causal limit)
//   m, l, S ← online softmax   in registers, row reductions within quads
//   O ← alpha·O + P·V          P converted to 16-bit in registers (the C layout of S
//                              is the A layout of P), V fragments by ldmatrix.trans
// then out = O / l and lse = ln 2 · (m + log2 l). Key tiles past the causal limit of
// the tile's last row are never loaded.
// Hidden keys' values: P·V on the tensor cores adds 0·v for keys a row does not see,
// and 0·NaN = NaN. Tiles crossing the causal diagonal are therefore scanned for NaN /
// Inf values (block-wide, a few shared loads per thread); only if one is found does
// the warp take pv_visible_keys, which sums each row's visible keys only.
#pragma once

#include "cuda/async_copy.cuh"
#include "cuda/common.cuh"
#include "cuda/mma.cuh"
#include "cuda/mma_warp.cuh"
#include "cuda/tile_config.hpp"
#include "cuda/warp_softmax.cuh"

namespace fattn::cuda {

// kM: 16-row slices per warp (1: Br = 64, 2: Br = 128 with 4 warps; tile_config.hpp).
template <class T, int kD, int kM>
struct MmaShape : SliceShape<kD, kM, mma_tiles(kD).warps, mma_tiles(kD).keys_per_tile(kM)> {
  using Slices = SliceShape<kD, kM, mma_tiles(kD).warps, mma_tiles(kD).keys_per_tile(kM)>;
  static constexpr int kPitch = kD + 8;  // shared row pitch: +16 bytes (tile_config.hpp)
  static constexpr int kTileElems = Slices::kBc * kPitch;
  // Q, then 2 stages of K, then 2 stages of V.
  static constexpr int kSmemBytes =
      (Slices::kBr + 4 * Slices::kBc) * kPitch * static_cast<int>(sizeof(T));
  static_assert(kD % 16 == 0 && Slices::kBc % 16 == 0, "whole 16-wide mma steps");
};

template <class T, int kD, int kM>
__global__ void __launch_bounds__(MmaShape<T, kD, kM>::kThreads, 1)
    fused_mma_kernel(const Params p) {
  using S = MmaShape<T, kD, kM>;
  extern __shared__ __align__(16) unsigned char smem[];
  T* const sq = reinterpret_cast<T*>(smem);
  T* const sk = sq + S::kBr * S::kPitch;
  T* const sv = sk + 2 * S::kTileElems;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32;
  const FusedBlock<T> block = fused_block<T>(p, S::kBr, S::kBc);
  const BlockCoord c = block.c;
  const int tiles = block.tiles;

  auto load_kv = [&](int j, int stage) {
    load_key_tile_async<T, S::kBc, kD, S::kPitch, S::kThreads>(
        sk + stage * S::kTileElems, block.k, p.k_stride.seq, j, p, tid);
    load_key_tile_async<T, S::kBc, kD, S::kPitch, S::kThreads>(
        sv + stage * S::kTileElems, block.v, p.v_stride.seq, j, p, tid);
  };

  float o[kM][S::kDB][4];
  WarpRows rows[kM];
  start_slices(o, rows);

  if (tiles > 0) {
    load_tile_async<T, S::kBr, kD, S::kPitch, S::kThreads>(sq, block.q, p.q_stride.seq, block.q_rows,
                                                          p.head_dim, tid);
    load_kv(0, 0);
    cp_async_commit();
  }

  // The warp's slice m holds block rows (warp·kM + m)·16 .. +15.
  const int warp_row0 = c.q0 + warp * kM * 16;  // sequence index of the warp's first row
  const int row0 = warp_row0 + lane / 4;        // ... of this thread's row g in slice 0
  // ldmatrix row addresses (mma.cuh): A fragments of Q (rows lane%16, column half lane/16),
  // B fragments of two 8-key blocks of K (keys lane%8 + 8·(lane/16), column half (lane/8)%2),
  // transposed B fragments of V (keys lane%8 + 8·((lane/8)%2), column half lane/16).
  const T* const q_frag = sq + (warp * kM * 16 + lane % 16) * S::kPitch + (lane / 16) * 8;
  const int k_frag = (lane % 8 + (lane / 16) * 8) * S::kPitch + ((lane / 8) % 2) * 8;
  const int v_frag = (lane % 8 + ((lane / 8) % 2) * 8) * S::kPitch + (lane / 16) * 8;

  for (int j = 0; j < tiles; ++j) {
    const int stage = j & 1;
    if (j + 1 < tiles) load_kv(j + 1, stage ^ 1);
    cp_async_commit();   // possibly empty: keeps one group per iteration
    cp_async_wait<1>();  // everything but tile j+1 has landed
    __syncthreads();
    const T* const skj = sk + stage * S::kTileElems;
    const T* const svj = sv + stage * S::kTileElems;

    float s[kM][S::kNS][4];
    qk_mma<T, kM, S::kBc, kD, S::kPitch>(s, q_frag, skj + k_frag);

    const int k0 = j * S::kBc;
    // A tile crossing the causal diagonal: some rows must not see some keys' values.
    // Block-uniform test, so the block-wide scan below is entered by all threads.
    bool v_nonfinite = false;
    if (p.has_band_hi && k0 + S::kBc - 1 > c.q0 + p.band_hi)
      v_nonfinite = tile_has_nonfinite<T, S::kBc, kD, S::kPitch, S::kThreads>(
          svj, min(S::kBc, p.kv_len - k0), tid);
    bool any_mask = false;
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      const int slice_row0 = warp_row0 + m * 16;
      const bool mask = k0 + S::kBc > p.kv_len ||
                        (p.has_band_hi && k0 + S::kBc - 1 > slice_row0 + p.band_hi);
      any_mask |= mask;
      scale_and_mask(s[m], p, mask, row0 + m * 16, k0 + 2 * (lane % 4));
      softmax_update(s[m], o[m], rows[m]);
    }

    if (any_mask && v_nonfinite) {  // rare: a NaN/Inf value at a key some rows do not see
#pragma unroll
      for (int m = 0; m < kM; ++m)
        pv_visible_keys(s[m], o[m], svj, S::kPitch, p, row0 + m * 16, k0, lane);
    } else {
      pv_mma<T, kM, S::kBc, kD, S::kPitch>(s, o, svj + v_frag);
    }
    __syncthreads();  // this stage is reloaded by the next iteration's prefetch
  }

  T* const out = head_ptr<T>(p.out, p.out_stride, c.b, c.h);
  float* const lse = lse_head(p, c.b, c.h);
#pragma unroll
  for (int m = 0; m < kM; ++m) store_rows<T>(o[m], rows[m], p, out, lse, row0 + m * 16, lane);
}

// launch.tile_rows: 64 or 128 (plan.hpp chooses; 128 only where mma_tiles allows it).
template <class T, int D>
void launch_fused_mma(const Params& p, const FusedLaunch& launch, cudaStream_t stream) {
  if constexpr (mma_tiles(D).max_slices >= 2) {
    if (launch.tile_rows == MmaShape<T, D, 2>::kBr) {
      launch_per_query_tile<MmaShape<T, D, 2>>(fused_mma_kernel<T, D, 2>, "fused_mma_kernel", p,
                                               stream);
      return;
    }
  }
  launch_per_query_tile<MmaShape<T, D, 1>>(fused_mma_kernel<T, D, 1>, "fused_mma_kernel", p,
                                           stream);
}

}  // namespace fattn::cuda
