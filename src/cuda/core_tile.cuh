// fattn — shared-memory tiles in wgmma's no-swizzle core-matrix layout (sm_90a).
//
// A tile of kRows × kD 16-bit elements (rows: queries or keys; columns: the head dim)
// is cut into core matrices of 8 rows × 8 columns (16 bytes per row, 128 contiguous
// bytes each), core matrix (row block rb, column block cb) at byte (rb·kD/8 + cb)·128:
//   element (r, c) at byte ((r/8)·(kD/8) + c/8)·128 + (r%8)·16 + (c%8)·2.
// As a wgmma operand (wgmma.cuh; descriptor offsets per the PTX ISA and CUTLASS for the
// no-swizzle mode: LBO between core matrices adjacent in K, SBO adjacent in M/N):
//   K-major, Q and K in S = Q·Kᵀ (rows = M or N, columns = K):
//     LBO = 128 B, SBO = 16·kD B; the next 16-column slice starts 256 B further.
//   N-major, V in O += P·V (rows = K, the keys; columns = N, the head dim):
//     LBO = 16·kD B, SBO = 128 B; the next 16 keys start 32·kD B further.
// tests/cuda/wgmma_probe.cu runs both offset assignments on the GPU and says which one
// the hardware agrees with (docs/cuda.md).
//
// Loading: 16-byte chunk i of the tile goes to byte 16·i, which is row (i/kD)·8 + i%8,
// column chunk (i/8) % (kD/8). Consecutive threads fill consecutive shared bytes (no
// bank conflicts); a warp reads 64 contiguous bytes, two whole 32-byte sectors, from
// each of 8 rows. No padding is needed (unlike the mma.sync kernels' padded rows):
// wgmma reads each core matrix as one 128-byte row of banks.
#pragma once

#include <cstdint>

#include "cuda/async_copy.cuh"
#include "cuda/wgmma.cuh"

namespace fattn::cuda {

constexpr int kCoreMatrixBytes = 128;  // 8 rows × 16 bytes

// Element index of (r, c) in a core-matrix tile with kD columns.
template <int kD>
__host__ __device__ constexpr int core_index(int r, int c) {
  return ((r / 8) * (kD / 8) + c / 8) * 64 + (r % 8) * 8 + c % 8;
}

// The loader below puts 16-byte chunk i at element 8·i; that is core_index of the row and
// column it reads from.
template <int kD>
constexpr bool loader_matches_layout(int rows) {
  for (int i = 0; i < rows * kD / 8; ++i)
    if (core_index<kD>((i / kD) * 8 + i % 8, ((i / 8) % (kD / 8)) * 8) != 8 * i) return false;
  return true;
}
static_assert(loader_matches_layout<64>(16) && loader_matches_layout<128>(16),
              "core-matrix loader and layout agree");
// Column c + 8d of a row is 64·d elements after column c (c % 8 fixed): the next core
// matrix of the row block.
static_assert(core_index<128>(9, 2 + 8 * 5) == core_index<128>(9, 2) + 64 * 5 &&
                  core_index<64>(17, 7 + 8 * 3) == core_index<64>(17, 7) + 64 * 3,
              "row-adjacent core matrices are 64 elements apart");

// Copies rows [0, kRows) of a global tile (row r at base + r·row_stride) into a core-matrix
// tile with cp.async; rows >= rows_valid and columns >= head_dim are zero-filled without
// reading global memory (as load_tile_async). The caller commits the group.
template <class T, int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_core_tile_async(T* smem, const T* base,
                                                     std::int64_t row_stride, int rows_valid,
                                                     int head_dim, int tid) {
  static_assert(sizeof(T) == 2, "16-bit elements: 8 per 16-byte chunk");
  static_assert(kRows % 8 == 0 && kD % 8 == 0, "whole core matrices");
  constexpr int kChunks = kRows * kD / 8;
  static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
  // Not unrolled: unrolled, ptxas kept every chunk's address in registers, and the
  // pipelined wgmma kernel spilled 208 bytes at D = 128 (0 with this loop, sm_90a).
#pragma unroll 1
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int i = tid + it * kThreads;
    const int r = (i / kD) * 8 + i % 8;
    const int col = ((i / 8) % (kD / 8)) * 8;
    const bool valid = r < rows_valid && col < head_dim;
    cp_async_16(smem + 8 * i, valid ? base + r * row_stride + col : base, valid);
  }
}

// Descriptors of a tile (wgmma.cuh) and how far one 16-deep K slice moves them (the
// descriptor holds the address in 16-byte units, so moving by b bytes adds b >> 4).
template <int kD>
__device__ __forceinline__ std::uint64_t k_major_desc(const void* tile) {
  return wgmma_desc(tile, kCoreMatrixBytes, 16 * kD);
}
template <int kD>
__device__ __forceinline__ std::uint64_t n_major_desc(const void* tile) {
  return wgmma_desc(tile, 16 * kD, kCoreMatrixBytes);
}
__host__ __device__ constexpr std::uint64_t k_major_slice_step() {
  return (2 * kCoreMatrixBytes) >> 4;
}
template <int kD>
__host__ __device__ constexpr std::uint64_t n_major_slice_step() {
  return (2 * 16 * kD) >> 4;
}

// The slice steps of this layout for issue_qk / issue_pv (wgmma.cuh); a K-major step does
// not depend on the tile's rows here.
struct CoreMatrixSlices {
  template <int kRows>
  __host__ __device__ static constexpr std::uint64_t k_major(int kk) {
    return kk * k_major_slice_step();
  }
  template <int kCols>
  __host__ __device__ static constexpr std::uint64_t mn_major(int kk) {
    return kk * n_major_slice_step<kCols>();
  }
};

}  // namespace fattn::cuda
