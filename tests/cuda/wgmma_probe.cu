// fattn CUDA tests — the wgmma probe kernel (see wgmma_probe.hpp). Compiled for sm_90a
// only (tests/cuda/CMakeLists.txt); the test launches it on compute capability 9.0 only.
#include "wgmma_probe.hpp"

#include "cuda/async_copy.cuh"
#include "cuda/core_tile.cuh"
#include "cuda/wgmma.cuh"

namespace fattn_cuda_test::wgmma_probe {
namespace {

using namespace fattn::cuda;

constexpr int kMaxK = 64;
constexpr int kCoreBytes = 128;  // 8 rows × 16 bytes

// Byte offset of core matrix (mn / 8, k / 8) of an operand with K columns: K-adjacent
// core matrices 128 bytes apart, M/N-adjacent ones 16·K bytes apart. Equal for both
// majors, so the same two offsets serve A, K-major B and N-major B.
__device__ __forceinline__ int core_offset(int mn_core, int k_core, int K) {
  return (mn_core * (K / 8) + k_core) * kCoreBytes;
}

// The no-swizzle descriptor of an operand with K columns staged by core_offset, with the
// LBO/SBO assignment under test: kLboK puts the K-adjacent offset in LBO, the other
// variant swaps the two.
template <int K>
__device__ __forceinline__ std::uint64_t probe_desc(const void* smem, int variant) {
  constexpr std::uint32_t k_step = kCoreBytes;                 // adjacent in K
  constexpr std::uint32_t mn_step = kCoreBytes * (K / 8);      // adjacent in M/N
  return variant == kLboK ? wgmma_desc(smem, k_step, mn_step) : wgmma_desc(smem, mn_step, k_step);
}

// The next k16 slice starts two K-adjacent core matrices further: 256 bytes, i.e. 16 in
// the descriptor's address field.
constexpr std::uint64_t kSliceAdvance = (2 * kCoreBytes) >> 4;

// Issues the cp.async copies of B (64×K or K×64, see wgmma_probe.hpp) into the
// no-swizzle core-matrix layout; the caller commits and waits.
template <int kTransB, int K>
__device__ __forceinline__ void stage_b(unsigned char* smem_b, const __half* b, int tid) {
  constexpr int k_chunks = K / 8;
  if constexpr (kTransB == 0) {
    // K-major B (N×K): a 16-byte chunk, 8 consecutive k of one n, is one core-matrix row.
    for (int c = tid; c < kN * k_chunks; c += kThreads) {
      const int n = c / k_chunks, kc = c % k_chunks;
      cp_async_16(smem_b + core_offset(n / 8, kc, K) + (n % 8) * 16, b + n * K + kc * 8, true);
    }
  } else {
    // N-major B (K×64, N contiguous): a chunk is 8 consecutive n of one k, again one row
    // of a core matrix (whose 8 rows are 8 consecutive k).
    constexpr int n_chunks = kN / 8;
    for (int c = tid; c < K * n_chunks; c += kThreads) {
      const int k = c / n_chunks, nc = c % n_chunks;
      cp_async_16(smem_b + core_offset(nc, k / 8, K) + (k % 8) * 16, b + k * kN + nc * 8, true);
    }
  }
}

// Closes the group of MMAs issued, waits for it and writes every thread's raw accumulator
// registers: raw[thread·32 + i].
__device__ __forceinline__ void finish_and_write(float (&d)[kRegs / 4][4], float* raw, int tid) {
  wgmma_commit_group();
  wgmma_wait_group<0>();
  wgmma_fence_operands(d);
#pragma unroll
  for (int i = 0; i < kRegs; ++i) raw[tid * kRegs + i] = d[i / 4][i % 4];
}

// Each thread's RS A fragments of every k16 slice of a (row-major 64×K in global memory),
// by the layout documented in src/cuda/wgmma.cuh: register j of slice s holds row
// 16w + l/4 + 8·(j%2), columns 16s + 2·(l%4) + 8·(j/2) + {0, 1}.
template <int K>
__device__ __forceinline__ void load_a_fragments(const __half* a, std::uint32_t (&frag)[K / 16][4],
                                                 int tid) {
  const int warp = tid / 32, lane = tid % 32;
#pragma unroll
  for (int s = 0; s < K / 16; ++s)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int row = 16 * warp + lane / 4 + 8 * (j % 2);
      const int col = 16 * s + 2 * (lane % 4) + 8 * (j / 2);
      // Two consecutive f16 at an even column: one aligned 32-bit word, the lower column
      // in the low half (little-endian), as mma.sync's fragments.
      frag[s][j] = *reinterpret_cast<const std::uint32_t*>(a + row * K + col);
    }
}

// K is a template parameter: with a run-time trip count ptxas serializes the wgmma
// (warning C7520, accumulator wait in a divergent path).
template <int kTransB, int K>
__global__ void __launch_bounds__(kThreads) probe_kernel(const __half* a, const __half* b,
                                                         int a_variant, int b_variant,
                                                         float* raw) {
  static_assert(K % 16 == 0 && K <= kMaxK, "K is a multiple of 16, at most 64");
  __shared__ __align__(1024) unsigned char smem_a[kM * kMaxK * 2];
  __shared__ __align__(1024) unsigned char smem_b[kN * kMaxK * 2];
  const int tid = static_cast<int>(threadIdx.x);
  const int k_chunks = K / 8;  // 16-byte chunks per row of K elements

  // A (and K-major B): a 16-byte chunk of a global row, 8 consecutive k of one m, is one
  // row of a core matrix.
#pragma unroll
  for (int c = tid; c < kM * k_chunks; c += kThreads) {
    const int m = c / k_chunks, kc = c % k_chunks;
    cp_async_16(smem_a + core_offset(m / 8, kc, K) + (m % 8) * 16, a + m * K + kc * 8, true);
  }
  stage_b<kTransB, K>(smem_b, b, tid);
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async_shared();  // generic-proxy writes → async-proxy (wgmma) reads
  __syncthreads();

  std::uint64_t desc_a = probe_desc<K>(smem_a, a_variant);
  std::uint64_t desc_b = probe_desc<K>(smem_b, b_variant);

  float d[kRegs / 4][4];  // 8-column blocks (src/cuda/wgmma.cuh)
#pragma unroll
  for (int i = 0; i < kRegs; ++i) d[i / 4][i % 4] = 0.0f;
  wgmma_fence_operands(d);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks) {
    wgmma_ss<__half, kN, 0, kTransB>(d, desc_a, desc_b, ks > 0);
    desc_a += kSliceAdvance;
    desc_b += kSliceAdvance;
  }
  finish_and_write(d, raw, tid);
}

// The RS form: A (row-major 64×K in global memory) goes straight into registers
// (load_a_fragments); B N-major in shared memory as in probe_kernel<1, K>.
template <int K>
__global__ void __launch_bounds__(kThreads) probe_rs_kernel(const __half* a, const __half* b,
                                                            int b_variant, float* raw) {
  static_assert(K % 16 == 0 && K <= kMaxK, "K is a multiple of 16, at most 64");
  __shared__ __align__(1024) unsigned char smem_b[kN * kMaxK * 2];
  const int tid = static_cast<int>(threadIdx.x);
  stage_b<1, K>(smem_b, b, tid);
  cp_async_commit();

  std::uint32_t frag[K / 16][4];
  load_a_fragments<K>(a, frag, tid);

  cp_async_wait<0>();
  fence_proxy_async_shared();
  __syncthreads();

  std::uint64_t desc_b = probe_desc<K>(smem_b, b_variant);

  float d[kRegs / 4][4];  // 8-column blocks (src/cuda/wgmma.cuh)
#pragma unroll
  for (int i = 0; i < kRegs; ++i) d[i / 4][i % 4] = 0.0f;
  wgmma_fence_operands(d);
#pragma unroll
  for (int s = 0; s < K / 16; ++s) wgmma_fence_operands(frag[s]);
  wgmma_fence();
#pragma unroll
  for (int s = 0; s < K / 16; ++s) {
    wgmma_rs<__half, kN, 1>(d, frag[s], desc_b, s > 0);
    desc_b += kSliceAdvance;
  }
  finish_and_write(d, raw, tid);
#pragma unroll
  for (int s = 0; s < K / 16; ++s) wgmma_fence_operands(frag[s]);  // read until the wait
}

// The attention kernel's layout (core_tile.cuh) at head dim 64, K = 64: A (64×64, as Q or
// P) and B (64×64: N×K as K, or K×N as V) staged by load_core_tile_async, the kernel's
// descriptors and slice steps; A from registers for the N-major (P·V) case.
constexpr int kKernelDim = 64;

template <bool kNMajor>
__global__ void __launch_bounds__(kThreads) kernel_layout_probe(const __half* a, const __half* b,
                                                                float* raw) {
  constexpr int K = kKernelDim;
  __shared__ __align__(1024) __half smem_a[kM * K];
  __shared__ __align__(1024) __half smem_b[kN * K];
  const int tid = static_cast<int>(threadIdx.x);
  if (!kNMajor) load_core_tile_async<__half, kM, K, kThreads>(smem_a, a, K, kM, K, tid);
  // B as the kernel's K tile (rows = keys = N, columns = K) or V tile (rows = keys = K,
  // columns = N): both are 64 rows of 64 elements here.
  load_core_tile_async<__half, 64, 64, kThreads>(smem_b, b, 64, 64, 64, tid);
  cp_async_commit();

  std::uint32_t frag[K / 16][4] = {};
  if (kNMajor) load_a_fragments<K>(a, frag, tid);
  cp_async_wait<0>();
  fence_proxy_async_shared();
  __syncthreads();

  float d[kRegs / 4][4];
#pragma unroll
  for (int i = 0; i < kRegs; ++i) d[i / 4][i % 4] = 0.0f;
  wgmma_fence_operands(d);
  if constexpr (kNMajor) {
#pragma unroll
    for (int s = 0; s < K / 16; ++s) wgmma_fence_operands(frag[s]);
    wgmma_fence();
    const std::uint64_t desc_b = n_major_desc<kKernelDim>(smem_b);
#pragma unroll
    for (int s = 0; s < K / 16; ++s)
      wgmma_rs<__half, kN, 1>(d, frag[s], desc_b + s * n_major_slice_step<kKernelDim>(), s > 0);
  } else {
    wgmma_fence();
    const std::uint64_t desc_a = k_major_desc<kKernelDim>(smem_a);
    const std::uint64_t desc_b = k_major_desc<kKernelDim>(smem_b);
#pragma unroll
    for (int s = 0; s < K / 16; ++s)
      wgmma_ss<__half, kN, 0, 0>(d, desc_a + s * k_major_slice_step(),
                                 desc_b + s * k_major_slice_step(), s > 0);
  }
  finish_and_write(d, raw, tid);
#pragma unroll
  for (int s = 0; s < K / 16; ++s) wgmma_fence_operands(frag[s]);  // read until the wait
}

}  // namespace

namespace {

// Copies a (64×K) and b (64·K elements) to the device, calls launch(da, db, draw) and
// copies the raw accumulators back.
template <class Launch>
cudaError_t with_device_buffers(const __half* a, const __half* b, int K, float* raw,
                                Launch&& launch) {
  const std::size_t a_bytes = sizeof(__half) * kM * K, b_bytes = sizeof(__half) * kN * K;
  const std::size_t raw_bytes = sizeof(float) * kThreads * kRegs;
  void *da = nullptr, *db = nullptr, *draw = nullptr;
  cudaError_t e = cudaMalloc(&da, a_bytes);
  if (e == cudaSuccess) e = cudaMalloc(&db, b_bytes);
  if (e == cudaSuccess) e = cudaMalloc(&draw, raw_bytes);
  if (e == cudaSuccess) e = cudaMemcpy(da, a, a_bytes, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemcpy(db, b, b_bytes, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemset(draw, 0xFF, raw_bytes);  // NaN: unwritten shows
  if (e == cudaSuccess) {
    launch(static_cast<const __half*>(da), static_cast<const __half*>(db),
           static_cast<float*>(draw));
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaMemcpy(raw, draw, raw_bytes, cudaMemcpyDeviceToHost);
  cudaFree(da);
  cudaFree(db);
  cudaFree(draw);
  return e;
}

}  // namespace

cudaError_t run(const __half* a, const __half* b, int K, bool b_n_major, Variant a_variant,
                Variant b_variant, float* raw) {
  if (K != 16 && K != 64) return cudaErrorInvalidValue;
  return with_device_buffers(a, b, K, raw, [&](const __half* da, const __half* db, float* out) {
    auto kernel = b_n_major ? (K == 16 ? probe_kernel<1, 16> : probe_kernel<1, 64>)
                            : (K == 16 ? probe_kernel<0, 16> : probe_kernel<0, 64>);
    kernel<<<1, kThreads>>>(da, db, a_variant, b_variant, out);
  });
}

cudaError_t run_rs(const __half* a, const __half* b, int K, Variant b_variant, float* raw) {
  if (K != 16 && K != 64) return cudaErrorInvalidValue;
  return with_device_buffers(a, b, K, raw, [&](const __half* da, const __half* db, float* out) {
    auto kernel = K == 16 ? probe_rs_kernel<16> : probe_rs_kernel<64>;
    kernel<<<1, kThreads>>>(da, db, b_variant, out);
  });
}

cudaError_t run_kernel_layout(const __half* a, const __half* b, bool b_n_major, float* raw) {
  return with_device_buffers(a, b, kKernelDim, raw,
                             [&](const __half* da, const __half* db, float* out) {
                               auto kernel = b_n_major ? kernel_layout_probe<true>
                                                       : kernel_layout_probe<false>;
                               kernel<<<1, kThreads>>>(da, db, out);
                             });
}

std::uint64_t encode_descriptor(std::uint32_t smem_addr, std::uint32_t lbo_bytes,
                                std::uint32_t sbo_bytes) {
  return fattn::cuda::wgmma_desc_encode(smem_addr, lbo_bytes, sbo_bytes);
}

}  // namespace fattn_cuda_test::wgmma_probe
