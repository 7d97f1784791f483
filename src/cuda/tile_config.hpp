// fattn — tile sizes of the fused CUDA kernels, per head dim, with their reasons.
//
// None of these has been measured yet: every value is a first choice from the
// register and shared-memory budgets below, TO BE MEASURED ON THE H100 (ncu: achieved
// occupancy, smem bank conflicts, stall reasons; gpu/gpu_bench.cu: time per config).
//
// Budgets per SM (sm_80 / sm_90): 64K 32-bit registers, at most 255 per thread;
// 164 KB / 227 KB of shared memory for one block (opt-in above 48 KB).
#pragma once

namespace fattn::cuda {

// FlashAttention-2 on mma.sync m16n8k16 (float16 / bfloat16).
// Each warp owns 16 query rows (one m16 slice), so the row softmax stays inside the
// warp; Br = 16·warps. Per thread: o = 16·D/32 floats, s = 16·Bc/32 floats; Q is
// re-read from shared memory by ldmatrix for every key tile (FlashAttention-2's
// default for sm_80), which keeps registers for o.
//   D <= 128: 4 warps, Bc = 64. o <= 64 + s 32 registers, leaving room for the
//             operand fragments without spills; shared memory
//             (Br + 2 stages · 2 · Bc) · (D + 8) · 2 B = 87 KB at D = 128: 2 blocks/SM.
//   D = 256:  4 warps, Bc = 32. o = 128 registers, so the score tile is halved to
//             keep s at 16; 101 KB of shared memory.
// Shared rows are padded by 8 elements (16 bytes): the 8 row addresses of one
// ldmatrix 8×8 matrix then start in 8 different 16-byte bank groups (no conflicts).
struct MmaTiles {
  int warps, bc;
};
constexpr MmaTiles mma_tiles(int d) { return d <= 128 ? MmaTiles{4, 64} : MmaTiles{4, 32}; }

// 3xTF32 on mma.sync m16n8k8 (float32). Same warp layout as the 16-bit kernel
// (16 rows per warp, 4 warps, Br = 64). K and V each have one shared stage, with the
// next K tile loading during softmax and P·V and the next V tile during Q·Kᵀ
// (float32 tiles are twice the bytes: two stages of both would need 168 KB at D = 128,
// over sm_80's 164 KB). Rows are padded by 4 floats: the LDS pattern of the fragments
// (row g, column t) then hits 32 different banks.
//   D <= 128: Bc = 64, (64 + 2·64)·(D + 4)·4 B = 101 KB at D = 128.
//   D = 256:  Bc = 32 (o is 128 registers), 133 KB.
struct Tf32Tiles {
  int warps, bc;
};
constexpr Tf32Tiles tf32_tiles(int d) { return d <= 128 ? Tf32Tiles{4, 64} : Tf32Tiles{4, 32}; }

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
