// fattn — fused attention for float16 / bfloat16 on Hopper's warpgroup MMA (wgmma,
// sm_90a): FlashAttention-2's loop with FlashAttention-3's instructions.
//
// One block = one query tile of Br = 64·warpgroups rows of one (batch, head); warpgroup
// g owns rows 64g..64g+63 (the M of wgmma m64nNk16), warp w of it 16 of them, so the
// row softmax stays inside a warp as in fused_mma.cuh. Q, K and V tiles sit in shared
// memory in the no-swizzle core-matrix layout (core_tile.cuh), K/V in two stages: the
// next key tile loads by cp.async while this one computes. For each key tile of Bc keys:
//   S  = Q·Kᵀ                 wgmma SS m64n{Bc}k16, D/16 of them, Q and K from shared
//   S ← S·scale·log2(e), masked     (warp_softmax.cuh, on the accumulator registers:
//   m, l, S ← online softmax         each warp's 16 rows are in the m16n8 C layout)
//   O ← alpha·O + P·V          P rounded to 16 bits in registers (accumulator blocks 2k,
//                              2k+1 = the A fragment of slice k), wgmma RS m64n{D}k16
//                              with V N-major from shared, Bc/16 of them
// then out = O / l and lse = ln 2 · (m + log2 l), as the mma.sync kernel. Key tiles past
// the causal limit of the tile's last row are never loaded.
//
// Both MMAs are waited for before the registers they write are read (wgmma_wait_group<0>):
// the simple schedule, with the tensor cores idle during the softmax unless the other
// warpgroup is in its MMAs. FlashAttention-3 overlaps them (the next tile's Q·Kᵀ is
// issued before this tile's softmax; producer warps, TMA); that is the next step once
// this one is measured (docs/cuda.md).
//
// Hidden keys' values: as in fused_mma.cuh, tiles crossing the causal diagonal are
// scanned for NaN/Inf values; if one is found the whole block (wgmma is issued by whole
// warpgroups, so the choice must be uniform) sums each row's visible keys only
// (pv_visible_keys on the shared tile).
#pragma once

#include "cuda/async_copy.cuh"
#include "cuda/common.cuh"
#include "cuda/core_tile.cuh"
#include "cuda/tile_config.hpp"
#include "cuda/warp_softmax.cuh"
#include "cuda/wgmma.cuh"

namespace fattn::cuda {

template <class T, int kD>
struct WgmmaShape {
  static_assert(wgmma_head_dim(kD), "wgmma kernels are built for head dims 64 and 128");
  static constexpr int kWarpgroups = wgmma_tiles(kD).warpgroups;
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kBr = 64 * kWarpgroups;   // query rows per block
  static constexpr int kBc = wgmma_tiles(kD).bc;  // keys per tile: the N of S = Q·Kᵀ
  static constexpr int kNS = kBc / 8;             // 8-column score blocks per warp
  static constexpr int kDB = kD / 8;              // 8-column output blocks per warp
  static constexpr int kTileElems = kBc * kD;
  // Q, then 2 stages of K, then 2 stages of V.
  static constexpr int kSmemBytes = (kBr + 4 * kBc) * kD * static_cast<int>(sizeof(T));
  static_assert(kBc == 64 || kBc == 128, "m64n64 or m64n128 for S");
};

// S = Q·Kᵀ for the warpgroup's 64 rows and the tile's Bc keys: D/16 SS MMAs, K-major A
// (Q) and B (K). Returns once S is in the registers.
template <class T, int kD, int kBc>
__device__ __forceinline__ void qk_wgmma(float (&s)[kBc / 8][4], std::uint64_t q_desc,
                                         std::uint64_t k_desc) {
  wgmma_fence();  // s was read by the last tile's softmax
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk)
    wgmma_ss<T, kBc, 0, 0>(s, q_desc + kk * k_major_slice_step(),
                           k_desc + kk * k_major_slice_step(), kk > 0);
  wgmma_commit_group();
  wgmma_wait_group<0>();
  wgmma_fence_operands(s);
}

// O += P·V: P (probabilities in s, rounded to T) as the register A operand, V N-major
// from shared memory; Bc/16 RS MMAs. Returns once O is in the registers.
template <class T, int kD, int kBc>
__device__ __forceinline__ void pv_wgmma(const float (&s)[kBc / 8][4], float (&o)[kD / 8][4],
                                         std::uint64_t v_desc) {
  std::uint32_t a[kBc / 16][4];
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) {
    a[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    a[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    a[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    wgmma_fence_operands(a[kk]);
  }
  wgmma_fence_operands(o);
  wgmma_fence();  // o was rescaled and a written by ordinary instructions
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk)
    wgmma_rs<T, kD, 1>(o, a[kk], v_desc + kk * n_major_slice_step<kD>(), true);
  wgmma_commit_group();
  wgmma_wait_group<0>();
  wgmma_fence_operands(o);
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) wgmma_fence_operands(a[kk]);
}

// The slow path out of line: inlined, its shuffles and loads raise the kernel's register
// count for every tile (ptxas: 255 registers and a spill at D = 128, 184 without it at
// D = 64 against 232); called, it passes s and o through the stack only when it runs.
template <class T, int kD, int kNS>
__device__ __noinline__ void pv_visible_keys_core(const float (&s)[kNS][4], float (&o)[kD / 8][4],
                                                  const T* v_tile, const Params& p, int row0,
                                                  int k0, int lane) {
  pv_visible_keys(
      s, o, [&](int key, int col) { return to_float(v_tile[core_index<kD>(key, col)]); }, p, row0,
      k0, lane);
}

template <class T, int kD>
__global__ void __launch_bounds__(WgmmaShape<T, kD>::kThreads, 1)
    fused_wgmma_kernel(const Params p) {
  using S = WgmmaShape<T, kD>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* const sq = reinterpret_cast<T*>(smem);
  T* const sk = sq + S::kBr * kD;
  T* const sv = sk + 2 * S::kTileElems;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32, warpgroup = warp / 4;
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
    load_core_tile_async<T, S::kBc, kD, S::kThreads>(
        sk + stage * S::kTileElems, k + k0 * p.k_stride.seq, p.k_stride.seq, rows, p.head_dim, tid);
    load_core_tile_async<T, S::kBc, kD, S::kThreads>(
        sv + stage * S::kTileElems, v + k0 * p.v_stride.seq, p.v_stride.seq, rows, p.head_dim, tid);
  };

  float o[S::kDB][4];
#pragma unroll
  for (int d = 0; d < S::kDB; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  WarpRows rows;
  rows.start();

  if (tiles > 0) {
    load_core_tile_async<T, S::kBr, kD, S::kThreads>(sq, q, p.q_stride.seq, q_rows, p.head_dim,
                                                     tid);
    load_kv(0, 0);
    cp_async_commit();
  }

  const int warp_row0 = c.q0 + warp * 16;  // sequence index of the warp's first row
  const int row0 = warp_row0 + lane / 4;   // ... of this thread's row g
  // The warpgroup's 64 rows of Q: 8 row blocks of the core-matrix tile per 64 rows.
  const std::uint64_t q_desc = k_major_desc<kD>(sq + warpgroup * 64 * kD);

  for (int j = 0; j < tiles; ++j) {
    const int stage = j & 1;
    if (j + 1 < tiles) load_kv(j + 1, stage ^ 1);
    cp_async_commit();   // possibly empty: keeps one group per iteration
    cp_async_wait<1>();  // everything but tile j+1 has landed
    fence_proxy_async_shared();  // this thread's cp.async writes → wgmma's reads
    __syncthreads();
    const T* const skj = sk + stage * S::kTileElems;
    const T* const svj = sv + stage * S::kTileElems;

    float s[S::kNS][4];
    qk_wgmma<T, kD, S::kBc>(s, q_desc, k_major_desc<kD>(skj));

    const int k0 = j * S::kBc;
    // A tile crossing the causal diagonal: some rows must not see some keys' values.
    // Block-uniform test, so the block-wide scan is entered by all threads; the zero-
    // filled rows past kv_len are finite, so the whole tile is scanned.
    bool v_nonfinite = false;
    if (p.causal && k0 + S::kBc - 1 > c.q0 + p.causal_offset)
      v_nonfinite = tile_has_nonfinite<T, S::kBc, kD, kD, S::kThreads>(svj, S::kBc, tid);
    const bool mask = k0 + S::kBc > p.kv_len ||
                      (p.causal && k0 + S::kBc - 1 > warp_row0 + p.causal_offset);
    scale_and_mask(s, p, mask, row0, k0 + 2 * (lane % 4));
    softmax_update(s, o, rows);

    if (v_nonfinite) {  // rare: a NaN/Inf value at a key some rows do not see
      pv_visible_keys_core<T, kD, S::kNS>(s, o, svj, p, row0, k0, lane);
    } else {
      pv_wgmma<T, kD, S::kBc>(s, o, n_major_desc<kD>(svj));
    }
    __syncthreads();  // this stage is reloaded by the next iteration's prefetch
  }

  T* const out = head_ptr<T>(p.out, p.out_stride, c.b, c.h);
  float* const lse = p.lse ? p.lse + c.b * p.lse_stride.batch + c.h * p.lse_stride.head : nullptr;
  store_rows<T>(o, rows, p, out, lse, row0, lane);
}

template <class T, int D>
void launch_fused_wgmma(const Params& p, cudaStream_t stream) {
  launch_per_query_tile<WgmmaShape<T, D>>(fused_wgmma_kernel<T, D>, "fused_wgmma_kernel", p,
                                          stream);
}

}  // namespace fattn::cuda
