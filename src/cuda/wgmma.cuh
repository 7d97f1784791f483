// fattn — Hopper warpgroup MMA (wgmma, sm_90a only) building blocks: the shared-memory
// matrix descriptor, the wgmma fences and groups, and the m64n64k16 f16 MMA with both
// operands in shared memory (SS) and with A in registers, B in shared memory (RS). Not
// used by the library yet: tests/cuda/wgmma_probe.cu checks them on an H100
// (docs/cuda.md, "Next: a wgmma kernel", step 1).
//
// wgmma is issued by a warpgroup (4 consecutive warps, the first at a warp index
// divisible by 4); all 128 threads execute every wrapper below together. The tensor
// cores read A and B from shared memory through 64-bit descriptors (PTX ISA, "Matrix
// Descriptor Format"), asynchronously: the accumulators are not valid until
// wgmma_wait_group says the group holding the MMA is done.
//
// No-swizzle ("interleave") operand layout: the operand is cut into core matrices of
// 8 rows × 16 bytes (8 16-bit elements), each stored as 128 contiguous bytes, row by
// row. For a K-major operand a core-matrix row is 8 consecutive k of one m (or n); for
// an MN-major operand (trans = 1) it is 8 consecutive m (or n) of one k. Where the core
// matrices lie relative to each other is told by two byte offsets in the descriptor:
//   LBO (leading dimension byte offset): between core matrices adjacent in K,
//   SBO (stride dimension byte offset):  between core matrices adjacent in M or N,
// according to the PTX ISA and CUTLASS (cute/atom/mma_traits_sm90_gmma.hpp) for the
// no-swizzle mode of both majors. The two are easy to get backwards (and the swizzled
// MN-major modes do swap them), so the probe test runs both assignments and says which
// one the hardware agrees with.
//
// Accumulator fragment of m64nNk16 (f32), N/2 registers per thread: warp w of the
// warpgroup owns rows 16w..16w+15; register i of lane l holds
//   row 16w + l/4 + 8·((i/2) % 2),  column 8·(i/4) + 2·(l%4) + (i%2),
// i.e. each 8-column chunk is the m16n8 C layout of mma.sync (mma.cuh).
#pragma once

#include <cstdint>

// wgmma exists only on the sm_90a target ("a": architecture-specific, no forward
// compatibility); nvcc defines __CUDA_ARCH_FEAT_SM90_ALL when compiling for
// compute_90a. Elsewhere the wrappers trap, so a kernel that reaches them by mistake
// fails loudly instead of computing nothing.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FATTN_WGMMA_ENABLED 1
#else
#define FATTN_WGMMA_ENABLED 0
#endif

namespace fattn::cuda {

// ---- the shared-memory matrix descriptor ----------------------------------------------
// Bits 0-13: start address >> 4; 16-29: LBO >> 4; 32-45: SBO >> 4; 49-51: base offset
// (only for the swizzled modes: 0 here); 62-63: swizzle mode (0 = none). Addresses and
// offsets are in the shared window (< 256 KB), 16-byte aligned; each field keeps bits
// 4-17. Host-callable so that a test can check the encoding without a GPU.
__host__ __device__ constexpr std::uint64_t wgmma_desc_encode(std::uint32_t smem_addr,
                                                              std::uint32_t lbo_bytes,
                                                              std::uint32_t sbo_bytes) {
  return static_cast<std::uint64_t>((smem_addr & 0x3FFFFu) >> 4) |
         static_cast<std::uint64_t>((lbo_bytes & 0x3FFFFu) >> 4) << 16 |
         static_cast<std::uint64_t>((sbo_bytes & 0x3FFFFu) >> 4) << 32;
}
static_assert(wgmma_desc_encode(0x400, 128, 1024) == (0x40ull | 8ull << 16 | 64ull << 32),
              "descriptor fields");

// The no-swizzle descriptor of an operand starting at `smem` (a shared-memory pointer).
// Moving the start by b bytes (the next k16 slice) is adding b >> 4 to the descriptor,
// as long as the address field does not overflow (it cannot: shared memory < 256 KB).
__device__ __forceinline__ std::uint64_t wgmma_desc(const void* smem, std::uint32_t lbo_bytes,
                                                    std::uint32_t sbo_bytes) {
  const auto addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  return wgmma_desc_encode(addr, lbo_bytes, sbo_bytes);
}

// ---- ordering ---------------------------------------------------------------------------
// Shared memory written through the generic proxy (ordinary stores, cp.async) is read by
// wgmma through the async proxy: each writing thread fences before the barrier that
// precedes the wgmma (HOPPER.md). Plain sm_90, not only 90a.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
  __trap();
#endif
}

// Before the first wgmma of a sequence, and whenever the accumulator (or A-fragment)
// registers were touched by other instructions since the last one.
__device__ __forceinline__ void wgmma_fence() {
#if FATTN_WGMMA_ENABLED
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

// Closes the group of wgmma issued since the last commit.
__device__ __forceinline__ void wgmma_commit_group() {
#if FATTN_WGMMA_ENABLED
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

// Waits until at most N committed groups are pending; their accumulators are then valid.
template <int N>
__device__ __forceinline__ void wgmma_wait_group() {
#if FATTN_WGMMA_ENABLED
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#else
  __trap();
#endif
}

// The compiler does not know that wgmma reads and writes the accumulators after the
// instruction issues: this empty asm pins each register, so no read or write of it is
// moved across the fence / wait it is placed next to (CUTLASS's warpgroup_fence_operand).
template <int kN>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// ---- the MMA ------------------------------------------------------------------------------
// d (64×64 f32, 32 registers per thread, layout above) = a·b + (accumulate ? d : 0), with
// a 64×16 and b 16×64 f16 in shared memory. kTransA / kTransB are the immediates
// imm-trans-a / imm-trans-b: 0 = K-major (A row-major M×K, B stored N×K, as K in Q·Kᵀ),
// 1 = MN-major (B stored K×N with N contiguous, as V in P·V).
template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16_f32_f16_ss(float (&d)[32], std::uint64_t desc_a,
                                                           std::uint64_t desc_b, bool accumulate) {
  static_assert((kTransA == 0 || kTransA == 1) && (kTransB == 0 || kTransB == 1),
                "transpose immediates are 0 or 1");
#if FATTN_WGMMA_ENABLED
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, %35, %36;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransA), "n"(kTransB));
#else
  (void)d;
  (void)desc_a;
  (void)desc_b;
  (void)accumulate;
  __trap();
#endif
}

// A-fragment register layout of the RS form, m64k16 f16 (4 × 32-bit registers per
// thread, two f16 each, the lower-indexed element in the low 16 bits): warp w of the
// warpgroup owns rows 16w..16w+15 and, within a warp, it is the A fragment of mma.sync
// m16n8k16 (mma.cuh). Element v (0..7) of lane l, register v/2:
//   row 16w + l/4 + 8·((v/2) % 2),  column 2·(l%4) + (v%2) + 8·(v/4),
// i.e. a[0] = (row r, cols c, c+1), a[1] = (r+8, c..c+1), a[2] = (r, c+8..c+9),
// a[3] = (r+8, c+8..c+9) with r = 16w + l/4, c = 2·(l%4). This is CUTLASS's
// SM90::GMMA::ALayout_64x16 (cute/atom/mma_traits_sm90_gmma.hpp: thread (4,8,4) strides
// (128,1,16), value (2,2,2) strides (64,8,512) over a column-major 64×16 tile), the same
// as the m64nNk16 accumulator layout above with N = 16 (PTX ISA, "Register Fragments",
// wgmma .m64nNk16 matrix A). Unverified on hardware: the probe checks it.
__device__ __forceinline__ void wgmma_fence_operands(std::uint32_t (&a)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

// d (64×64 f32) = a·b + (accumulate ? d : 0), a 64×16 f16 in registers (layout above),
// b 16×64 f16 in shared memory. kTransB is imm-trans-b: 0 = K-major (B stored N×K),
// 1 = N-major (B stored K×N with N contiguous, as V in P·V). The RS form has no
// imm-trans-a. The registers of a must not be written until the group holding this MMA
// is waited for, and a wgmma_fence must separate their last write from the MMA.
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16_f32_f16_rs(float (&d)[32],
                                                           const std::uint32_t (&a)[4],
                                                           std::uint64_t desc_b, bool accumulate) {
  static_assert(kTransB == 0 || kTransB == 1, "the transpose immediate is 0 or 1");
#if FATTN_WGMMA_ENABLED
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b),
        "r"(static_cast<int>(accumulate)), "n"(kTransB));
#else
  (void)d;
  (void)a;
  (void)desc_b;
  (void)accumulate;
  __trap();
#endif
}

}  // namespace fattn::cuda
