// fattn — fused attention for float16 / bfloat16 on Hopper with the bulk tensor copy engine
// (TMA) and warp specialization (sm_90a): FlashAttention-3's producer/consumer structure
// around wgmma_consumer.cuh's pipelined schedule.
//
// Why: fused_wgmma stages K and V with cp.async, 16 bytes per thread per row, into the
// no-swizzle core-matrix layout; on the H100 it was L2-bound (L2 throughput 90 %, tensor
// pipe 25 %, results/h100/2026-11-26). Here one thread issues each tile as D/64 bulk tensor
// copies of 64 columns × Bc rows (whole 128-byte rows per request) into 128-byte-swizzled
// shared memory (tma.cuh), which wgmma reads without bank conflicts.
//
// One block = one query tile of Br = 128 rows of one (batch, head), 3 warpgroups:
//   warpgroup 0 (producer): setmaxnreg down to 24 registers; thread 0 loads Q (one mbarrier,
//     q_full), then K_0, and for j = 0, 1, ...: K_{j+1}, V_j, each into stage j % kStages of
//     its ring after waiting for that stage's `empty` barrier (phase parity (j/kStages+1)%2:
//     the first round passes at once), announcing the tile's bytes on its `full` barrier
//     (arrive.expect_tx) before the copies. Loads stop at the band's upper edge (the causal
//     limit) of the tile's last row, as in the other kernels, and (the variant
//     instantiation) start at the lower edge (a left window) of its first row: tiles outside
//     the band are never loaded.
//   warpgroups 1, 2 (consumers, 64 query rows each): setmaxnreg up to 240; the
//     fused_wgmma_pipelined schedule: iteration j waits for K_j and V_{j-1} (full barriers,
//     parity (j/kStages)%2), issues S_j = Q·K_jᵀ (SS wgmma, both operands swizzled K-major)
//     and O += P_{j-1}·V_{j-1} (RS wgmma, V swizzled MN-major), waits for S_j, releases K_j's
//     stage (one arrival per consumer warpgroup on its empty barrier), computes the softmax
//     of S_j under the P·V, waits for it and releases V_{j-1}'s stage.
// Softmax, masking, causal tile skipping, the NaN/Inf rule for hidden keys' values and the
// epilogue are fused_wgmma's (warp_softmax.cuh; the slow path below reads the swizzled V and
// synchronizes the 256 consumer threads with a named barrier instead of __syncthreads).
// The variants (a lower band edge, softcap, ALiBi, sinks: score_mods.cuh) run in a second
// instantiation, so the plain forward's machine code is what was measured.
#pragma once

#include <cuda.h>

#include <string>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/device.hpp"
#include "cuda/host_checks.hpp"
#include "cuda/tensor_map.hpp"
#include "cuda/tma_host.hpp"
#include "cuda/tile_config.hpp"
#include "cuda/tma.cuh"
#include "cuda/warp_softmax.cuh"
#include "cuda/wgmma.cuh"
#include "cuda/wgmma_consumer.cuh"

namespace fattn::cuda {

// kRing: the K/V ring's stages (tma_tiles' by default; tma_alternative_stages for the
// benchmark's other depth).
template <class T, int kD, int kRing = tma_tiles(kD).stages>
struct TmaShape {
  static_assert(tma_head_dim(kD), "the TMA kernel is built for head dims 64, 128 and 256");
  static constexpr int kConsumers = tma_tiles(kD).consumers;  // warpgroups of 64 query rows
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kThreads = 128 + kConsumerThreads;  // + the producer warpgroup
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  static constexpr int kBr = 64 * kConsumers;
  static constexpr int kBc = tma_tiles(kD).bc;
  static constexpr int kStages = kRing;
  static constexpr int kPanels = kD / kPanelCols;
  static constexpr int kTileElems = kBc * kD;
  static constexpr std::uint32_t kQBytes = kBr * kD * 2;
  static constexpr std::uint32_t kTileBytes = kBc * kD * 2;
  // Shared memory from a 1024-aligned base: Q, the K stages, the V stages, the barriers
  // (q_full, then k_full, k_empty, v_full, v_empty: kStages each).
  static constexpr int kKOffset = kQBytes;
  static constexpr int kVOffset = kKOffset + kStages * kTileBytes;
  static constexpr int kBarOffset = kVOffset + kStages * kTileBytes;
  static constexpr int kBarriers = 1 + 4 * kStages;
  static constexpr int kSmemBytes = kBarOffset + 8 * kBarriers + kSwizzleAtomBytes;  // + alignment
  // Registers per thread after setmaxnreg (multiples of 8, 24..256); the sum must fit the
  // SM's 64K registers.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(kBc == 64 || kBc == 128, "m64n64 or m64n128 for S");
  static_assert(kQBytes % kSwizzleAtomBytes == 0 && kTileBytes % kSwizzleAtomBytes == 0,
                "every tile starts 1024-aligned");
  static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= 65536,
                "the warpgroups' registers fit the SM");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block on sm_90");
};

// The shared memory of a TmaShape S from a 1024-aligned base: Q, the K and V stages, the
// barriers (q_full, then k_full, k_empty, v_full, v_empty: kStages each); the persistent
// kernel's view of it.
template <class T, class S>
struct TmaSmem {
  unsigned char* base;
  __device__ __forceinline__ T* k_stage(int s) const {
    return reinterpret_cast<T*>(base + S::kKOffset + s * S::kTileBytes);
  }
  __device__ __forceinline__ T* v_stage(int s) const {
    return reinterpret_cast<T*>(base + S::kVOffset + s * S::kTileBytes);
  }
  __device__ __forceinline__ std::uint64_t* q_full() const {
    return reinterpret_cast<std::uint64_t*>(base + S::kBarOffset);
  }
  __device__ __forceinline__ std::uint64_t* k_full() const { return q_full() + 1; }
  __device__ __forceinline__ std::uint64_t* k_empty() const { return k_full() + S::kStages; }
  __device__ __forceinline__ std::uint64_t* v_full() const { return k_empty() + S::kStages; }
  __device__ __forceinline__ std::uint64_t* v_empty() const { return v_full() + S::kStages; }
};

// The three tensor maps (tensor_map.hpp), passed by value as a __grid_constant__ parameter.
struct TmaMaps {
  CUtensorMap q, k, v;
};

// Whether a swizzled tile (all of it: rows past the sequence are zero-filled) holds a NaN or
// an infinity; every consumer thread calls it (named barrier 1).
template <class T, int kTileBytes, int kThreads>
__device__ __forceinline__ bool consumers_see_nonfinite(const void* tile, int ctid) {
  const uint4* chunks = static_cast<const uint4*>(tile);
  bool bad = false;
#pragma unroll 1
  for (int c = ctid; c < kTileBytes / 16; c += kThreads) bad |= chunk_nonfinite<T>(chunks[c]);
  return named_sync_or(1, kThreads, bad);
}

// Where pv_visible_keys (wgmma_consumer.cuh) finds V's values in the swizzled layout, as element
// offsets (sw128_offset / 2): columns 2t, 2t + 1 of the key's row, then columns 8d + 2t, +1 in
// chunk d % 8 XOR key % 8 of panel d / 8.
template <int kBc>
struct Sw128Values {
  __device__ __forceinline__ static int key_offset(int key, int t) {
    return key * (kSwizzleRowBytes / 2) + 2 * t;
  }
  __device__ __forceinline__ static int pair_offset(int key, int d) {
    return (d / 8) * (kBc * kSwizzleRowBytes / 2) + ((d % 8) ^ (key % 8)) * 8;
  }
};

// The slow path on the swizzled V, P through `scratch` (a K stage no MMA reads any more).
// Every consumer thread calls it; named barrier 1 instead of __syncthreads, which would wait
// for the producer too. Ends with the scratch's generic writes fenced for the copy engine's
// next write into it.
template <int kWarps, int kScratchElems, class T, int kD, int kBc, bool kVariants>
__device__ __forceinline__ void pv_visible_keys_sw128(WgmmaWarp<T, kD, kBc, kVariants>& consumer_warp,
                                                      const Params& p, int consumer_warp_index,
                                                      const T* v_tile, T* scratch, int k0) {
  consumer_warp.template pv_visible_keys_only<Sw128Values<kBc>, kWarps, kScratchElems>(
      p, consumer_warp_index, v_tile, scratch, k0, [] { named_sync(1, 32 * kWarps); });
  fence_proxy_async_shared();  // generic writes to the scratch, before the copy engine's
  named_sync(1, 32 * kWarps);
}

// The producer's load of one K or V tile into the ring: ring slot `slot` (stage slot % kStages,
// once the consumers have released the tile that was there, slot - kStages) ← kBc rows from
// row_of() of (kv_head, b) of `map`, completing on the stage's full barrier.
template <class S, class RowOf>
__device__ __forceinline__ void load_ring_tile(const CUtensorMap* map, unsigned char* ring,
                                               std::uint64_t* full, std::uint64_t* empty, int slot,
                                               RowOf row_of, int kv_head, int b) {
  const int s = slot % S::kStages;
  mbar_wait(empty + s, ((slot / S::kStages) & 1) ^ 1);
  mbar_arrive_expect_tx(full + s, S::kTileBytes);
  unsigned char* const dst = ring + s * S::kTileBytes;
#pragma unroll
  for (int panel = 0; panel < S::kPanels; ++panel)
    tma_load_4d(dst + panel * sw128_panel_bytes<S::kBc>(), map, full + s, panel * kPanelCols,
                row_of(), kv_head, b);
}

// ---- the kernel ------------------------------------------------------------------------------

// kVariants: the instantiation that takes a lower band edge, softcap, ALiBi and sinks
// (score_mods.cuh); the launcher runs it where Params::variants says so.
template <class T, int kD, bool kVariants, int kRing>
__global__ void __launch_bounds__(TmaShape<T, kD, kRing>::kThreads, 1)
    fused_tma_kernel(const Params p, const __grid_constant__ TmaMaps maps) {
  using S = TmaShape<T, kD, kRing>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // The dynamic window's start is not promised to be 1024-aligned: round up (kSmemBytes
  // holds the slack). Written out, not through TmaSmem as the persistent kernel: sharing it
  // moved this kernel's SASS (nvcc 13.0), which the H200 measured.
  const std::uint32_t raw = smem_u32(smem_raw);
  unsigned char* const smem =
      smem_raw + (((raw + kSwizzleAtomBytes - 1) & ~std::uint32_t(kSwizzleAtomBytes - 1)) - raw);
  auto k_stage = [&](int s) { return reinterpret_cast<T*>(smem + S::kKOffset + s * S::kTileBytes); };
  auto v_stage = [&](int s) { return reinterpret_cast<T*>(smem + S::kVOffset + s * S::kTileBytes); };
  std::uint64_t* const bars = reinterpret_cast<std::uint64_t*>(smem + S::kBarOffset);
  std::uint64_t* const q_full = bars;
  std::uint64_t* const k_full = bars + 1;
  std::uint64_t* const k_empty = k_full + S::kStages;
  std::uint64_t* const v_full = k_empty + S::kStages;
  std::uint64_t* const v_empty = v_full + S::kStages;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32, warpgroup = warp / 4;
  const FusedBlock<T> block = fused_block<T>(p, S::kBr, S::kBc);
  const BlockCoord c = block.c;
  // Key tiles [first, first + tiles) of the sequence; ring slot j holds tile first + j.
  const int first = kVariants ? block.first_tile : 0;
  const int tiles = kVariants ? max(block.tiles - first, 0) : block.tiles;

  if (tid == 0) {
    mbar_init(q_full, 1);
    for (int s = 0; s < S::kStages; ++s) {
      mbar_init(k_full + s, 1);  // the producer's arrive.expect_tx
      mbar_init(v_full + s, 1);
      mbar_init(k_empty + s, S::kConsumers);  // one arrival per consumer warpgroup
      mbar_init(v_empty + s, S::kConsumers);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (warpgroup == 0) {
    // ---- producer ----
    setmaxnreg_dec<S::kProducerRegs>();
    if (tid == 0 && tiles > 0) {
      tma_prefetch_map(&maps.q);
      tma_prefetch_map(&maps.k);
      tma_prefetch_map(&maps.v);
      mbar_arrive_expect_tx(q_full, S::kQBytes);
#pragma unroll
      for (int panel = 0; panel < S::kPanels; ++panel)
        tma_load_4d(smem + panel * sw128_panel_bytes<S::kBr>(), &maps.q, q_full,
                    panel * kPanelCols, c.q0, c.h, c.b);
      // Tile j of K (or V) into stage j % kStages, once the consumers have released the
      // tile that was there (j - kStages).
      auto load = [&](const CUtensorMap* map, unsigned char* ring, std::uint64_t* full,
                      std::uint64_t* empty, int j) {
        load_ring_tile<S>(map, ring, full, empty, j, [&] { return (first + j) * S::kBc; }, c.kv_head, c.b);
      };
      load(&maps.k, smem + S::kKOffset, k_full, k_empty, 0);
#pragma unroll 1
      for (int j = 0; j < tiles; ++j) {
        if (j + 1 < tiles) load(&maps.k, smem + S::kKOffset, k_full, k_empty, j + 1);
        load(&maps.v, smem + S::kVOffset, v_full, v_empty, j);
      }
    }
  } else {
    // ---- consumers ----
    setmaxnreg_inc<S::kConsumerRegs>();
    const int ctid = tid - 128;             // 0 .. 255
    const int cwarp = warp - 4;             // 0 .. 7
    const int consumer = warpgroup - 1;     // 64 query rows each
    const bool signals = ctid % 128 == 0;   // the warpgroup's arrival on an empty barrier
    // The warpgroup's 64 rows of Q: row 64·consumer of each panel (8 KB in, 1024-aligned).
    const std::uint64_t q_desc =
        sw128_k_major_desc<S::kBr>(smem + consumer * 64 * kSwizzleRowBytes);
    auto k_desc = [&](int s) { return sw128_k_major_desc<S::kBc>(k_stage(s)); };
    auto v_desc = [&](int s) { return sw128_mn_major_desc<S::kBc>(v_stage(s)); };
    auto wait_k = [&](int j) { mbar_wait(k_full + j % S::kStages, (j / S::kStages) & 1); };
    auto wait_v = [&](int j) { mbar_wait(v_full + j % S::kStages, (j / S::kStages) & 1); };
    auto release_k = [&](int j) {
      if (signals) mbar_arrive(k_empty + j % S::kStages);
    };
    auto release_v = [&](int j) {
      if (signals) mbar_arrive(v_empty + j % S::kStages);
    };

    WgmmaWarp<T, kD, S::kBc, kVariants> this_warp(c, cwarp, lane);

    if (tiles > 0) {
      const auto ring = Hooks{
          [&](FirstTilesLanded) {
            mbar_wait(q_full, 0);
            wait_k(0);
          },
          [&](TilesLanded, int j) {
            wait_k(j);
            wait_v(j - 1);
          },
          // The last tile's K stage was released, but the producer has nothing left to load
          // into a K stage (V_last is its last copy), so the slow path may use it.
          [&](LastValuesLanded, int j) { wait_v(j); },
          [&](KeysDone, int j) { release_k(j); }, [&](ValuesDone, int j) { release_v(j); },
          [&](TileDone) {},
          [&](KeyDesc, int j) { return k_desc(j % S::kStages); },
          [&](ValueDesc, int j) { return v_desc(j % S::kStages); },
          // Whether V_j must skip the tensor cores (wgmma_consumer.cuh): uniform over the consumers.
          [&](NeedsVisibleKeysOnly, int j) {
            return this_warp.template crosses_diagonal<S::kBr>(p, first + j) &&
                   consumers_see_nonfinite<T, S::kTileBytes, S::kConsumerThreads>(
                       v_stage(j % S::kStages), ctid);
          },
          [&](PvVisibleKeysOnly, int jv, int j_scratch) {
            pv_visible_keys_sw128<S::kConsumerWarps, S::kTileElems>(
                this_warp, p, cwarp, v_stage(jv % S::kStages), k_stage(j_scratch % S::kStages),
                (first + jv) * S::kBc);
          }};
      pipelined_key_tiles<Sw128Slices, S::kBr>(ring, first, tiles, q_desc, p, this_warp);
    }
    // tiles == 0: no key visible to any row of the tile: 0 and lse = -inf (or the sink)
    this_warp.store_output(p);
  }
}

// ---- the persistent schedule (Kernel::fused_tma_persistent) ----------------------------------
// One block per SM walks the work units blockIdx.x, blockIdx.x + gridDim.x, ... of
// block_coord's numbering (with an upper band edge the longest first), FlashAttention 3's
// static persistent scheduler: the K/V ring and its barrier phases run on from one unit to
// the next (ring slot `base + j` holds the unit's key tile j, base counting the slots of the
// block's earlier units), Q is reloaded per unit once both consumer warpgroups release it
// (q_empty), and a unit's epilogue (store_output) runs while the producer already loads the
// next unit's Q and K/V. Each unit's last K stage is released only after its P·V, since the
// slow path may use it as scratch while the producer has the next unit's tiles to load. The
// plain forward only (no variants); shared memory as fused_tma's plus the q_empty barrier.
template <class T, int kD, int kRing>
struct TmaPersistentShape : TmaShape<T, kD, kRing> {
  static constexpr int kQEmptyOffset = TmaShape<T, kD, kRing>::kBarOffset +
                                       8 * TmaShape<T, kD, kRing>::kBarriers;
  static constexpr int kSmemBytes = TmaShape<T, kD, kRing>::kSmemBytes + 8;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block on sm_90");
};

// kPingPong (Kernel::fused_tma_pingpong): the two consumer warpgroups also take turns at the
// tensor cores, FlashAttention 3's ping-pong: each section of wgmma issues
// (pipelined_key_tiles' IssueBegin / IssueEnd) waits at its warpgroup's named barrier for the
// other's hand-over, so one warpgroup's softmax runs under the other's products. Per unit,
// consumer 1 hands consumer 0 the first turn and keeps its own last hand-over, so both
// barriers see as many arrivals as waits (count + 1 each).
constexpr int kTurnBarrier = 2;  // named barriers 2 and 3 (1: the consumers' own sync)

template <class T, int kD, int kRing, bool kPingPong>
__global__ void __launch_bounds__(TmaShape<T, kD, kRing>::kThreads, 1)
    fused_tma_persistent_kernel(const Params p, const __grid_constant__ TmaMaps maps, unsigned units) {
  using S = TmaPersistentShape<T, kD, kRing>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const TmaSmem<T, S> shared{aligned_smem(smem_raw)};
  unsigned char* const smem = shared.base;
  auto k_stage = [&](int s) { return shared.k_stage(s); };
  auto v_stage = [&](int s) { return shared.v_stage(s); };
  std::uint64_t* const q_full = shared.q_full();
  std::uint64_t* const k_full = shared.k_full();
  std::uint64_t* const k_empty = shared.k_empty();
  std::uint64_t* const v_full = shared.v_full();
  std::uint64_t* const v_empty = shared.v_empty();
  std::uint64_t* const q_empty = reinterpret_cast<std::uint64_t*>(smem + S::kQEmptyOffset);

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32, warp = tid / 32, warpgroup = warp / 4;
  if (tid == 0) {
    mbar_init(q_full, 1);
    mbar_init(q_empty, S::kConsumers);
    for (int s = 0; s < S::kStages; ++s) {
      mbar_init(k_full + s, 1);
      mbar_init(v_full + s, 1);
      mbar_init(k_empty + s, S::kConsumers);
      mbar_init(v_empty + s, S::kConsumers);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (warpgroup == 0) {
    // ---- producer ----
    setmaxnreg_dec<S::kProducerRegs>();
    if (tid != 0) return;
    tma_prefetch_map(&maps.q);
    tma_prefetch_map(&maps.k);
    tma_prefetch_map(&maps.v);
    int base = 0, q_uses = 0;
#pragma unroll 1
    for (unsigned unit = blockIdx.x; unit < units; unit += gridDim.x) {
      const FusedBlock<T> block = fused_block_at<T>(p, S::kBr, S::kBc, unit);
      const BlockCoord c = block.c;
      const int tiles = block.tiles;
      if (tiles == 0) continue;  // the consumers skip it too
      auto load = [&](const CUtensorMap* map, unsigned char* ring, std::uint64_t* full,
                      std::uint64_t* empty, int j) {
        load_ring_tile<S>(map, ring, full, empty, base + j, [&] { return j * S::kBc; }, c.kv_head, c.b);
      };
      load(&maps.k, smem + S::kKOffset, k_full, k_empty, 0);  // needs no Q: before the wait
      mbar_wait(q_empty, (q_uses & 1) ^ 1);  // the consumers are done with the last unit's Q
      mbar_arrive_expect_tx(q_full, S::kQBytes);
#pragma unroll
      for (int panel = 0; panel < S::kPanels; ++panel)
        tma_load_4d(smem + panel * sw128_panel_bytes<S::kBr>(), &maps.q, q_full,
                    panel * kPanelCols, c.q0, c.h, c.b);
#pragma unroll 1
      for (int j = 0; j < tiles; ++j) {
        if (j + 1 < tiles) load(&maps.k, smem + S::kKOffset, k_full, k_empty, j + 1);
        load(&maps.v, smem + S::kVOffset, v_full, v_empty, j);
      }
      base += tiles;
      ++q_uses;
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<S::kConsumerRegs>();
  const int ctid = tid - 128;
  const int cwarp = warp - 4;
  const int consumer = warpgroup - 1;
  const bool signals = ctid % 128 == 0;
  const std::uint64_t q_desc = sw128_k_major_desc<S::kBr>(smem + consumer * 64 * kSwizzleRowBytes);
  int base = 0, q_uses = 0;
#pragma unroll 1
  for (unsigned unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const FusedBlock<T> block = fused_block_at<T>(p, S::kBr, S::kBc, unit);
    const int tiles = block.tiles;
    WgmmaWarp<T, kD, S::kBc, false> this_warp(block.c, cwarp, lane);
    if (tiles > 0) {
      auto stage = [&](int j) { return (base + j) % S::kStages; };
      auto parity = [&](int j) { return static_cast<std::uint32_t>(((base + j) / S::kStages) & 1); };
      auto release = [&](std::uint64_t* empty, int j) {
        if (signals) mbar_arrive(empty + stage(j));
      };
      const auto ring = Hooks{
          [&](FirstTilesLanded) {
            mbar_wait(q_full, q_uses & 1);
            mbar_wait(k_full + stage(0), parity(0));
          },
          [&](TilesLanded, int j) {
            mbar_wait(k_full + stage(j), parity(j));
            mbar_wait(v_full + stage(j - 1), parity(j - 1));
          },
          [&](LastValuesLanded, int j) { mbar_wait(v_full + stage(j), parity(j)); },
          // the unit's last K stage stays until its P·V is done (the slow path's scratch);
          // S_last is done, so Q is free: the next unit's Q loads under this P·V
          [&](KeysDone, int j) {
            if (j + 1 < tiles) release(k_empty, j);
            else if (signals) mbar_arrive(q_empty);
          },
          [&](ValuesDone, int j) { release(v_empty, j); }, [&](TileDone) {},
          [&](KeyDesc, int j) { return sw128_k_major_desc<S::kBc>(k_stage(stage(j))); },
          [&](ValueDesc, int j) { return sw128_mn_major_desc<S::kBc>(v_stage(stage(j))); },
          [&](NeedsVisibleKeysOnly, int j) {
            return this_warp.template crosses_diagonal<S::kBr>(p, j) &&
                   consumers_see_nonfinite<T, S::kTileBytes, S::kConsumerThreads>(v_stage(stage(j)), ctid);
          },
          [&](PvVisibleKeysOnly, int jv, int j_scratch) {
            pv_visible_keys_sw128<S::kConsumerWarps, S::kTileElems>(
                this_warp, p, cwarp, v_stage(stage(jv)), k_stage(stage(j_scratch)), jv * S::kBc);
          }};
      if constexpr (kPingPong) {
        static_assert(S::kConsumers == 2, "two consumer warpgroups take turns");
        constexpr int kPair = 2 * 128;  // one warpgroup waits, the other arrives
        if (consumer == 1) named_arrive(kTurnBarrier, kPair);  // consumer 0 goes first
        const auto turns = Hooks{
            ring, [&](IssueBegin, int) { named_sync(kTurnBarrier + consumer, kPair); },
            [&](IssueEnd, int section) {
              if (consumer == 0 || section < tiles) named_arrive(kTurnBarrier + 1 - consumer, kPair);
            }};
        pipelined_key_tiles<Sw128Slices, S::kBr>(turns, 0, tiles, q_desc, p, this_warp);
      } else {
        pipelined_key_tiles<Sw128Slices, S::kBr>(ring, 0, tiles, q_desc, p, this_warp);
      }
      release(k_empty, tiles - 1);
      release(v_empty, tiles - 1);
      base += tiles;
      ++q_uses;
    }
    this_warp.store_output(p);
  }
}

// The host side: the tensor maps of Q, K and V (tma_host.hpp), then the launch.
// The tensor maps of one instantiation's boxes: Q in tiles of Br rows, K and V of Bc.
template <class T, int D, int kRing>
TmaMaps tma_maps(const Params& p) {
  using S = TmaShape<T, D, kRing>;
  TmaMaps maps;
  auto geometry = [&](const void* data, const Strides3& st, int heads, int seq) {
    return head_geometry(data, st, p.batch, heads, seq, p.head_dim);
  };
  constexpr CUtensorMapDataType type = tma_data_type<T>();
  encode_or_fail(&maps.q, type, geometry(p.q, p.q_stride, p.q_heads, p.q_len), S::kBr, "q");
  encode_or_fail(&maps.k, type, geometry(p.k, p.k_stride, p.kv_heads, p.kv_len), S::kBc, "k");
  encode_or_fail(&maps.v, type, geometry(p.v, p.v_stride, p.kv_heads, p.kv_len), S::kBc, "v");
  return maps;
}

// The launch of one instantiation: the grid, its shared memory, the tensor maps.
template <class T, int D, bool kVariants, int kRing>
void launch_tma_instance(const Params& p, cudaStream_t stream) {
  using S = TmaShape<T, D, kRing>;
  const long long tiles = (p.q_len + S::kBr - 1) / S::kBr;
  const auto blocks = static_cast<unsigned>(tiles * p.batch * p.q_heads);
  if (blocks == 0) return;
  const TmaMaps maps = tma_maps<T, D, kRing>(p);
  auto kernel = fused_tma_kernel<T, D, kVariants, kRing>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes),
             "fused_tma_kernel");
  kernel<<<blocks, S::kThreads, S::kSmemBytes, stream>>>(p, maps);
  check_launch("fused_tma_kernel");
}

// The persistent schedule: one block per SM (shared memory allows one), at most one per unit.
// `cap`: at most this many blocks (0: the device's SMs).
template <class T, int D, int kRing, bool kPingPong>
void launch_tma_persistent(const Params& p, int cap, cudaStream_t stream) {
  using S = TmaPersistentShape<T, D, kRing>;
  if (p.variants)  // the plan refuses them (Takes::upper_edge): never run them as the plain forward
    fail("internal error: the persistent TMA kernels take no variants");
  const long long units = (p.q_len + S::kBr - 1) / S::kBr * static_cast<long long>(p.batch) * p.q_heads;
  if (units == 0) return;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "fused_tma_persistent (cudaGetDevice)");
  const long long grid = cap > 0 ? cap : multiprocessors(device);
  const auto blocks = static_cast<unsigned>(units < grid ? units : grid);
  const TmaMaps maps = tma_maps<T, D, kRing>(p);
  auto kernel = fused_tma_persistent_kernel<T, D, kRing, kPingPong>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes),
             "fused_tma_persistent_kernel");
  kernel<<<blocks, S::kThreads, S::kSmemBytes, stream>>>(p, maps, static_cast<unsigned>(units));
  check_launch("fused_tma_persistent_kernel");
}

// The variants' instantiation where Params::variants says so; the plain one at the ring
// depth the plan chose (launch.stages: 0 the table's; plan.cpp's force_stages checked it).
template <class T, int D>
void launch_fused_tma(const Params& p, const FusedLaunch& launch, cudaStream_t stream) {
  constexpr int kTable = tma_tiles(D).stages, kOther = tma_alternative_stages(D);
  if (launch.kernel == Kernel::fused_tma_persistent)
    return launch_tma_persistent<T, D, kTable, false>(p, launch.blocks, stream);
  if (launch.kernel == Kernel::fused_tma_pingpong)
    return launch_tma_persistent<T, D, kTable, true>(p, launch.blocks, stream);
  if (p.variants) return launch_tma_instance<T, D, true, kTable>(p, stream);
  if constexpr (kOther != 0)
    if (launch.stages == kOther) return launch_tma_instance<T, D, false, kOther>(p, stream);
  launch_tma_instance<T, D, false, kTable>(p, stream);
}

}  // namespace fattn::cuda
