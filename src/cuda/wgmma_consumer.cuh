// fattn — the warpgroups that issue Hopper's warpgroup MMAs (wgmma, sm_90a), as parts the
// kernels compose: the tile operations (P packed as wgmma's A fragments, the slow P·V over
// each row's visible keys), one warp's registers and steps over a key tile (WgmmaWarp), and
// FlashAttention-3's pipelined schedule over a query tile's key tiles (pipelined_key_tiles),
// whose hooks say when a tile has landed and where it lies. fused_wgmma.cuh's kernels (tiles
// by cp.async) and fused_tma.cuh's consumer warpgroups (tiles by TMA) run on them; the Hopper
// backward (backward_tma.cuh) packs its probabilities with pack_probs.
#pragma once

#include <type_traits>

#include "cuda/async_copy.cuh"
#include "cuda/common.cuh"
#include "cuda/core_tile.cuh"
#include "cuda/score_mods.cuh"
#include "cuda/tile_config.hpp"
#include "cuda/warp_softmax.cuh"
#include "cuda/wgmma.cuh"

namespace fattn::cuda {

// ---- tile operations (issued by the whole warpgroup) -------------------------------------

// The probabilities in s rounded to T as the A fragments of P·V: slice k is score
// blocks 2k and 2k+1 (wgmma.cuh).
template <class T, int kNS>
__device__ __forceinline__ void pack_probs(const float (&s)[kNS][4],
                                           std::uint32_t (&a)[kNS / 2][4]) {
#pragma unroll
  for (int kk = 0; kk < kNS / 2; ++kk) {
    a[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    a[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    a[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// After the P·V group is waited for: the registers are o's and a's again.
template <int kD, int kKS>
__device__ __forceinline__ void pv_done(std::uint32_t (&a)[kKS][4], float (&o)[kD / 8][4]) {
  wgmma_fence_operands(o);
#pragma unroll
  for (int kk = 0; kk < kKS; ++kk) wgmma_fence_operands(a[kk]);
}

// Where pv_visible_keys below finds V's values in the core-matrix layout, as element
// offsets: key_offset(key, t) of columns 2t, 2t + 1 of the key's row, plus pair_offset(key, d)
// for columns 8d + 2t, +1: one pair per core matrix, 64 elements apart (core_index), so the
// offsets are immediates and hold no registers. (Offsets, not pointers: a key_row returning
// the pointer cost fused_wgmma_pipelined 2 registers at D = 64, nvcc 13.0.)
template <int kD>
struct CoreMatrixValues {
  __device__ __forceinline__ static int key_offset(int key, int t) {
    return core_index<kD>(key, 2 * t);
  }
  __device__ __forceinline__ static int pair_offset(int /*key*/, int d) { return 64 * d; }
};

// The slow path (header comment): O += P·V summing each row's visible keys only, with
// FMAs. Every thread of the kWarps warps that issue the MMAs calls it (the caller's choice
// is uniform over them); sync_mma_threads() is their barrier (__syncthreads here, a named
// barrier in fused_tma.cuh, whose producer warpgroup does not take part). P (the packed
// fragments a, the values the tensor-core path multiplies) goes through `scratch`,
// a K stage no MMA reads any more (kScratchElems 16-bit values), so that the loop below
// holds only o: ptxas gave the kernels 40-90 more registers for a register-resident
// version, inlined or called (and spilled the pipelined one at D = 128). Each warp's 16
// rows × Bc take 16·Bc values; the warps that fit take their turn together (all 8 at
// D = 128, 4 at D = 64). ValueLayout says where a key's values lie in v_tile
// (CoreMatrixValues; fused_tma.cuh's Sw128Values). kLowerEdge: the band may have a lower edge
// (the kernels' variant instantiations).
template <class ValueLayout, bool kLowerEdge, class T, int kD, int kKS, int kWarps,
          int kScratchElems, class SyncMmaThreads>
__device__ __forceinline__ void pv_visible_keys(const std::uint32_t (&a)[kKS][4],
                                                float (&o)[kD / 8][4], const T* v_tile,
                                                T* scratch, const Params& p, int warp, int lane,
                                                int row0, int k0,
                                                const SyncMmaThreads& sync_mma_threads) {
  constexpr int kBc = 16 * kKS;
  constexpr int kWarpElems = 16 * kBc;
  constexpr int kWarpsPerTurn = kScratchElems / kWarpElems;
  static_assert(kWarpsPerTurn >= 1, "a warp's probabilities fit in the scratch");
  const int g = lane / 4, t = lane % 4;
  for (int first = 0; first < kWarps; first += kWarpsPerTurn) {
    // The MMAs on the scratch's K tile (first turn), or the last turn's reads (later
    // ones), are done.
    sync_mma_threads();
    if (warp < first || warp >= first + kWarpsPerTurn) continue;
    T* const mine = scratch + (warp - first) * kWarpElems;
    std::uint32_t* const pairs = reinterpret_cast<std::uint32_t*>(mine);
#pragma unroll
    for (int kk = 0; kk < kKS; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r)  // register r: row g + 8·(r%2), column pair 8kk + t + 4·(r/2)
        pairs[(g + 8 * (r % 2)) * (kBc / 2) + kk * 8 + t + 4 * (r / 2)] = a[kk][r];
    __syncwarp();  // a warp reads back only its own 16 rows
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + 8 * half;
      const T* const prow = mine + (g + 8 * half) * kBc;
#pragma unroll 1
      for (int key = 0; key < kBc; ++key) {
        const int col = k0 + key;
        if (visibility(p).template hidden<kLowerEdge>(row, col)) continue;
        const float pe = to_float(prow[key]);
        const T* const vrow = v_tile + ValueLayout::key_offset(key, t);
#pragma unroll
        for (int d = 0; d < kD / 8; ++d) {
          const int pair = ValueLayout::pair_offset(key, d);
          o[d][2 * half] = fmaf(pe, to_float(vrow[pair]), o[d][2 * half]);
          o[d][2 * half + 1] = fmaf(pe, to_float(vrow[pair + 1]), o[d][2 * half + 1]);
        }
      }
    }
  }
}

// ---- one warp of the warpgroups that issue the MMAs -------------------------------------------
// Every warp of fused_wgmma, the consumer warps of fused_tma.cuh: its 16 query rows of the
// block's tile, its registers for key tiles of kBc keys, and the steps both kernels take on
// them alike. How the tiles come in and where they lie stays with each kernel. Key tiles are
// named by their index in the sequence (kt: keys kt·kBc ..).
// kVariants: the problem may have a lower band edge, softcap, ALiBi or sinks (score_mods.cuh;
// fused_tma's variant instantiation); without it the warp asks the upper edge and the sequence
// end only, as it did before the variants (the same machine code).
template <class T, int kD, int kBc, bool kVariants = false>
struct WgmmaWarp {
  static constexpr int kNS = kBc / 8;   // 8-column score blocks
  static constexpr int kDB = kD / 8;    // 8-column output blocks
  static constexpr int kKS = kBc / 16;  // 16-key slices: P's A fragments

  BlockCoord c;
  int lane;
  int warp_row0;  // sequence index of the warp's first row
  int row0;       // ... of this thread's row g
  float o[kDB][4];
  WarpRows rows;
  float s[kNS][4];          // a key tile's scores, then its probabilities
  std::uint32_t a[kKS][4];  // the probabilities rounded to T: P·V's A fragments
  float alphas[2];          // the last softmax step's rescale factors of o

  // Fresh accumulators: o = 0, m = -inf, l = 0. mma_warp: the warp's index among those
  // that issue the MMAs.
  __device__ __forceinline__ WgmmaWarp(const BlockCoord& block, int mma_warp, int lane_id)
      : c(block),
        lane(lane_id),
        warp_row0(block.q0 + mma_warp * 16),
        row0(warp_row0 + lane_id / 4) {
#pragma unroll
    for (int d = 0; d < kDB; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    rows.start();
  }

  // Whether key tile kt hides a key from some of rows [first_row, first_row + kRows): the
  // sequence end, the band's upper edge, or (kVariants) its lower edge.
  template <int kRows>
  __device__ __forceinline__ static bool tile_hides_keys(const Params& p, int kt, int first_row) {
    const bool hides = visibility(p).tile_hides_keys(kt * kBc, kBc, first_row);
    if constexpr (kVariants) return hides || visibility(p).below_band(kt * kBc, first_row + kRows - 1);
    return hides;
  }

  // Whether an edge of the band crosses key tile kt for some row of the block's kBlockRows
  // (the tiles whose hidden keys' values must stay out of P·V), and whether the tile hides
  // any key (that, or the sequence end) from such a row. Params by reference, not kept: a
  // reference member made NVVM branch on p.has_band_hi for every masked score instead of
  // selecting.
  template <int kBlockRows>
  __device__ __forceinline__ bool crosses_diagonal(const Params& p, int kt) const {
    const bool crosses = visibility(p).crosses_limit(kt * kBc, kBc, c.q0);
    if constexpr (kVariants) return crosses || visibility(p).below_band(kt * kBc, c.q0 + kBlockRows - 1);
    return crosses;
  }
  template <int kBlockRows>
  __device__ __forceinline__ bool hides_block_keys(const Params& p, int kt) const {
    return tile_hides_keys<kBlockRows>(p, kt, c.q0);
  }

  // The softmax step of key tile kt's scores in s. may_mask = false: scale only (the caller
  // knows the tile hides no key from any row of the block: hides_block_keys is false).
  __device__ __forceinline__ void scale_mask_softmax(const Params& p, int kt, bool may_mask) {
    const bool mask = may_mask && tile_hides_keys<16>(p, kt, warp_row0);
    if constexpr (kVariants)  // the head's values read per tile: held across the loop, the D = 256
                              // kernel spilled 52 bytes instead of 36 (ptxas, nvcc 13.0)
      scale_modify_mask(s, p, HeadMods::of(p, c.b, c.h), mask, row0, kt * kBc + 2 * (lane % 4));
    else
      scale_and_mask(s, p, mask, row0, kt * kBc + 2 * (lane % 4));
    softmax_scores(s, rows, alphas);
  }

  // out = o / l and lse for the thread's rows (store_rows), the sink's term folded in first.
  __device__ __forceinline__ void store_output(const Params& p) {
    if constexpr (kVariants)
      if (p.sinks) fold_sink(o, rows, HeadMods::of(p, c.b, c.h).sink2, lane);
    store_rows<T>(o, rows, p, head_ptr<T>(p.out, p.out_stride, c.b, c.h), lse_head(p, c.b, c.h),
                  row0, lane);
  }

  // The slow path for the tile from key k0: pv_visible_keys on this warp's registers.
  // mma_warp is not kept as a member: read from one, it cost fused_wgmma 2 registers at
  // D = 128 (nvcc 13.0).
  template <class ValueLayout, int kWarps, int kScratchElems, class SyncMmaThreads>
  __device__ __forceinline__ void pv_visible_keys_only(const Params& p, int mma_warp,
                                                       const T* v_tile, T* scratch, int k0,
                                                       const SyncMmaThreads& sync_mma_threads) {
    pv_visible_keys<ValueLayout, kVariants, T, kD, kKS, kWarps, kScratchElems>(
        a, o, v_tile, scratch, p, mma_warp, lane, row0, k0, sync_mma_threads);
  }
};

// ---- the pipelined schedule (fused_wgmma_pipelined, and fused_tma's consumers) -------------
// FlashAttention-3's intra-warpgroup overlap (header comment) is one schedule for both ways of
// bringing the tiles in: cp.async stages loaded by every thread (fused_wgmma) and a TMA ring
// filled by a producer warpgroup (fused_tma.cuh). What differs is when a tile has landed, when
// its stage may be reused and where it lies: the kernel's hooks, one callable per tag below.
struct FirstTilesLanded {};      // (): Q and K_0 have landed
struct TilesLanded {};           // (j): K_j and V_{j-1} have landed
struct LastValuesLanded {};      // (j): V_j, the last tile's values, have landed
struct KeysDone {};              // (j): Q·K_jᵀ is done with K_j's stage (every j, once)
struct ValuesDone {};            // (j): P_j·V_j is done with V_j's stage (j < count - 1 only: the last
                                 // tile's V stage is the caller's after the call returns)
struct TileDone {};              // (): a tile's softmax is done (the stages the next loads reuse)
struct KeyDesc {};               // (j) -> K_j's descriptor
struct ValueDesc {};             // (j) -> V_j's descriptor
struct NeedsVisibleKeysOnly {};  // (j) -> whether V_j skips the tensor cores (uniform over the MMAs' threads)
struct PvVisibleKeysOnly {};     // (jv, j_scratch): that slow path, K_{j_scratch}'s stage as scratch

// Optional (a kernel's hooks may leave them out): around each section of wgmma issues, the
// section's number: 0 issues S_0, j (1 .. count-1) S_j and P_{j-1}·V_{j-1}, count P_last·V_last
// (empty where the slow path takes it). A kernel whose consumer warpgroups take turns at the
// tensor cores (fused_tma's ping-pong) waits for its turn in IssueBegin and hands it over in
// IssueEnd; no other work lies inside a section.
struct IssueBegin {};  // (section)
struct IssueEnd {};    // (section)

template <class Tiles, class Tag>
__device__ __forceinline__ void issue_turn(const Tiles& tiles, Tag tag, int section) {
  if constexpr (std::is_invocable_v<const Tiles&, Tag, int>) tiles(tag, section);
}

// The hooks as one object: lambdas each taking its tag first.
template <class... Hook>
struct Hooks : Hook... {
  using Hook::operator()...;
};
template <class... Hook>
Hooks(Hook...) -> Hooks<Hook...>;

// Tiles 0 .. count-1 (count > 0) in the pipelined schedule, tile j being the sequence's key tile
// first + j (the hooks take j, the band's questions first + j): iteration j issues S_j = Q·K_jᵀ and
// O += P_{j-1}·V_{j-1}, waits for S_j and computes P_j under the P·V; tile 0 is peeled off and
// the last P·V follows the loop, so that every branch issues and waits for its own wgmma groups
// (ptxas serializes wgmma whose waits it finds in divergent paths, C7518). The slow path
// (a NaN/Inf value at a key some rows do not see) and the masking tiles wait for both groups
// first: the masking's per-warp branch between the waits made ptxas serialize every wgmma of
// the kernel (C7514).
template <class Slices, int kQRows, class T, int kD, int kBc, bool kVariants, class Tiles>
__device__ __forceinline__ void pipelined_key_tiles(const Tiles& tiles, int first, int count,
                                                    std::uint64_t q_desc, const Params& p,
                                                    WgmmaWarp<T, kD, kBc, kVariants>& warp) {
  constexpr int kKS = kBc / 16;
  tiles(FirstTilesLanded{});
  issue_turn(tiles, IssueBegin{}, 0);
  issue_qk<Slices, T, kD, kBc, kQRows>(warp.s, q_desc, tiles(KeyDesc{}, 0));
  issue_turn(tiles, IssueEnd{}, 0);
  wgmma_wait_group<0>();
  wgmma_fence_operands(warp.s);
  tiles(KeysDone{}, 0);
  warp.scale_mask_softmax(p, first, true);
  pack_probs<T>(warp.s, warp.a);
  tiles(TileDone{});
#pragma unroll 1
  for (int j = 1; j < count; ++j) {
    tiles(TilesLanded{}, j);
    if (tiles(NeedsVisibleKeysOnly{}, j - 1)) {
      issue_turn(tiles, IssueBegin{}, j);
      issue_qk<Slices, T, kD, kBc, kQRows>(warp.s, q_desc, tiles(KeyDesc{}, j));
      issue_turn(tiles, IssueEnd{}, j);
      wgmma_wait_group<0>();
      wgmma_fence_operands(warp.s);
      warp.scale_mask_softmax(p, first + j, true);
      tiles(PvVisibleKeysOnly{}, j - 1, j);  // scratch: K_j's stage, whose Q·Kᵀ is done
      tiles(KeysDone{}, j);
      tiles(ValuesDone{}, j - 1);
    } else if (warp.template hides_block_keys<kQRows>(p, first + j)) {
      issue_turn(tiles, IssueBegin{}, j);
      issue_qk<Slices, T, kD, kBc, kQRows>(warp.s, q_desc, tiles(KeyDesc{}, j));
      issue_pv<Slices, T, kD, kKS>(warp.a, warp.o, tiles(ValueDesc{}, j - 1));
      issue_turn(tiles, IssueEnd{}, j);
      wgmma_wait_group<0>();
      wgmma_fence_operands(warp.s);
      pv_done<kD, kKS>(warp.a, warp.o);
      tiles(KeysDone{}, j);
      tiles(ValuesDone{}, j - 1);
      warp.scale_mask_softmax(p, first + j, true);
    } else {
      issue_turn(tiles, IssueBegin{}, j);
      issue_qk<Slices, T, kD, kBc, kQRows>(warp.s, q_desc, tiles(KeyDesc{}, j));
      issue_pv<Slices, T, kD, kKS>(warp.a, warp.o, tiles(ValueDesc{}, j - 1));
      issue_turn(tiles, IssueEnd{}, j);
      wgmma_wait_group<1>();  // S_j; P_{j-1}·V_{j-1} may still run
      wgmma_fence_operands(warp.s);
      tiles(KeysDone{}, j);
      warp.scale_mask_softmax(p, first + j, false);  // overlaps P_{j-1}·V_{j-1}
      wgmma_wait_group<0>();
      pv_done<kD, kKS>(warp.a, warp.o);
      tiles(ValuesDone{}, j - 1);
    }
    rescale_rows(warp.o, warp.alphas);
    pack_probs<T>(warp.s, warp.a);
    tiles(TileDone{});
  }
  // The last tile's P·V: its V came after its K.
  const int last = count - 1;
  tiles(LastValuesLanded{}, last);
  if (tiles(NeedsVisibleKeysOnly{}, last)) {
    issue_turn(tiles, IssueBegin{}, count);  // an empty section: the slow path syncs both warpgroups
    issue_turn(tiles, IssueEnd{}, count);
    tiles(PvVisibleKeysOnly{}, last, last);
  } else {
    issue_turn(tiles, IssueBegin{}, count);
    issue_pv<Slices, T, kD, kKS>(warp.a, warp.o, tiles(ValueDesc{}, last));
    issue_turn(tiles, IssueEnd{}, count);
    wgmma_wait_group<0>();
    pv_done<kD, kKS>(warp.a, warp.o);
  }
}

}  // namespace fattn::cuda
