// fattn — small device helpers shared by the CUDA kernels: element types, warp
// reductions, the problem's block coordinates.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/async_copy.cuh"
#include "cuda/launchers.hpp"
#include "cuda/visibility.cuh"

namespace fattn::cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// ---- element types --------------------------------------------------------------
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Two floats rounded to T and packed into one 32-bit register, lo in the low half
// (the operand layout of mma.sync).
template <class T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ std::uint32_t pack2<__half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&h);
}
template <>
__device__ __forceinline__ std::uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&h);
}

// Stores (x0, x1) at dst[0], dst[1]; as one vector store when `pair` says the
// address and the tensor's strides allow it, else element by element. `second`
// says whether dst[1] is inside the tensor (the last column of an odd head dim).
template <class T>
__device__ __forceinline__ void store2(T* dst, float x0, float x1, bool pair, bool second) {
  if (pair && second) {
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float2*>(dst) = make_float2(x0, x1);
    } else {
      const std::uint32_t packed = pack2<T>(x0, x1);
      *reinterpret_cast<std::uint32_t*>(dst) = packed;
    }
    return;
  }
  dst[0] = from_float<T>(x0);
  if (second) dst[1] = from_float<T>(x1);
}

// ---- non-finite values in a shared tile -------------------------------------------------
// Whether a 16-byte chunk holds a NaN or an infinity (exponent bits all ones).
template <class T>
__device__ __forceinline__ bool chunk_nonfinite(uint4 c) {
  const std::uint32_t w[4] = {c.x, c.y, c.z, c.w};
  bool bad = false;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (sizeof(T) == 4) {
      bad |= (w[i] & 0x7f800000u) == 0x7f800000u;
    } else {
      constexpr std::uint32_t e = std::is_same_v<T, __half> ? 0x7c00u : 0x7f80u;
      bad |= (w[i] & e) == e || ((w[i] >> 16) & e) == e;
    }
  }
  return bad;
}

// Block-wide: whether the first `rows` rows of a kRows × kD shared tile (row pitch
// kPitch) hold a NaN or an infinity. Every thread of the block must call it.
template <class T, int kRows, int kD, int kPitch, int kThreads>
__device__ __forceinline__ bool tile_has_nonfinite(const T* tile, int rows, int tid) {
  constexpr int kChunkElems = 16 / static_cast<int>(sizeof(T));
  constexpr int kChunksPerRow = kD / kChunkElems;
  bool bad = false;
  for (int c = tid; c < rows * kChunksPerRow; c += kThreads) {
    const T* src = tile + (c / kChunksPerRow) * kPitch + (c % kChunksPerRow) * kChunkElems;
    bad |= chunk_nonfinite<T>(*reinterpret_cast<const uint4*>(src));
  }
  return __syncthreads_or(bad) != 0;
}

// ---- warp reductions over the 4 lanes of a quad (lanes 4g .. 4g+3) ----------------
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// ---- which query tile, batch and head a fused block works on ----------------------
// Blocks are numbered tile-major: block x covers (b, h) = x mod (B·Hq) and query
// tile x / (B·Hq). In causal problems the tile order is reversed, so the tiles that
// see the most keys start first and the short ones fill the tail of the grid.
struct BlockCoord {
  int b, h, kv_head, q0;
};

// Work unit `index` of that numbering (a persistent kernel's blocks walk several).
__device__ __forceinline__ BlockCoord block_coord_at(const Params& p, int rows_per_tile,
                                                     unsigned index) {
  const int bh_count = p.batch * p.q_heads;
  const int bh = static_cast<int>(index % static_cast<unsigned>(bh_count));
  int tile = static_cast<int>(index / static_cast<unsigned>(bh_count));
  if (p.has_band_hi) {
    const int tiles = (p.q_len + rows_per_tile - 1) / rows_per_tile;
    tile = tiles - 1 - tile;
  }
  BlockCoord c;
  c.b = bh / p.q_heads;
  c.h = bh % p.q_heads;
  c.kv_head = c.h / p.group;
  c.q0 = tile * rows_per_tile;
  return c;
}
__device__ __forceinline__ BlockCoord block_coord(const Params& p, int rows_per_tile) {
  return block_coord_at(p, rows_per_tile, blockIdx.x);
}

template <class T>
__device__ __forceinline__ const T* head_ptr(const void* base, const Strides3& s, int b, int h) {
  return static_cast<const T*>(base) + b * s.batch + h * s.head;
}
template <class T>
__device__ __forceinline__ T* head_ptr(void* base, const Strides3& s, int b, int h) {
  return static_cast<T*>(base) + b * s.batch + h * s.head;
}

// What a fused block reads: its (batch, head, query tile), the tile's first query row,
// the kv head's keys and values, how many rows of the tile lie inside the sequence, and
// which key tiles of keys_per_tile keys it reads: [first_tile, tiles), none past the band's
// upper edge for its last row (the causal limit) or below its lower edge for its first row
// (a left window; first_tile is 0 without one, and only the kernels that take a lower edge
// read it).
template <class T>
struct FusedBlock {
  BlockCoord c;
  const T* q;
  const T* k;
  const T* v;
  int q_rows;
  int first_tile;
  int tiles;
};

template <class T>
__device__ __forceinline__ FusedBlock<T> fused_block_at(const Params& p, int rows_per_tile,
                                                        int keys_per_tile, unsigned index) {
  FusedBlock<T> f;
  f.c = block_coord_at(p, rows_per_tile, index);
  f.q = head_ptr<T>(p.q, p.q_stride, f.c.b, f.c.h) + f.c.q0 * p.q_stride.seq;
  f.k = head_ptr<T>(p.k, p.k_stride, f.c.b, f.c.kv_head);
  f.v = head_ptr<T>(p.v, p.v_stride, f.c.b, f.c.kv_head);
  f.q_rows = min(rows_per_tile, p.q_len - f.c.q0);
  f.first_tile = visibility(p).kv_begin(f.c.q0) / keys_per_tile;
  f.tiles = (visibility(p).kv_end(f.c.q0 + f.q_rows) + keys_per_tile - 1) / keys_per_tile;
  return f;
}
template <class T>
__device__ __forceinline__ FusedBlock<T> fused_block(const Params& p, int rows_per_tile,
                                                     int keys_per_tile) {
  return fused_block_at<T>(p, rows_per_tile, keys_per_tile, blockIdx.x);
}

// The logsumexp row of (batch b, head h), or null when the caller asked for none.
__device__ __forceinline__ float* lse_head(const Params& p, int b, int h) {
  return p.lse ? p.lse + b * p.lse_stride.batch + h * p.lse_stride.head : nullptr;
}

// Key tile j of one head's K or V (kKeys keys from key j·kKeys, rows `stride` elements
// apart from `head`) into a shared tile by cp.async; keys past kv_len are zero-filled.
template <class T, int kKeys, int kD, int kPitch, int kThreads>
__device__ __forceinline__ void load_key_tile_async(T* dst, const T* head, std::int64_t stride,
                                                    int j, const Params& p, int tid) {
  const int k0 = j * kKeys;
  load_tile_async<T, kKeys, kD, kPitch, kThreads>(dst, head + k0 * stride, stride,
                                                  min(kKeys, p.kv_len - k0), p.head_dim, tid);
}

// load_key_tile_async with a kernel's tile shape (its kBc, kPitch and kThreads) and head dim
// bound: load(dst, head, stride, j) loads key tile j of K or V into dst.
template <class T, class Shape, int kD>
struct KeyTileLoader {
  const Params& p;
  int tid;
  __device__ __forceinline__ void operator()(T* dst, const T* head, std::int64_t stride,
                                             int j) const {
    load_key_tile_async<T, Shape::kBc, kD, Shape::kPitch, Shape::kThreads>(dst, head, stride, j,
                                                                           p, tid);
  }
};

// The first three cp.async groups of the float32 kernels' one-stage K/V pipeline
// (fused_tf32.cuh, fused_fma.cuh): the Q tile, K_0, V_0. None for a block that sees no key.
template <int kBr, int kBc, int kD, int kPitch, int kThreads>
__device__ __forceinline__ void load_first_tiles(float* sq, float* sk, float* sv,
                                                 const FusedBlock<float>& block, const Params& p,
                                                 int tid) {
  if (block.tiles > 0) {
    load_tile_async<float, kBr, kD, kPitch, kThreads>(sq, block.q, p.q_stride.seq, block.q_rows,
                                                      p.head_dim, tid);
    cp_async_commit();
    load_key_tile_async<float, kBc, kD, kPitch, kThreads>(sk, block.k, p.k_stride.seq, 0, p, tid);
    cp_async_commit();
    load_key_tile_async<float, kBc, kD, kPitch, kThreads>(sv, block.v, p.v_stride.seq, 0, p, tid);
    cp_async_commit();
  }
}

// Natural-log logsumexp from a running max m (log2 units) and sum l; -inf when the
// row saw no key (l = 0), NaN stays NaN.
__device__ __forceinline__ float logsumexp(float m, float l) {
  return l == 0.0f ? neg_inf() : (m + log2f(l)) * kLn2;
}

// 1/l, and 0 for a row that saw no key (l = 0); NaN stays NaN.
__device__ __forceinline__ float reciprocal_or_zero(float l) { return l == 0.0f ? 0.0f : 1.0f / l; }

// Launches a fused kernel: one block per (query tile of Shape::kBr rows, batch, head),
// Shape::kThreads threads, Shape::kSmemBytes of dynamic shared memory (raised above the
// 48 KB default first). `name` is the kernel's name in error messages.
template <class Shape, class Kernel>
void launch_per_query_tile(Kernel kernel, const char* name, const Params& p, cudaStream_t stream) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  Shape::kSmemBytes),
             name);
  const long long tiles = (p.q_len + Shape::kBr - 1) / Shape::kBr;
  const auto blocks = static_cast<unsigned>(tiles * p.batch * p.q_heads);
  kernel<<<blocks, Shape::kThreads, Shape::kSmemBytes, stream>>>(p);
  check_launch(name);
}

}  // namespace fattn::cuda
