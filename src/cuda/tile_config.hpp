// fattn — tile sizes of the fused CUDA kernels, per head dim, with their reasons.
//
// First choices from the register and shared-memory budgets below; the measurements
// on the H100 so far are named where they exist (docs/perf-log.md, results/report/gpu/).
//
// Budgets per SM (sm_80 / sm_90): 64K 32-bit registers, at most 255 per thread;
// 164 KB / 227 KB of shared memory for one block (opt-in above 48 KB).
#pragma once

namespace fattn::cuda {

// The warp-slice kernels (mma.sync 16-bit and 3xTF32/TF32) share one layout: each warp
// owns `slices` slices of 16 query rows (1 or 2, so a tile has 16·slices·warps rows) and
// keeps the row softmax inside the warp. Their tiles per head dim, with the reasons below:
struct SliceTiles {
  int warps;       // warps per block
  int bc;          // keys per tile with one slice per warp
  int max_slices;  // 2: the 128-row (tall) tile exists for this head dim
  int bc_tall;     // keys per tile with two slices per warp
  constexpr int keys_per_tile(int slices) const { return slices == 1 ? bc : bc_tall; }
  constexpr int tile_rows(int slices) const { return 16 * slices * warps; }
};

// The compile-time shape of a warp-slice kernel with kM slices per warp (the kernels add
// their shared-memory layout: MmaShape, Tf32Shape).
template <int kD, int kM, int kWarpCount, int kKeysPerTile>
struct SliceShape {
  static constexpr int kWarps = kWarpCount;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBr = 16 * kM * kWarps;  // query rows per block: the tile's rows
  static constexpr int kBc = kKeysPerTile;      // keys per tile
  static constexpr int kNS = kBc / 8;           // 16×8 score blocks per slice
  static constexpr int kDB = kD / 8;            // 16×8 output blocks per slice
  static_assert(kM == 1 || kM == 2, "one or two 16-row slices per warp");
};

// FlashAttention-2 on mma.sync m16n8k16 (float16 / bfloat16).
// Each warp owns kM slices of 16 query rows (m16), so the row softmax stays inside
// the warp; Br = 16·kM·warps. Per thread: o = kM·16·D/32 floats, s = kM·16·Bc/32
// floats; Q is re-read from shared memory by ldmatrix for every key tile
// (FlashAttention-2's default for sm_80), which keeps registers for o.
//   kM = 1 (Br = 64): every K/V fragment loaded by ldmatrix feeds 2 MMAs, so shared
//             memory delivers one 16×8 B fragment (256 B) per 4096-FLOP MMA. First
//             H100 run (2026-11-23, results/report/gpu/history/run1-bench.json, D = 128
//             fp16, S >= 4096): 218-250 TFLOP/s.
//   kM = 2 (Br = 128, as FlashAttention-2 for D <= 128): each fragment feeds 4 MMAs,
//             halving shared-memory reads per FLOP. Half as many blocks: plan.cpp
//             picks it only when the grid still fills the GPU (tall_tiles_pay there).
//             Measured (results/report/gpu/bench.json): D = 128 fp16 S >= 4096
//             250-262 TFLOP/s, D = 64 218-234, 1.03-1.33x of kM = 1 on full grids.
//   D <= 64:  4 warps, Bc = 64, kM up to 2.
//   D <= 128: 4 warps, Bc = 64 for kM = 1; Bc = 32 for kM = 2: with Bc = 64 ptxas
//             spilled 204 B at D = 128 (o + s = 192 registers), with 32 none (s = 32).
//             Shared memory (Br + 2 stages · 2 · Bc) · (D + 8) · 2 B = 87 KB (kM = 1) /
//             70 KB (kM = 2) at D = 128; registers allow 2 blocks/SM either way.
//   D = 256:  4 warps, Bc = 32, kM = 1. o = 128 registers, so the score tile is
//             halved to keep s at 16; 101 KB of shared memory.
// Shared rows are padded by 8 elements (16 bytes): the 8 row addresses of one
// ldmatrix 8×8 matrix then start in 8 different 16-byte bank groups (no conflicts).
constexpr SliceTiles mma_tiles(int d) {
  return d <= 64    ? SliceTiles{4, 64, 2, 64}
         : d <= 128 ? SliceTiles{4, 64, 2, 32}
                    : SliceTiles{4, 32, 1, 32};
}

// FlashAttention on Hopper's wgmma (sm_90a, float16 / bfloat16; fused_wgmma.cuh).
// One warpgroup (4 warps) owns 64 query rows, the M of wgmma m64nNk16; the row softmax
// stays inside each warp (its 16 rows of the accumulator). Per thread: s = Bc/2 and
// o = D/2 float registers, P = Bc/4 32-bit registers while P·V is in flight.
//   2 warpgroups (Br = 128) and Bc = 128 for D = 64 and 128: the 128-row tile of
//   FlashAttention-3's D = 128 forward (two consumer warpgroups of 64 rows), here without
//   its producer warp: every thread issues cp.async. Shared memory
//   (Br + 2 stages · 2 · Bc) · D · 2 B = 160 KB at D = 128 (1 block/SM), 80 KB at D = 64.
//   Registers at D = 128: s 64 + o 64 + P 32; ptxas (sm_90a) allocates 184 per thread
//   for the serial schedule and 226 for the pipelined one, which holds all three at once
//   (D = 64: 154 / 186), no spills. First choice, not yet measured on a GPU
//   (docs/cuda.md, "The wgmma kernels"); the benchmark runs it beside fused_mma.
// Compiled for head dims 64 and 128 only (the m64n64 / m64n128 instructions of wgmma.cuh);
// other dims run fused_mma.
struct WgmmaTiles {
  int warpgroups, bc;
};
constexpr bool wgmma_head_dim(int d) { return d == 64 || d == 128; }
constexpr WgmmaTiles wgmma_tiles(int) { return WgmmaTiles{2, 128}; }

// The TMA kernel (fused_tma.cuh, sm_90a, float16 / bfloat16): FlashAttention-3's warp
// specialization. A producer warpgroup (one thread issues every copy; setmaxnreg gives its
// registers away) loads Q once and K/V tiles into a ring of `stages` 128-byte-swizzled stages
// with the bulk tensor copy engine; `consumers` warpgroups of 64 query rows each run the
// fused_wgmma_pipelined schedule on them (SS wgmma for Q·Kᵀ, RS for P·V).
//   2 consumers (Br = 128), Bc = 128 for D = 64 and 128, as FlashAttention-3's D = 128
//   forward: 384 threads; registers 24 (producer) / 240 (consumers) after setmaxnreg:
//   24·128 + 240·256 = 64512 of the SM's 65536. Shared memory per stage of K or V:
//   Bc·D·2 B = 32 KB at D = 128 (16 KB at D = 64).
//   stages: 2 at D = 128 (FlashAttention-3's choice; Q 32 KB + 4·32 KB = 160 KB; 3 stages
//   would fit in 224 KB and are the first thing to try on the GPU), 3 at D = 64 (112 KB).
//   Measured on an H200 at D = 64 and 128 (2026-11-28, results/h200/gpu/2026-11-28:
//   tma_bench.json; docs/cuda.md, "The TMA kernel").
//   D = 256: Bc = 64, 2 stages: o is D/2 = 128 registers per thread, s Bc/2 = 32 and P Bc/4
//   = 16 beside it (Bc = 128 would need 224 for the three before any address: spills under
//   the 240 of setmaxnreg); shared memory Q 64 KB + 4·32 KB = 192 KB. FlashAttention-3
//   takes 128 × 80 tiles there; P·V runs as two m64n128k16 MMAs per key slice (the columns'
//   halves, issue_pv). First choice, compiled, not yet run on a GPU: ptxas (nvcc 13.0) spills
//   nothing in the plain instantiation, 36 bytes in the variants' one (D = 64 and 128:
//   none in either).
struct TmaTiles {
  int consumers, bc, stages;
};
constexpr bool tma_head_dim(int d) { return d == 64 || d == 128 || d == 256; }
// The other ring depth the benchmark measures beside tma_tiles' (fattn_gpu_bench's
// fused_tma_more_stages; forward_with's `stages`): one stage more where it fits in shared
// memory (D = 64: 4 stages, 144 KB; D = 128: 3, 224 KB; D = 256: none, 3 would need 256 KB).
// 0: none. The plain instantiation only.
constexpr int tma_alternative_stages(int d) { return d <= 64 ? 4 : d <= 128 ? 3 : 0; }
constexpr TmaTiles tma_tiles(int d) {
  return d <= 64 ? TmaTiles{2, 128, 3} : d <= 128 ? TmaTiles{2, 128, 2} : TmaTiles{2, 64, 2};
}

// The Hopper backward (backward_tma.cuh, sm_90a, float16 / bfloat16): two kernels, each a
// producer warpgroup (TMA copies; setmaxnreg 40) and 2 consumer warpgroups (232), no atomics:
//   key blocks (dK, dV): 128 keys per block (64 per consumer: the M of wgmma), K and V
//     resident; query tiles of 64 rows stream through a 2-stage ring of (Q, dO). Registers
//     per consumer thread at D = 128: dK and dV 64 each, Sᵀ and dPᵀ (64 keys × 64 queries)
//     32 each, their 16-bit A fragments 16 each; shared memory 2·32 KB + 2·2·16 KB = 128 KB.
//     FlashAttention-3's D = 128 backward tiles (64 × 128, 2 consumer warpgroups).
//   query blocks (dQ): 128 query rows per block (64 per consumer), Q and dO resident; key
//     tiles of 64 stream through a 2-stage ring of (K, V); dQ 64 + S, dP 32 each + dS 16.
// First choice, compiled, not yet run on a GPU (ptxas: docs/cuda.md, "The Hopper
// backward"). Head dims 64 and 128; smaller ones run on 64, up to 128 on 128 (zero-filled
// columns), larger ones on Triton.
struct HopperBackwardTiles {
  int key_rows;    // key blocks: keys per block
  int query_tile;  // key blocks: query rows per streamed tile (the N of Sᵀ = K·Qᵀ)
  int dq_rows;     // query blocks: query rows per block
  int key_tile;    // query blocks: keys per streamed tile (the N of S = Q·Kᵀ)
  int stages;      // ring stages of either
};
constexpr bool hopper_backward_head_dim(int d) { return d == 64 || d == 128; }
constexpr HopperBackwardTiles hopper_backward_tiles(int) { return {128, 64, 128, 64, 2}; }

// 3xTF32 / TF32 on mma.sync m16n8k8 (float32). Same warp layout as the 16-bit kernel
// (kM = 1 or 2 slices of 16 rows per warp, 4 warps, Br = 64 or 128; the 128-row tiles
// share each K/V fragment load and split between two slices). K and V each have one shared stage, with the
// next K tile loading during softmax and P·V and the next V tile during Q·Kᵀ
// (float32 tiles are twice the bytes: two stages of both would need 168 KB at D = 128,
// over sm_80's 164 KB). Rows are padded by 4 floats: the LDS pattern of the fragments
// (row g, column t) then hits 32 different banks.
//   D <= 128: Bc = 64, (64 + 2·64)·(D + 4)·4 B = 101 KB at D = 128.
//             kM = 2: Bc = 64 up to D = 64 (70 KB), 32 above (o + s registers, as
//             for the 16-bit kernel): (128 + 2·32)·132·4 B = 101 KB at D = 128.
//   D = 256:  Bc = 32 (o is 128 registers), 133 KB; kM = 1 only.
// These are mma_tiles' tiles: the float accumulators o and s take the same registers in
// both kernels and set every choice (Bc for kM = 2 and at D = 256), and the float32
// shared tiles above fit each of them. A change to one kernel's tiles splits this again.
constexpr SliceTiles tf32_tiles(int d) { return mma_tiles(d); }

// Exact float32 with FMAs (no tensor cores). 256 threads as 16 × 16: thread (r, c)
// holds the scores of rows 4r..4r+3 and columns c, c+16, ... of the tile, so a row
// is reduced over 16 lanes of a half-warp. Br = Bc = 64 (4×4 scores per thread, 16
// FMAs per 8 shared loads of float4); P goes through shared memory for P·V.
//   D <= 128: Br = Bc = 64: (3·64)·(D + 4)·4 + 64·68·4 B = 119 KB at D = 128.
//   D = 256:  Bc = 32 (4×2 scores per thread), 142 KB (sm_80's 164 KB allows it).
struct FmaTiles {
  int br, bc;
};
constexpr FmaTiles fma_tiles(int d) { return d <= 128 ? FmaTiles{64, 64} : FmaTiles{64, 32}; }

}  // namespace fattn::cuda
