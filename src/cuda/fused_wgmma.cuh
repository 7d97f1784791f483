// fattn — fused attention for float16 / bfloat16 on Hopper's warpgroup MMA (wgmma,
// sm_90a): FlashAttention-2's loop with FlashAttention-3's instructions.
//
// One block = one query tile of Br = 64·warpgroups rows of one (batch, head); warpgroup
// g owns rows 64g..64g+63 (the M of wgmma m64nNk16), warp w of it 16 of them, so the
// row softmax stays inside a warp as in fused_mma.cuh. Q, K and V tiles sit in shared
// memory in the no-swizzle core-matrix layout (core_tile.cuh), K/V in two stages: the
// next tiles load by cp.async while this one computes. For each key tile of Bc keys:
//   S  = Q·Kᵀ                 wgmma SS m64n{Bc}k16, D/16 of them, Q and K from shared
//   S ← S·scale·log2(e), masked     (warp_softmax.cuh, on the accumulator registers:
//   m, l, S ← online softmax         each warp's 16 rows are in the m16n8 C layout)
//   O ← alpha·O + P·V          P rounded to 16 bits in registers (accumulator blocks 2k,
//                              2k+1 = the A fragment of slice k), wgmma RS m64n{D}k16
//                              with V N-major from shared, Bc/16 of them
// then out = O / l and lse = ln 2 · (m + log2 l), as the mma.sync kernel. Key tiles past
// the causal limit of the tile's last row are never loaded.
//
// Two schedules (Kernel::fused_wgmma and Kernel::fused_wgmma_pipelined):
//   serial     each MMA group is waited for before the registers it writes are read: the
//              tensor cores idle during a warpgroup's softmax unless the other
//              warpgroup is in its MMAs.
//   pipelined  FlashAttention-3's intra-warpgroup overlap: iteration j issues S_j = Q·K_jᵀ
//              and then O += P_{j-1}·V_{j-1}, waits for S_j only, and computes P_j while
//              the tensor cores run P_{j-1}·V_{j-1}; O is rescaled by alpha_j after that
//              MMA is waited for. The price: P_{j-1} (Bc/4 registers) is held across the
//              softmax, and V runs one tile behind K in the loads.
// Which one is faster on an H100 is for the benchmark to say (docs/cuda.md); FlashAttention-3
// adds producer warps with TMA loads and ping-pong between warpgroups on top.
//
// Hidden keys' values: as in fused_mma.cuh, tiles crossing the causal diagonal are
// scanned for NaN/Inf values; if one is found the whole block (wgmma is issued by whole
// warpgroups, so the choice must be uniform) sums each row's visible keys only
// (pv_visible_keys on the shared tile) for that tile.
#pragma once

#include <type_traits>

#include "cuda/async_copy.cuh"
#include "cuda/common.cuh"
#include "cuda/core_tile.cuh"
#include "cuda/score_mods.cuh"
#include "cuda/tile_config.hpp"
#include "cuda/warp_softmax.cuh"
#include "cuda/wgmma.cuh"
#include "cuda/wgmma_consumer.cuh"

namespace fattn::cuda {

template <class T, int kD>
struct WgmmaShape {
  static_assert(wgmma_head_dim(kD), "wgmma kernels are built for head dims 64 and 128");
  static constexpr int kWarpgroups = wgmma_tiles(kD).warpgroups;
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kBr = 64 * kWarpgroups;   // query rows per block
  static constexpr int kBc = wgmma_tiles(kD).bc;  // keys per tile: the N of S = Q·Kᵀ
  static constexpr int kKS = kBc / 16;            // 16-key slices: P's A fragments
  static constexpr int kTileElems = kBc * kD;
  // Q, then 2 stages of K, then 2 stages of V.
  static constexpr int kSmemBytes = (kBr + 4 * kBc) * kD * static_cast<int>(sizeof(T));
  static_assert(kBc == 64 || kBc == 128, "m64n64 or m64n128 for S");
};

// ---- the kernel ------------------------------------------------------------------------------

template <class T, int kD, bool kPipelined>
__global__ void __launch_bounds__(WgmmaShape<T, kD>::kThreads, 1)
    fused_wgmma_kernel(const Params p) {
  using S = WgmmaShape<T, kD>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* const sq = reinterpret_cast<T*>(smem);
  T* const sk = sq + S::kBr * kD;
  T* const sv = sk + 2 * S::kTileElems;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32, warpgroup = warp / 4;
  const FusedBlock<T> block = fused_block<T>(p, S::kBr, S::kBc);
  const BlockCoord c = block.c;
  const int tiles = block.tiles;

  // Tile j of K and of V sits in stage j % 2.
  auto k_tile = [&](int j) -> T* { return sk + (j & 1) * S::kTileElems; };
  auto v_tile = [&](int j) -> T* { return sv + (j & 1) * S::kTileElems; };
  auto load = [&](T* dst, const T* src, std::int64_t stride, int j) {
    const int k0 = j * S::kBc;
    load_core_tile_async<T, S::kBc, kD, S::kThreads>(dst, src + k0 * stride, stride,
                                                     min(S::kBc, p.kv_len - k0), p.head_dim, tid);
  };
  auto load_k = [&](int j) { load(k_tile(j), block.k, p.k_stride.seq, j); };
  auto load_v = [&](int j) { load(v_tile(j), block.v, p.v_stride.seq, j); };
  auto k_desc = [&](int j) { return k_major_desc<kD>(k_tile(j)); };
  // Shared data written by every thread's cp.async is visible to the whole block, and to
  // wgmma (the async proxy), after this.
  auto tiles_landed = [&]() {
    fence_proxy_async_shared();
    __syncthreads();
  };
  WgmmaWarp<T, kD, S::kBc> this_warp(c, warp, lane);
  // Whether tile j's V must skip the tensor cores (header comment). Block-uniform: every
  // thread enters the block-wide scan or none; the zero-filled rows past kv_len are finite.
  auto needs_visible_keys_only = [&](int j) {
    return this_warp.template crosses_diagonal<S::kBr>(p, j) &&
           tile_has_nonfinite<T, S::kBc, kD, kD, S::kThreads>(v_tile(j), S::kBc, tid);
  };
  // The slow path for tile jv's P·V, with the K stage of tile j_scratch as scratch; every
  // thread of the block issues the MMAs.
  auto pv_visible_keys_only = [&](int jv, int j_scratch) {
    this_warp.template pv_visible_keys_only<CoreMatrixValues<kD>, S::kWarps, S::kTileElems>(
        p, warp, v_tile(jv), k_tile(j_scratch), jv * S::kBc, [] { __syncthreads(); });
  };
  // The warpgroup's 64 rows of Q: 8 row blocks of the core-matrix tile per 64 rows.
  const std::uint64_t q_desc = k_major_desc<kD>(sq + warpgroup * 64 * kD);
  if (tiles == 0) {  // no key visible to any row of the tile: 0 and lse = -inf
    this_warp.store_output(p);
    return;
  }

  load_core_tile_async<T, S::kBr, kD, S::kThreads>(sq, block.q, p.q_stride.seq, block.q_rows,
                                                   p.head_dim, tid);
  load_k(0);
  if constexpr (!kPipelined) {
    // Group j holds K_j and V_j; tile j+1 loads while tile j computes.
    load_v(0);
    cp_async_commit();
    for (int j = 0; j < tiles; ++j) {
      if (j + 1 < tiles) {
        load_k(j + 1);
        load_v(j + 1);
      }
      cp_async_commit();   // possibly empty: keeps one group per iteration
      cp_async_wait<1>();  // everything but tile j+1 has landed
      tiles_landed();
      issue_qk<CoreMatrixSlices, T, kD, S::kBc, S::kBr>(this_warp.s, q_desc, k_desc(j));
      wgmma_wait_group<0>();
      wgmma_fence_operands(this_warp.s);
      const bool slow = needs_visible_keys_only(j);
      this_warp.scale_mask_softmax(p, j, true);
      rescale_rows(this_warp.o, this_warp.alphas);
      pack_probs<T>(this_warp.s, this_warp.a);
      if (slow) {  // rare: a NaN/Inf value at a key some rows do not see
        pv_visible_keys_only(j, j);
      } else {
        issue_pv<CoreMatrixSlices, T, kD, S::kKS>(this_warp.a, this_warp.o,
                                                  n_major_desc<kD>(v_tile(j)));
        wgmma_wait_group<0>();
        pv_done<kD, S::kKS>(this_warp.a, this_warp.o);
      }
      __syncthreads();  // this stage is reloaded by the next iteration's prefetch
    }
  } else {
    // Group j holds K_j and V_{j-1}: V runs one tile behind, as its use does.
    const auto stages = Hooks{
        [&](FirstTilesLanded) {
          cp_async_commit();
          if (tiles > 1) load_k(1);
          load_v(0);
          cp_async_commit();
          cp_async_wait<1>();  // Q and K_0
          tiles_landed();
        },
        [&](TilesLanded, int j) {
          if (j + 1 < tiles) load_k(j + 1);
          load_v(j);
          cp_async_commit();
          cp_async_wait<1>();  // K_j and V_{j-1}
          tiles_landed();
        },
        [&](LastValuesLanded, int) {  // in the last group
          cp_async_wait<0>();
          tiles_landed();
        },
        [&](KeysDone, int) {}, [&](ValuesDone, int) {},
        // The stages of K_j and V_{j-1} are reloaded by the next iteration.
        [&](TileDone) { __syncthreads(); },
        [&](KeyDesc, int j) { return k_desc(j); },
        [&](ValueDesc, int j) { return n_major_desc<kD>(v_tile(j)); },
        [&](NeedsVisibleKeysOnly, int j) { return needs_visible_keys_only(j); },
        [&](PvVisibleKeysOnly, int jv, int j_scratch) { pv_visible_keys_only(jv, j_scratch); }};
    pipelined_key_tiles<CoreMatrixSlices, S::kBr>(stages, 0, tiles, q_desc, p, this_warp);
  }

  this_warp.store_output(p);
}

// Kernel::fused_wgmma_pipelined: FlashAttention-3's overlapped schedule; fused_wgmma:
// the serial one (top of this file).
template <class T, int D>
void launch_fused_wgmma(const Params& p, const FusedLaunch& launch, cudaStream_t stream) {
  if (launch.kernel == Kernel::fused_wgmma_pipelined)
    launch_per_query_tile<WgmmaShape<T, D>>(fused_wgmma_kernel<T, D, true>,
                                            "fused_wgmma_kernel (pipelined)", p, stream);
  else
    launch_per_query_tile<WgmmaShape<T, D>>(fused_wgmma_kernel<T, D, false>, "fused_wgmma_kernel",
                                            p, stream);
}

}  // namespace fattn::cuda
