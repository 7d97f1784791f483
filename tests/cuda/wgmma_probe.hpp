// fattn CUDA tests — the wgmma probe's device side (wgmma_probe.cu, compiled for sm_90a
// only) as plain host functions, so that the GoogleTest file stays C++20 host code.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace fattn_cuda_test::wgmma_probe {

constexpr int kM = 64;        // rows of A and of the product
constexpr int kN = 64;        // columns of B and of the product
constexpr int kThreads = 128;  // one warpgroup
constexpr int kRegs = 32;      // f32 accumulators per thread for m64n64

// Which of the two byte offsets goes to which descriptor field.
//   kLboK: LBO = offset between core matrices adjacent in K, SBO = adjacent in M/N
//          (the PTX ISA's and CUTLASS's reading for the no-swizzle mode);
//   kLboMN: the two swapped.
enum Variant : int { kLboK = 0, kLboMN = 1 };

// Runs one warpgroup that stages A and B in shared memory in the no-swizzle core-matrix
// layout (core matrices adjacent in K 128 bytes apart, adjacent in M/N 16·K bytes
// apart), multiplies them with K/16 wgmma m64n64k16 (f32 += f16·f16, both operands
// from shared memory, the descriptors' start address advanced by 256 bytes per step)
// and writes every thread's raw accumulator registers: raw[thread·32 + i].
//   a: row-major 64×K (K contiguous; as Q)
//   b: b_n_major == false: row-major 64×K, i.e. N×K (as K in Q·Kᵀ; imm-trans-b = 0)
//      b_n_major == true:  row-major K×64, N contiguous (as V in P·V; imm-trans-b = 1)
// K is 16 or 64. Returns the first CUDA error (cudaSuccess when all went well).
cudaError_t run(const __half* a, const __half* b, int K, bool b_n_major, Variant a_variant,
                Variant b_variant, float* raw);

// The RS form (A from registers): each thread loads its A fragment of every k16 slice
// straight from a (row-major 64×K) by the layout documented in src/cuda/wgmma.cuh; b is
// N-major (K×64, N contiguous; imm-trans-b = 1), staged as in run(); b_variant picks
// B's LBO/SBO assignment. K is 16 or 64; raw as in run().
cudaError_t run_rs(const __half* a, const __half* b, int K, Variant b_variant, float* raw);

// The attention kernel's own layout and descriptors (src/cuda/core_tile.cuh: the
// core-matrix loader, k_major_desc / n_major_desc and their slice steps, head dim 64), no
// variants: K = 64. b_n_major == false: S = A·Bᵀ as Q·Kᵀ (SS form, both operands staged
// by the loader); true: A·B as P·V (RS form, A's fragments from registers as in run_rs,
// B staged by the loader as the V tile). raw as in run().
cudaError_t run_kernel_layout(const __half* a, const __half* b, bool b_n_major, float* raw);

// The descriptor encoding (src/cuda/wgmma.cuh), callable without a GPU.
std::uint64_t encode_descriptor(std::uint32_t smem_addr, std::uint32_t lbo_bytes,
                                std::uint32_t sbo_bytes);

}  // namespace fattn_cuda_test::wgmma_probe
