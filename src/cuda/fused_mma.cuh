// fattn — fused attention for float16 / bfloat16: FlashAttention-2 on mma.sync.
//
// One block = one query tile of Br = 16·warps rows of one (batch, head); each warp
// owns 16 rows. For each key tile of Bc keys (the next one loading by cp.async into
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
#include "cuda/tile_config.hpp"
#include "cuda/warp_softmax.cuh"

namespace fattn::cuda {

template <class T, int kD>
struct MmaShape {
  static constexpr int kWarps = mma_tiles(kD).warps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBr = 16 * kWarps;   // query rows per block
  static constexpr int kBc = mma_tiles(kD).bc;  // keys per tile
  static constexpr int kPitch = kD + 8;     // shared row pitch: +16 bytes (tile_config.hpp)
  static constexpr int kNS = kBc / 8;       // 16×8 score blocks per warp
  static constexpr int kDB = kD / 8;        // 16×8 output blocks per warp
  static constexpr int kTileElems = kBc * kPitch;
  // Q, then 2 stages of K, then 2 stages of V.
  static constexpr int kSmemBytes =
      (kBr + 4 * kBc) * kPitch * static_cast<int>(sizeof(T));
  static_assert(kD % 16 == 0 && kBc % 16 == 0, "whole 16-wide mma steps");
};

// O += P·V for one key tile, 16 keys per step: score blocks 2kk and 2kk+1, rounded to
// T, are one A fragment; V's B fragments come transposed by ldmatrix (v_frag: this
// lane's row address in the tile, see the kernel).
template <class T, int kBc, int kD, int kPitch>
__device__ __forceinline__ void pv_mma(const float (&s)[kBc / 8][4], float (&o)[kD / 8][4],
                                       const T* v_frag) {
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) {
    const std::uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]),
                                pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                                pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int db = 0; db < kD / 16; ++db) {
      std::uint32_t b[4];
      ldmatrix_x4_trans(b, v_frag + kk * 16 * kPitch + db * 16);
      mma_16816<T>(o[2 * db], a, b[0], b[1]);
      mma_16816<T>(o[2 * db + 1], a, b[2], b[3]);
    }
  }
}

template <class T, int kD>
__global__ void __launch_bounds__(MmaShape<T, kD>::kThreads, 1)
    fused_mma_kernel(const Params p) {
  using S = MmaShape<T, kD>;
  extern __shared__ __align__(16) unsigned char smem[];
  T* const sq = reinterpret_cast<T*>(smem);
  T* const sk = sq + S::kBr * S::kPitch;
  T* const sv = sk + 2 * S::kTileElems;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32;
  const BlockCoord c = block_coord(p, S::kBr);
  const T* const q = head_ptr<T>(p.q, p.q_stride, c.b, c.h) + c.q0 * p.q_stride.seq;
  const T* const k = head_ptr<T>(p.k, p.k_stride, c.b, c.kv_head);
  const T* const v = head_ptr<T>(p.v, p.v_stride, c.b, c.kv_head);
  const int q_rows = min(S::kBr, p.q_len - c.q0);
  const int kv_end = p.kv_end(c.q0 + q_rows);
  const int tiles = (kv_end + S::kBc - 1) / S::kBc;

  auto load_kv = [&](int j, int stage) {
    const int k0 = j * S::kBc;
    const int rows = min(S::kBc, p.kv_len - k0);
    load_tile_async<T, S::kBc, kD, S::kPitch, S::kThreads>(
        sk + stage * S::kTileElems, k + k0 * p.k_stride.seq, p.k_stride.seq, rows, p.head_dim, tid);
    load_tile_async<T, S::kBc, kD, S::kPitch, S::kThreads>(
        sv + stage * S::kTileElems, v + k0 * p.v_stride.seq, p.v_stride.seq, rows, p.head_dim, tid);
  };

  float o[S::kDB][4];
#pragma unroll
  for (int d = 0; d < S::kDB; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  WarpRows rows;
  rows.start();

  if (tiles > 0) {
    load_tile_async<T, S::kBr, kD, S::kPitch, S::kThreads>(sq, q, p.q_stride.seq, q_rows,
                                                          p.head_dim, tid);
    load_kv(0, 0);
    cp_async_commit();
  }

  const int warp_row0 = c.q0 + warp * 16;  // sequence index of the warp's first row
  const int row0 = warp_row0 + lane / 4;   // ... of this thread's row g
  // ldmatrix row addresses (mma.cuh): A fragments of Q (rows lane%16, column half lane/16),
  // B fragments of two 8-key blocks of K (keys lane%8 + 8·(lane/16), column half (lane/8)%2),
  // transposed B fragments of V (keys lane%8 + 8·((lane/8)%2), column half lane/16).
  const T* const q_frag = sq + (warp * 16 + lane % 16) * S::kPitch + (lane / 16) * 8;
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

    // S = Q·Kᵀ for the warp's 16 rows and the tile's Bc keys.
    float s[S::kNS][4];
#pragma unroll
    for (int n = 0; n < S::kNS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      std::uint32_t a[4];
      ldmatrix_x4(a, q_frag + kk * 16);
#pragma unroll
      for (int nb = 0; nb < S::kBc / 16; ++nb) {
        std::uint32_t b[4];
        ldmatrix_x4(b, skj + nb * 16 * S::kPitch + k_frag + kk * 16);
        mma_16816<T>(s[2 * nb], a, b[0], b[1]);
        mma_16816<T>(s[2 * nb + 1], a, b[2], b[3]);
      }
    }

    const int k0 = j * S::kBc;
    const bool mask = k0 + S::kBc > p.kv_len ||
                      (p.causal && k0 + S::kBc - 1 > warp_row0 + p.causal_offset);
    // A tile crossing the causal diagonal: some rows must not see some keys' values.
    // Block-uniform test, so the block-wide scan below is entered by all threads.
    bool v_nonfinite = false;
    if (p.causal && k0 + S::kBc - 1 > c.q0 + p.causal_offset)
      v_nonfinite = tile_has_nonfinite<T, S::kBc, kD, S::kPitch, S::kThreads>(
          svj, min(S::kBc, p.kv_len - k0), tid);
    scale_and_mask(s, p, mask, row0, k0 + 2 * (lane % 4));
    softmax_update(s, o, rows);

    if (mask && v_nonfinite)  // rare: a NaN/Inf value at a key some rows do not see
      pv_visible_keys(s, o, svj, S::kPitch, p, row0, k0, lane);
    else
      pv_mma<T, S::kBc, kD, S::kPitch>(s, o, svj + v_frag);
    __syncthreads();  // this stage is reloaded by the next iteration's prefetch
  }

  T* const out = head_ptr<T>(p.out, p.out_stride, c.b, c.h);
  float* const lse = p.lse ? p.lse + c.b * p.lse_stride.batch + c.h * p.lse_stride.head : nullptr;
  store_rows<T>(o, rows, p, out, lse, row0, lane);
}

template <class T, int D>
void launch_fused_mma(const Params& p, cudaStream_t stream) {
  launch_per_query_tile<MmaShape<T, D>>(fused_mma_kernel<T, D>, "fused_mma_kernel", p, stream);
}

}  // namespace fattn::cuda
