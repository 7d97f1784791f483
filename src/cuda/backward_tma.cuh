// fattn — the Hopper backward (sm_90a, float16 / bfloat16): the gradients of attention with
// wgmma on TMA-fed, 128-byte-swizzled tiles, warp-specialized as fused_tma.cuh's forward.
//
// Three launches, no atomics (the gradients are the same bits on every run):
//   rows        one warp per query row: lse_log2 = lse · log2 e and delta = rowsum(dO ∘ O)
//               − dlse into BackwardParams' padded rows.
//   key blocks  one block per 128 keys of one (batch, kv head): K and V stay in shared memory;
//               for every query head of the kv head's group and every query tile the band
//               reaches, the (Q, dO) tile and its lse_log2 / delta stream through a ring.
//               Each consumer warpgroup owns 64 keys and computes, in registers,
//                 Sᵀ  = K·Qᵀ             SS wgmma, both K-major (fused_tma's Q·Kᵀ)
//                 dPᵀ = V·dOᵀ            SS wgmma, both K-major
//                 Pᵀ  = exp2(Sᵀ·scale·log2 e − lse_log2)     (column-wise: one query each)
//                 dSᵀ = Pᵀ ∘ (dPᵀ − delta)
//                 dV += Pᵀ·dO            RS wgmma, dO MN-major (fused_tma's P·V)
//                 dK += dSᵀ·Q            RS wgmma, Q MN-major
//               and writes dK·scale and dV once. With GQA the group's query heads are summed
//               here, in order, without copies.
//   query blocks one block per 128 query rows of one (batch, head): Q and dO stay; the (K, V)
//               tiles of the band stream through a ring; each consumer warpgroup owns 64 rows:
//                 S = Q·Kᵀ, dP = dO·Vᵀ (SS), P, dS = P ∘ (dP − delta) (row-wise),
//                 dQ += dS·K             RS wgmma, K MN-major
//               and writes dQ·scale once.
// Every product is one of the two forms the forward runs on the H200 (SS with both operands
// K-major, RS with B MN-major), so the backward adds no new layout assumption; S and dP are
// computed twice (once per kernel), 7 products instead of 5, the price of having no atomics.
//
// Visibility is visibility.cuh's band; a tile with a hidden pair (an edge of the band, the
// sequence ends) masks P and dS to exactly 0 by selection; the others skip the test. Rows
// past q_len and keys past kv_len are zero-filled by the copy engine and never stored.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/backward_params.hpp"
#include "cuda/common.cuh"
#include "cuda/score_mods.cuh"  // softcapped
#include "cuda/tile_config.hpp"
#include "cuda/tma.cuh"
#include "cuda/visibility.cuh"
#include "cuda/wgmma.cuh"
#include "cuda/wgmma_consumer.cuh"  // pack_probs, pv_done

namespace fattn::cuda {

// ---- the row pass -------------------------------------------------------------------------

constexpr int kRowPassWarps = 8;  // rows per block

template <class T>
__global__ void __launch_bounds__(32 * kRowPassWarps)
    backward_rows_kernel(const BackwardParams bp) {
  const Params& p = bp.p;
  const long long row = static_cast<long long>(blockIdx.x) * kRowPassWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const long long per_head = bp.rows_pad;
  if (row >= static_cast<long long>(p.batch) * p.q_heads * per_head) return;
  const int i = static_cast<int>(row % per_head);
  const int h = static_cast<int>(row / per_head % p.q_heads);
  const int b = static_cast<int>(row / per_head / p.q_heads);
  float delta = 0.0f, lse_log2 = __int_as_float(0x7f800000);  // +inf: P = 0 past q_len
  if (i < p.q_len) {
    const T* o = head_ptr<T>(bp.out, bp.out_stride, b, h) + i * bp.out_stride.seq;
    const T* d = head_ptr<T>(bp.dout, bp.dout_stride, b, h) + i * bp.dout_stride.seq;
    float sum = 0.0f;
    for (int c = lane; c < p.head_dim; c += 32) sum = fmaf(to_float(o[c]), to_float(d[c]), sum);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    delta = sum;
    if (bp.dlse) delta -= bp.dlse[b * bp.dlse_stride.batch + h * bp.dlse_stride.head + i * bp.dlse_stride.seq];
    lse_log2 = bp.lse[b * bp.lse_stride.batch + h * bp.lse_stride.head + i * bp.lse_stride.seq] * kLog2e;
  }
  if (lane == 0) {
    bp.delta[row] = delta;
    bp.lse_log2[row] = lse_log2;
    if (p.sinks) {  // d lse / d sink = P_sink, d out / d sink = −P_sink·out: −P_sink·delta
      const bool sees = i < p.q_len && lse_log2 != neg_inf();
      bp.sink_terms[row] = sees ? -exp2f(p.sinks[h] * kLog2e - lse_log2) * delta : 0.0f;
    }
  }
}

// dsinks[h]: the sum of head h's sink terms over batches and rows, in a fixed order (one block
// per head; each thread a strided share, then a tree in shared memory): the same bits on every
// run.
constexpr int kSinkSumThreads = 256;

__global__ void __launch_bounds__(kSinkSumThreads) backward_sinks_kernel(const BackwardParams bp) {
  const Params& p = bp.p;
  const int h = static_cast<int>(blockIdx.x);
  __shared__ float partial[kSinkSumThreads];
  float sum = 0.0f;
  for (int b = 0; b < p.batch; ++b) {
    const float* terms = bp.sink_terms + (static_cast<long long>(b) * p.q_heads + h) * bp.rows_pad;
    for (int i = static_cast<int>(threadIdx.x); i < p.q_len; i += kSinkSumThreads) sum += terms[i];
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int width = kSinkSumThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) bp.dsinks[h] = partial[0];
}

// ---- what both gradient kernels share -------------------------------------------------------

// The tensor maps of the four 16-bit inputs (tensor_map.hpp), a __grid_constant__ parameter.
struct BackwardMaps {
  CUtensorMap q, k, v, dout;
};

// One tile of rows [row0, row0 + kRows) of (head, batch) of `map` into `dst`: one copy per
// 64-column panel, completing on `bar`.
template <int kRows, int kPanels>
__device__ __forceinline__ void load_tile(unsigned char* dst, const CUtensorMap* map,
                                          std::uint64_t* bar, int row0, int head, int b) {
#pragma unroll
  for (int panel = 0; panel < kPanels; ++panel)
    tma_load_4d(dst + panel * sw128_panel_bytes<kRows>(), map, bar, panel * kPanelCols, row0, head, b);
}

// Shared memory of a gradient block, from a 1024-aligned base: a resident pair of tiles of
// kResidentRows rows (K and V, or Q and dO), kStages stages of a streamed pair of kStreamRows
// rows each, kScalars floats per stage (the key blocks' lse_log2 and delta of the tile), then
// the barriers: resident_full, full[kStages], empty[kStages].
// This thread's place in the block: its index, warp, lane and warpgroup (0: the producer).
struct ThreadPlace {
  int tid, warp, lane, warpgroup;
};
__device__ __forceinline__ ThreadPlace thread_place() {
  const int tid = static_cast<int>(threadIdx.x);
  return {tid, tid / 32, tid % 32, tid / 128};
}

// Where a streamed pair's tiles start: their first row and their head.
struct TileAt {
  int row, head;
};

template <int kD, int kResidentRows, int kStreamRows, int kStages, int kScalars>
struct PairRing {
  static constexpr int kPanels = kD / kPanelCols;
  static constexpr std::uint32_t kResidentBytes = kResidentRows * kD * 2;
  static constexpr std::uint32_t kStreamBytes = kStreamRows * kD * 2;
  static constexpr int kStreamOffset = 2 * kResidentBytes;
  static constexpr int kScalarOffset = kStreamOffset + kStages * 2 * kStreamBytes;
  static constexpr int kBarOffset = kScalarOffset + kStages * kScalars * 4;
  static constexpr int kSmemBytes = kBarOffset + 8 * (1 + 2 * kStages) + kSwizzleAtomBytes;
  static_assert(kResidentBytes % kSwizzleAtomBytes == 0 && kStreamBytes % kSwizzleAtomBytes == 0,
                "every tile starts 1024-aligned");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block on sm_90");

  unsigned char* base;
  __device__ __forceinline__ unsigned char* resident(int which) const {
    return base + which * kResidentBytes;
  }
  __device__ __forceinline__ unsigned char* streamed(int stage, int which) const {
    return base + kStreamOffset + (2 * stage + which) * kStreamBytes;
  }
  __device__ __forceinline__ float* scalars(int stage) const {
    return reinterpret_cast<float*>(base + kScalarOffset) + stage * kScalars;
  }
  __device__ __forceinline__ std::uint64_t* resident_full() const {
    return reinterpret_cast<std::uint64_t*>(base + kBarOffset);
  }
  __device__ __forceinline__ std::uint64_t* full(int stage) const { return resident_full() + 1 + stage; }
  __device__ __forceinline__ std::uint64_t* empty(int stage) const {
    return resident_full() + 1 + kStages + stage;
  }
  // The producer's side, by one thread: the resident pair (tiles of `first` and `second` at
  // rows [row, row + kResidentRows) of (head, b)), then streamed pair t (kStreamRows rows)
  // into stage t % kStages once the consumers have freed it (wait_free: the stage's previous
  // use released, for any producer thread that writes into stage t).
  __device__ __forceinline__ void load_resident(const CUtensorMap* first, const CUtensorMap* second,
                                                int row, int head, int b) const {
    mbar_arrive_expect_tx(resident_full(), 2 * kResidentBytes);
    load_tile<kResidentRows, kPanels>(resident(0), first, resident_full(), row, head, b);
    load_tile<kResidentRows, kPanels>(resident(1), second, resident_full(), row, head, b);
  }
  __device__ __forceinline__ void wait_free(int t) const {
    mbar_wait(empty(t % kStages), ((t / kStages) & 1) ^ 1);
  }
  // where(t): the pair's {row, head}, asked once the stage is free.
  template <class Where>
  __device__ __forceinline__ void load_streamed(int t, const CUtensorMap* first,
                                                const CUtensorMap* second, Where where,
                                                int b) const {
    const int s = t % kStages;
    wait_free(t);
    mbar_arrive_expect_tx(full(s), 2 * kStreamBytes);
    const TileAt at = where(t);
    load_tile<kStreamRows, kPanels>(streamed(s, 0), first, full(s), at.row, at.head, b);
    load_tile<kStreamRows, kPanels>(streamed(s, 1), second, full(s), at.row, at.head, b);
  }

  // The ring in the block's dynamic shared memory (aligned to the 128-byte swizzle's atom).
  static __device__ __forceinline__ PairRing in_dynamic_shared() {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    return PairRing{aligned_smem(smem_raw)};
  }

  // By one thread, before the block's first __syncthreads: `full_arrivals` per streamed
  // stage, one per consumer warpgroup on each empty barrier.
  __device__ __forceinline__ void init_barriers(int full_arrivals, int consumers) const {
    mbar_init(resident_full(), 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full(s), full_arrivals);
      mbar_init(empty(s), consumers);
    }
    mbar_init_fence();
  }
};

// Where thread `lane` of warp `warp` (of its warpgroup) finds its accumulator elements: block
// n, element e holds row 16·warp + lane/4 + 8·(e/2), column 8n + 2·(lane%4) + e%2 (wgmma.cuh).
struct AccumulatorLane {
  int row, col;  // of element 0 of block 0
  __device__ __forceinline__ AccumulatorLane(int warp, int lane)
      : row(16 * warp + lane / 4), col(2 * (lane % 4)) {}
  __device__ __forceinline__ int row_of(int e) const { return row + 8 * (e / 2); }
  __device__ __forceinline__ int col_of(int n, int e) const { return col + 8 * n + e % 2; }
};

// One gradient's rows, scaled, into its tensor: acc's rows from row0 (those below `rows`),
// columns below head_dim.
template <class T, int kD>
__device__ __forceinline__ void store_rows(const float (&acc)[kD / 8][4], const AccumulatorLane& at,
                                           T* head, std::int64_t seq_stride, int row0, int rows,
                                           int head_dim, float scale, bool pairs) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = at.row_of(2 * half);
    if (row0 + r >= rows) continue;
    T* dst = head + (row0 + r) * seq_stride;
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      const int c = at.col_of(n, 0);
      if (c < head_dim)
        store2<T>(dst + c, acc[n][2 * half] * scale, acc[n][2 * half + 1] * scale, pairs,
                  c + 1 < head_dim);
    }
  }
}

template <int kBlocks>
__device__ __forceinline__ void zero(float (&acc)[kBlocks][4]) {
#pragma unroll
  for (int n = 0; n < kBlocks; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
}

// A pair's probability under softcap and ALiBi (score_mods.cuh's order: scale, softcap, log2
// units, ALiBi's distance from the bottom-right diagonal) from its raw product s, with the
// head's values (score_mods.cuh's HeadMods), and the factor dP takes on its way to dS
// (softcap: 1 − tanh², else 1).
struct ModdedScore {
  float prob, dfactor;
};
__device__ __forceinline__ ModdedScore modded_score(const Params& p, const HeadMods& head, float s,
                                                    float lse_log2, int query, int key) {
  float x, dfactor = 1.0f;
  if (p.softcap != 0.0f) {
    const float capped = softcapped(s * static_cast<float>(p.scale), p.softcap, head.inv_softcap);
    const float t = capped * head.inv_softcap;
    dfactor = 1.0f - t * t;
    x = capped * kLog2e;
  } else {
    x = s * p.scale_log2;
  }
  if (p.alibi) x -= head.slope2 * static_cast<float>(abs(query + p.kv_len - p.q_len - key));
  return {exp2f(x - lse_log2), dfactor};
}

constexpr int kBackwardConsumers = 2;  // warpgroups of 64 rows (keys or queries)
constexpr int kBackwardThreads = 128 * (1 + kBackwardConsumers);
// Registers per thread after setmaxnreg. The producer's warp 1 stages the row scalars: with
// fused_tma's 24 / 240, ptxas (nvcc 13.0) spilled 12-16 bytes in the key blocks; 40 / 232 none.
constexpr int kBackwardProducerRegs = 40;
constexpr int kBackwardConsumerRegs = 232;
static_assert(128 * kBackwardProducerRegs + 128 * kBackwardConsumers * kBackwardConsumerRegs <= 65536,
              "the warpgroups' registers fit the SM");

// ---- the key blocks: dK and dV ------------------------------------------------------------

template <int kD>
struct KeyBlockShape {
  static constexpr HopperBackwardTiles kTiles = hopper_backward_tiles(kD);
  static constexpr int kKeys = kTiles.key_rows;   // per block
  static constexpr int kRows = kTiles.query_tile;  // query rows per streamed tile
  static_assert(kKeys == 64 * kBackwardConsumers, "64 keys per consumer warpgroup");
  static_assert(kRows == 64 || kRows == 128, "m64n64 or m64n128 for Sᵀ");
  using Ring = PairRing<kD, kKeys, kRows, kTiles.stages, 2 * kRows>;  // scalars: lse_log2, delta
};

// The query tiles a key block of keys [k0, k0 + keys) visits, for each of the group's heads:
// `tiles` of `rows` rows from `first_tile` on.
struct QueryTiles {
  int first_tile, tiles;
};
__device__ __forceinline__ QueryTiles query_tiles_of(const Visibility& vis, int k0, int keys, int rows) {
  const int begin = vis.q_begin(k0), end = vis.q_end(min(k0 + keys, vis.p.kv_len));
  QueryTiles t;
  t.first_tile = begin / rows;
  t.tiles = end > begin ? (end + rows - 1) / rows - t.first_tile : 0;
  return t;
}

// kScoreMods: the instantiation that takes softcap and ALiBi (P and dS from the raw products
// through modded_score; P recomputed for dS, so the plain one keeps its registers).
template <class T, int kD, bool kScoreMods>
__global__ void __launch_bounds__(kBackwardThreads, 1)
    backward_key_blocks_kernel(const BackwardParams bp, const __grid_constant__ BackwardMaps maps) {
  using S = KeyBlockShape<kD>;
  constexpr int kStages = S::kTiles.stages;
  const auto ring = S::Ring::in_dynamic_shared();
  const Params& p = bp.p;
  const auto [tid, warp, lane, warpgroup] = thread_place();
  // (batch, kv head) fastest, then the key block: every head's first blocks (the ones a causal
  // band gives the most query tiles) start first.
  const int bh_count = p.batch * p.kv_heads;
  const int bh = static_cast<int>(blockIdx.x % static_cast<unsigned>(bh_count));
  const int k0 = static_cast<int>(blockIdx.x / static_cast<unsigned>(bh_count)) * S::kKeys;
  const int kv_head = bh % p.kv_heads, b = bh / p.kv_heads;
  const Visibility vis = visibility(p);
  const QueryTiles qt = query_tiles_of(vis, k0, S::kKeys, S::kRows);
  const int steps = p.group * qt.tiles;  // (query head, query tile) pairs, head-major
  auto step_head = [&](int t) { return kv_head * p.group + t / qt.tiles; };
  auto step_q0 = [&](int t) { return (qt.first_tile + t % qt.tiles) * S::kRows; };

  if (tid == 0) ring.init_barriers(1 + 32, kBackwardConsumers);  // the copies' arrive.expect_tx + warp 1's lanes
  __syncthreads();

  if (warpgroup == 0) {
    // ---- producer: thread 0 issues the copies, warp 1 stages each tile's row scalars ----
    setmaxnreg_dec<kBackwardProducerRegs>();
    if (steps == 0) return;
    if (tid == 0) {
      ring.load_resident(&maps.k, &maps.v, k0, kv_head, b);
#pragma unroll 1
      for (int t = 0; t < steps; ++t)
        ring.load_streamed(t, &maps.q, &maps.dout, [&](int u) { return TileAt{step_q0(u), step_head(u)}; }, b);
    } else if (warp == 1) {
#pragma unroll 1
      for (int t = 0; t < steps; ++t) {
        const int s = t % kStages;
        ring.wait_free(t);
        const long long row0 = (static_cast<long long>(b) * p.q_heads + step_head(t)) * bp.rows_pad + step_q0(t);
        float* scalars = ring.scalars(s);
        for (int r = lane; r < S::kRows; r += 32) {
          scalars[r] = bp.lse_log2[row0 + r];
          scalars[S::kRows + r] = bp.delta[row0 + r];
        }
        mbar_arrive(ring.full(s));  // each lane's stores, released by its own arrival
      }
    }
    return;
  }

  // ---- consumers: 64 keys each ----
  setmaxnreg_inc<kBackwardConsumerRegs>();
  const int consumer = warpgroup - 1;
  const bool signals = tid % 128 == 0;
  const AccumulatorLane at(warp % 4, lane);
  const int key_base = k0 + 64 * consumer;  // the warpgroup's first key
  float dk[kD / 8][4], dv[kD / 8][4];
  zero(dk);
  zero(dv);
  if (steps > 0) {
    // The warpgroup's 64 keys of K and V: row 64·consumer of each panel (K-major A).
    const std::uint64_t k_desc = sw128_k_major_desc<S::kKeys>(ring.resident(0) + consumer * 64 * kSwizzleRowBytes);
    const std::uint64_t v_desc = sw128_k_major_desc<S::kKeys>(ring.resident(1) + consumer * 64 * kSwizzleRowBytes);
    mbar_wait(ring.resident_full(), 0);
    float st[S::kRows / 8][4], dpt[S::kRows / 8][4];
    std::uint32_t pt16[S::kRows / 16][4], dst16[S::kRows / 16][4];
#pragma unroll 1
    for (int t = 0; t < steps; ++t) {
      const int s = t % kStages;
      const int q0 = step_q0(t);
      mbar_wait(ring.full(s), (t / kStages) & 1);
      unsigned char* const q_tile = ring.streamed(s, 0);
      unsigned char* const do_tile = ring.streamed(s, 1);
      issue_qk<Sw128Slices, T, kD, S::kRows, S::kKeys>(st, k_desc, sw128_k_major_desc<S::kRows>(q_tile));
      issue_qk<Sw128Slices, T, kD, S::kRows, S::kKeys>(dpt, v_desc, sw128_k_major_desc<S::kRows>(do_tile));
      const float* lse_log2 = ring.scalars(s);
      const float* delta = lse_log2 + S::kRows;
      const bool masks = vis.tile_has_hidden_pair(q0, S::kRows, k0, S::kKeys);
      auto hidden = [&](int n, int e) {
        return masks && vis.pair_hidden(q0 + at.col_of(n, e), key_base + at.row_of(e));
      };
      if constexpr (kScoreMods) {
        // One pass once both products landed: P and dS from the raw products, in place.
        const HeadMods mods = HeadMods::of(p, b, step_head(t));
        wgmma_wait_group<0>();
        wgmma_fence_operands(st);
        wgmma_fence_operands(dpt);
#pragma unroll
        for (int n = 0; n < S::kRows / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = at.col_of(n, e);
            const ModdedScore m = modded_score(p, mods, st[n][e], lse_log2[col], q0 + col, key_base + at.row_of(e));
            const bool hide = hidden(n, e);
            st[n][e] = hide ? 0.0f : m.prob;
            dpt[n][e] = hide ? 0.0f : m.prob * (dpt[n][e] - delta[col]) * m.dfactor;
          }
      } else {
        wgmma_wait_group<1>();
        wgmma_fence_operands(st);
#pragma unroll
        for (int n = 0; n < S::kRows / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float prob = exp2f(fmaf(st[n][e], p.scale_log2, -lse_log2[at.col_of(n, e)]));
            st[n][e] = hidden(n, e) ? 0.0f : prob;
          }
        wgmma_wait_group<0>();
        wgmma_fence_operands(dpt);
#pragma unroll
        for (int n = 0; n < S::kRows / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            // Selected, not multiplied: a non-finite dPᵀ of a hidden pair stays out of dK.
            const float ds = st[n][e] * (dpt[n][e] - delta[at.col_of(n, e)]);
            dpt[n][e] = hidden(n, e) ? 0.0f : ds;
          }
      }
      pack_probs<T>(st, pt16);
      pack_probs<T>(dpt, dst16);
      issue_pv<Sw128Slices, T, kD, S::kRows / 16>(pt16, dv, sw128_mn_major_desc<S::kRows>(do_tile));
      issue_pv<Sw128Slices, T, kD, S::kRows / 16>(dst16, dk, sw128_mn_major_desc<S::kRows>(q_tile));
      wgmma_wait_group<0>();
      pv_done<kD, S::kRows / 16>(pt16, dv);
      pv_done<kD, S::kRows / 16>(dst16, dk);
      if (signals) mbar_arrive(ring.empty(s));
    }
  }
  // Keys no query sees (steps == 0) get 0.
  store_rows<T, kD>(dk, at, head_ptr<T>(bp.dk, bp.dk_stride, b, kv_head), bp.dk_stride.seq, key_base,
                    p.kv_len, p.head_dim, static_cast<float>(p.scale), bp.dk_pairs);
  store_rows<T, kD>(dv, at, head_ptr<T>(bp.dv, bp.dv_stride, b, kv_head), bp.dv_stride.seq, key_base,
                    p.kv_len, p.head_dim, 1.0f, bp.dv_pairs);
}

// ---- the query blocks: dQ -----------------------------------------------------------------

template <int kD>
struct QueryBlockShape {
  static constexpr HopperBackwardTiles kTiles = hopper_backward_tiles(kD);
  static constexpr int kRows = kTiles.dq_rows;   // per block
  static constexpr int kKeys = kTiles.key_tile;  // per streamed tile
  static_assert(kRows == 64 * kBackwardConsumers, "64 query rows per consumer warpgroup");
  static_assert(kKeys == 64 || kKeys == 128, "m64n64 or m64n128 for S");
  using Ring = PairRing<kD, kRows, kKeys, kTiles.stages, 0>;
};

template <class T, int kD, bool kScoreMods>
__global__ void __launch_bounds__(kBackwardThreads, 1)
    backward_query_blocks_kernel(const BackwardParams bp, const __grid_constant__ BackwardMaps maps) {
  using S = QueryBlockShape<kD>;
  constexpr int kStages = S::kTiles.stages;
  const auto ring = S::Ring::in_dynamic_shared();
  const Params& p = bp.p;
  const auto [tid, warp, lane, warpgroup] = thread_place();
  // With an upper band edge the last tiles see the most keys: they start first.
  const int tiles_q = (p.q_len + S::kRows - 1) / S::kRows;
  const int bh_count = p.batch * p.q_heads;  // (batch, head) fastest, as the key blocks
  const int bh = static_cast<int>(blockIdx.x % static_cast<unsigned>(bh_count));
  const int x_tile = static_cast<int>(blockIdx.x / static_cast<unsigned>(bh_count));
  const int tile = p.has_band_hi ? tiles_q - 1 - x_tile : x_tile;
  const int q0 = tile * S::kRows;
  const int h = bh % p.q_heads, b = bh / p.q_heads;
  const int kv_head = h / p.group;
  const Visibility vis = visibility(p);
  const int first = vis.kv_begin(q0) / S::kKeys;
  const int steps = max(0, (vis.kv_end(min(q0 + S::kRows, p.q_len)) + S::kKeys - 1) / S::kKeys - first);

  if (tid == 0) ring.init_barriers(1, kBackwardConsumers);
  __syncthreads();

  if (warpgroup == 0) {
    setmaxnreg_dec<kBackwardProducerRegs>();
    if (tid == 0 && steps > 0) {
      ring.load_resident(&maps.q, &maps.dout, q0, h, b);
#pragma unroll 1
      for (int t = 0; t < steps; ++t)
        ring.load_streamed(t, &maps.k, &maps.v, [&](int u) { return TileAt{(first + u) * S::kKeys, kv_head}; }, b);
    }
    return;
  }

  setmaxnreg_inc<kBackwardConsumerRegs>();
  const int consumer = warpgroup - 1;
  const bool signals = tid % 128 == 0;
  const AccumulatorLane at(warp % 4, lane);
  const int row_base = q0 + 64 * consumer;  // the warpgroup's first query row
  float dq[kD / 8][4];
  zero(dq);
  if (steps > 0) {
    const std::uint64_t q_desc = sw128_k_major_desc<S::kRows>(ring.resident(0) + consumer * 64 * kSwizzleRowBytes);
    const std::uint64_t do_desc = sw128_k_major_desc<S::kRows>(ring.resident(1) + consumer * 64 * kSwizzleRowBytes);
    // The thread's two rows' scalars (rows_pad covers every row of the tile).
    const long long row0 = (static_cast<long long>(b) * p.q_heads + h) * bp.rows_pad + row_base;
    const float lse_log2[2] = {bp.lse_log2[row0 + at.row_of(0)], bp.lse_log2[row0 + at.row_of(2)]};
    const float delta[2] = {bp.delta[row0 + at.row_of(0)], bp.delta[row0 + at.row_of(2)]};
    [[maybe_unused]] const HeadMods mods = kScoreMods ? HeadMods::of(p, b, h) : HeadMods{};
    mbar_wait(ring.resident_full(), 0);
    float s_acc[S::kKeys / 8][4], dp[S::kKeys / 8][4];
    std::uint32_t ds16[S::kKeys / 16][4];
#pragma unroll 1
    for (int t = 0; t < steps; ++t) {
      const int s = t % kStages;
      const int key0 = (first + t) * S::kKeys;
      mbar_wait(ring.full(s), (t / kStages) & 1);
      unsigned char* const k_tile = ring.streamed(s, 0);
      unsigned char* const v_tile = ring.streamed(s, 1);
      issue_qk<Sw128Slices, T, kD, S::kKeys, S::kRows>(s_acc, q_desc, sw128_k_major_desc<S::kKeys>(k_tile));
      issue_qk<Sw128Slices, T, kD, S::kKeys, S::kRows>(dp, do_desc, sw128_k_major_desc<S::kKeys>(v_tile));
      const bool masks = vis.tile_has_hidden_pair(q0, S::kRows, key0, S::kKeys);
      auto hidden = [&](int n, int e) {
        return masks && vis.pair_hidden(row_base + at.row_of(e), key0 + at.col_of(n, e));
      };
      wgmma_wait_group<1>();
      wgmma_fence_operands(s_acc);
      if constexpr (!kScoreMods) {
#pragma unroll
        for (int n = 0; n < S::kKeys / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float prob = exp2f(fmaf(s_acc[n][e], p.scale_log2, -lse_log2[e / 2]));
            s_acc[n][e] = hidden(n, e) ? 0.0f : prob;
          }
      }
      wgmma_wait_group<0>();
      wgmma_fence_operands(dp);
#pragma unroll
      for (int n = 0; n < S::kKeys / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float ds;
          if constexpr (kScoreMods) {
            const ModdedScore m = modded_score(p, mods, s_acc[n][e], lse_log2[e / 2], row_base + at.row_of(e),
                                          key0 + at.col_of(n, e));
            ds = m.prob * (dp[n][e] - delta[e / 2]) * m.dfactor;
          } else {
            ds = s_acc[n][e] * (dp[n][e] - delta[e / 2]);
          }
          dp[n][e] = hidden(n, e) ? 0.0f : ds;
        }
      pack_probs<T>(dp, ds16);
      issue_pv<Sw128Slices, T, kD, S::kKeys / 16>(ds16, dq, sw128_mn_major_desc<S::kKeys>(k_tile));
      wgmma_wait_group<0>();
      pv_done<kD, S::kKeys / 16>(ds16, dq);
      if (signals) mbar_arrive(ring.empty(s));
    }
  }
  store_rows<T, kD>(dq, at, head_ptr<T>(bp.dq, bp.dq_stride, b, h), bp.dq_stride.seq, row_base, p.q_len,
                    p.head_dim, static_cast<float>(p.scale), bp.dq_pairs);
}

}  // namespace fattn::cuda
