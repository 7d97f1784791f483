// fattn — global → shared tile copies with cp.async (sm_80+): 16-byte chunks that
// bypass the registers and L1, zero-filled outside the tensor.
//
// A tile is kRows rows of kD elements, stored in shared memory at a row pitch of
// kPitch elements (kPitch > kD: the padding that keeps ldmatrix / LDS conflict-free,
// see the kernels). Row r of the tile is global row (row0 + r): its address is
// base + r·row_stride. Rows r >= rows_valid and chunks starting at or past
// head_dim are zero-filled without reading global memory, so a tile past the end
// of the sequence, or a kernel compiled for a larger head dim, reads only the
// tensor's own elements.
//
// Requirements (the dispatcher checks them or repacks the input): base and
// row_stride·sizeof(T) are multiples of 16 bytes, head_dim is a multiple of the
// chunk (8 16-bit or 4 32-bit elements) or the row is zero-padded in memory.
#pragma once

#include <cstdint>

namespace fattn::cuda {

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;  // 0: write 16 zero bytes, read nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most N of this thread's committed groups are still in flight.
// Other threads' copies become visible only after a following __syncthreads().
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <class T, int kRows, int kD, int kPitch, int kThreads>
__device__ __forceinline__ void load_tile_async(T* smem, const T* base, std::int64_t row_stride,
                                                int rows_valid, int head_dim, int tid) {
  constexpr int kChunkElems = 16 / static_cast<int>(sizeof(T));
  static_assert(kD % kChunkElems == 0, "a row is a whole number of 16-byte chunks");
  static_assert((kPitch * sizeof(T)) % 16 == 0, "rows start on 16-byte boundaries");
  constexpr int kChunksPerRow = kD / kChunkElems;
  constexpr int kChunks = kRows * kChunksPerRow;
  constexpr int kIters = (kChunks + kThreads - 1) / kThreads;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = tid + it * kThreads;
    if (kChunks % kThreads != 0 && c >= kChunks) break;
    const int r = c / kChunksPerRow;
    const int col = (c % kChunksPerRow) * kChunkElems;
    const bool valid = r < rows_valid && col < head_dim;
    const T* src = valid ? base + r * row_stride + col : base;
    cp_async_16(smem + r * kPitch + col, src, valid);
  }
}

}  // namespace fattn::cuda
