// fattn — tile and register-block sizes of the CPU kernels, per vector width.
//
// The fused kernel works on a query tile of Br = query_vecs·lanes rows against key
// tiles of Bc = key_tile rows. Scores are kept transposed (keys × queries), so the
// queries of a tile run along the vector lanes and every softmax step (row max,
// exp2, row sum, rescale) is a plain vertical vector operation.
//
// Register blocks: scores_block holds key_rows × query_vecs accumulators,
// pv_block holds dim_rows × query_vecs; both must fit the register file
// (32 vector registers with AVX-512, 16 with AVX2 and SSE) with room for the
// query_vecs operands and one broadcast.
//
// Measured on the 2-core Zen 4 machine, one thread, B=2 H=8 S=2048 (docs/perf-log.md,
// "CPU tile sizes"): the numbers after each choice are fused GFLOP/s at D=64 / D=128.
#pragma once

namespace fattn::cpu {

template <int VectorBytes>
struct Tiling;

template <>
struct Tiling<64> {  // AVX-512: 32 zmm registers
  // Br=64 (4 vectors) × 6 keys: 84 / 90; Br=32 × 12 keys (Bc 192): 70 / 74;
  // Br=48 × 8 keys: 82 / 79; Br=16 × 24 keys: 50 / 40.
  static constexpr int query_vecs = 4;  // Br = 64
  static constexpr int key_rows = 6;    // 24 accumulators in scores_block
  // 6 dims: 84 / 90; 4 dims: 76 / 83 (fewer FMAs per P load).
  static constexpr int dim_rows = 6;    // 24 accumulators in pv_block
  // Bc 96: 84 / 90; 48: 80 / 87; 192: Bc·Br scores (48 KiB) no longer fit L1 with V.
  static constexpr int key_tile = 96;   // Bc, a multiple of key_rows
  // Query tiles per work item sharing each K/V tile: 2 vs 1, 2 threads, B=2 H=8,
  // S=1024/2048/4096: D=64 +5 % / +0.5 % / +4 %, D=128 +15 % / +8 % / +6 %.
  static constexpr int query_tiles_per_item = 2;
  // Backward rows_block (dK, dV += P·X): key_rows × dim_vecs accumulators, X rows
  // loaded as dim_vecs vectors. 6 × 4 = 24, as the forward's blocks.
  static constexpr int dim_vecs = 4;
};

template <>
struct Tiling<32> {  // AVX2: 16 ymm registers
  // Br=24 × 4 keys: 53 / 66; Br=16 × 6 keys: 39–44 / 64–66; Br=8 × 12 keys: 42 / 26.
  static constexpr int query_vecs = 3;  // Br = 24
  static constexpr int key_rows = 4;    // 12 accumulators
  static constexpr int dim_rows = 4;    // 12 accumulators
  static constexpr int key_tile = 96;
  // Query tiles per item, forced AVX2 on dev-zen5 (Zen 5), 2 threads, B=2 H=8, time with
  // 1 against 2 (docs/perf-log.md, 2026-11-27, "AVX2 blocks of the backward and the work
  // item"): float32 S=1024 1.04-1.08×, S=2048 1.00-1.03×; bfloat16 0.99-1.02×.
  static constexpr int query_tiles_per_item = 2;
  // 4 × 3 = 12 accumulators. 4 × 2, backward, the same conditions, S=1024: 0.99-1.06× the
  // time of 4 × 3.
  static constexpr int dim_vecs = 3;
};

template <>
struct Tiling<16> {  // portable: 16 xmm registers (SSE2) or 32 (NEON); not tuned
  static constexpr int query_vecs = 2;  // Br = 8
  static constexpr int key_rows = 6;    // 12 accumulators, as AVX2's first choice
  static constexpr int dim_rows = 6;
  static constexpr int key_tile = 96;
  static constexpr int query_tiles_per_item = 2;  // as AVX-512 (not measured here)
  static constexpr int dim_vecs = 2;              // 6 × 2 = 12 accumulators (not measured)
};

// The decode kernel (cpu/decode/ops.hpp): head dims along the lanes, keys along them in the
// scores. key_vecs·lanes keys per tile (a multiple of 16, the rows of a key group);
// score_rows query rows × key_vecs accumulators in scores_block and row_block ×
// dim_vecs in pv_block, with room for the operands and one broadcast.
template <int VectorBytes>
struct DecodeTiling;

template <>
struct DecodeTiling<64> {  // AVX-512: scores 4 × 6 + 6 + 1 = 31, P·V 6 × 4 + 4 + 1 = 29 of 32
  // Sq = 16 (64 rows), Sk = 8k, D = 128, 2 threads, GFLOP/s: 96 keys × 4 score rows
  // 324-331; 64 × 6: 292-321; 128 × 3: 306. Sq = 1 (GB/s) alike within noise. (Items of
  // 48 rows or more now take the query rows along the lanes: decode_query_lanes.hpp.)
  static constexpr int key_vecs = 6;  // Bk = 96
  static constexpr int score_rows = 4;
  static constexpr int row_block = 6;  // P·V rows
  static constexpr int dim_vecs = 4;
};

template <>
struct DecodeTiling<32> {  // AVX2: scores 2 × 4 + 4 + 1 = 13, P·V 6 × 2 + 2 + 1 = 15 of 16
  static constexpr int key_vecs = 4;  // Bk = 32
  static constexpr int score_rows = 2;
  // P·V rows × dim vectors, forced AVX2 on dev-zen5, 1 thread, GQA 4:1, D = 128, median ms
  // of two rounds (docs/perf-log.md, 2026-11-27): Sq = 16, 8k keys, float32 6 × 2: 56-61,
  // 2 × 4: 76, 4 × 2: 70-72, 3 × 4: 57-73; bfloat16 48-49 / 54-57 / 52-53 / 53-57. Sq = 1
  // (4 rows, 32k keys): no difference above the noise of the shared machine.
  static constexpr int row_block = 6;
  static constexpr int dim_vecs = 2;
};

template <>
struct DecodeTiling<16> {  // portable: AVX2's first sizes, not tuned
  static constexpr int key_vecs = 4;  // Bk = 16
  static constexpr int score_rows = 2;
  static constexpr int row_block = 2;
  static constexpr int dim_vecs = 4;
};

}  // namespace fattn::cpu
