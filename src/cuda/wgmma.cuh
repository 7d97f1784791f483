// fattn — Hopper warpgroup MMA (wgmma, sm_90a only) building blocks: the shared-memory
// matrix descriptor, the wgmma fences and groups, and the m64nNk16 (N = 64, 128) MMA on
// float16 / bfloat16 with both operands in shared memory (SS) and with A in registers,
// B in shared memory (RS). Used by fused_wgmma.cuh; tests/cuda/wgmma_probe.cu checks
// the descriptor and fragment layouts on their own on an H100 (docs/cuda.md).
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

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

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
template <int kBlocks>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[kBlocks][4]) {
#pragma unroll
  for (int n = 0; n < kBlocks; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[n][e])::"memory");
}
__device__ __forceinline__ void wgmma_fence_operands(std::uint32_t (&a)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

// ---- the MMA ------------------------------------------------------------------------------
// d (64×N f32) = a·b + (accumulate ? d : 0) for 16-bit T (__half or __nv_bfloat16), N = 64
// or 128. The accumulator is d[N/8][4]: block n holds columns 8n..8n+7 in the m16n8 C
// layout of the thread's warp (header comment), so the warp-level softmax and epilogue
// helpers (warp_softmax.cuh) take it as they take mma.sync's score blocks.
//
// Two forms:
//   wgmma_ss: a (64×16) and b (16×N) both from shared memory, through descriptors;
//             kTransA / kTransB are imm-trans-a / imm-trans-b: 0 = K-major (A row-major
//             M×K; B stored N×K, as K in Q·Kᵀ), 1 = MN-major (B stored K×N with N
//             contiguous, as V in P·V).
//   wgmma_rs: a from 4 registers per thread (layout below), b from shared memory; the RS
//             form has no imm-trans-a. The registers of a must not be written until the
//             group holding this MMA is waited for, and a wgmma_fence must separate their
//             last write from the MMA.
//
// A-fragment register layout of the RS form, m64k16 (4 × 32-bit registers per thread,
// two 16-bit values each, the lower-indexed element in the low half): warp w of the
// warpgroup owns rows 16w..16w+15 and, within a warp, it is the A fragment of mma.sync
// m16n8k16 (mma.cuh). Element v (0..7) of lane l, register v/2:
//   row 16w + l/4 + 8·((v/2) % 2),  column 2·(l%4) + (v%2) + 8·(v/4),
// i.e. a[0] = (row r, cols c, c+1), a[1] = (r+8, c..c+1), a[2] = (r, c+8..c+9),
// a[3] = (r+8, c+8..c+9) with r = 16w + l/4, c = 2·(l%4). This is CUTLASS's
// SM90::GMMA::ALayout_64x16 (cute/atom/mma_traits_sm90_gmma.hpp: thread (4,8,4) strides
// (128,1,16), value (2,2,2) strides (64,8,512) over a column-major 64×16 tile), the same
// as the m64nNk16 accumulator layout above with N = 16 (PTX ISA, "Register Fragments",
// wgmma .m64nNk16 matrix A). So the accumulator blocks 2k and 2k+1 of a score tile,
// rounded to 16 bits pairwise, are the A fragment of its k-th 16-column slice.
//
// The instruction text and operand lists are spelled by the macros below: inline asm
// takes only string literals, and each (N, type) pair is its own instruction.
#define FATTN_WGMMA_ACC8(d, n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
#define FATTN_WGMMA_ACC64(d, b)                                                          \
  FATTN_WGMMA_ACC8(d, b + 0), FATTN_WGMMA_ACC8(d, b + 1), FATTN_WGMMA_ACC8(d, b + 2),   \
      FATTN_WGMMA_ACC8(d, b + 3), FATTN_WGMMA_ACC8(d, b + 4), FATTN_WGMMA_ACC8(d, b + 5), \
      FATTN_WGMMA_ACC8(d, b + 6), FATTN_WGMMA_ACC8(d, b + 7)
#define FATTN_WGMMA_REGS32                                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FATTN_WGMMA_REGS64                                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, "  \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "   \
  "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, "   \
  "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
// SS: operands after the accumulators are desc_a, desc_b, accumulate, trans-a, trans-b.
#define FATTN_WGMMA_SS_TEXT(N, TYPE, REGS, A, B, ACC, TA, TB)                     \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\n"                                \
  "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " REGS ", " A \
  ", " B ", p, 1, 1, " TA ", " TB ";\n}\n"
// RS: operands after the accumulators are a[0..3], desc_b, accumulate, trans-b.
#define FATTN_WGMMA_RS_TEXT(N, TYPE, REGS, A0, A1, A2, A3, B, ACC, TB)                   \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " ACC ", 0;\n"                                       \
  "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " REGS ", {" A0 ", " \
  A1 ", " A2 ", " A3 "}, " B ", p, 1, 1, " TB ";\n}\n"

template <class T, int kN, int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_ss(float (&d)[kN / 8][4], std::uint64_t desc_a,
                                         std::uint64_t desc_b, bool accumulate) {
  static_assert(kN == 64 || kN == 128, "m64n64k16 or m64n128k16");
  static_assert((kTransA == 0 || kTransA == 1) && (kTransB == 0 || kTransB == 1),
                "transpose immediates are 0 or 1");
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "16-bit inputs");
#if FATTN_WGMMA_ENABLED
  const int acc = accumulate ? 1 : 0;
  if constexpr (kN == 64 && std::is_same_v<T, __half>) {
    asm volatile(
        FATTN_WGMMA_SS_TEXT(64, "f16", FATTN_WGMMA_REGS32, "%32", "%33", "%34", "%35", "%36")
                 : FATTN_WGMMA_ACC64(d, 0)
                 : "l"(desc_a), "l"(desc_b), "r"(acc), "n"(kTransA), "n"(kTransB));
  } else if constexpr (kN == 64) {
    asm volatile(
        FATTN_WGMMA_SS_TEXT(64, "bf16", FATTN_WGMMA_REGS32, "%32", "%33", "%34", "%35", "%36")
                 : FATTN_WGMMA_ACC64(d, 0)
                 : "l"(desc_a), "l"(desc_b), "r"(acc), "n"(kTransA), "n"(kTransB));
  } else if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        FATTN_WGMMA_SS_TEXT(128, "f16", FATTN_WGMMA_REGS64, "%64", "%65", "%66", "%67", "%68")
                 : FATTN_WGMMA_ACC64(d, 0), FATTN_WGMMA_ACC64(d, 8)
                 : "l"(desc_a), "l"(desc_b), "r"(acc), "n"(kTransA), "n"(kTransB));
  } else {
    asm volatile(
        FATTN_WGMMA_SS_TEXT(128, "bf16", FATTN_WGMMA_REGS64, "%64", "%65", "%66", "%67", "%68")
                 : FATTN_WGMMA_ACC64(d, 0), FATTN_WGMMA_ACC64(d, 8)
                 : "l"(desc_a), "l"(desc_b), "r"(acc), "n"(kTransA), "n"(kTransB));
  }
#else
  (void)d;
  (void)desc_a;
  (void)desc_b;
  (void)accumulate;
  __trap();
#endif
}

template <class T, int kN, int kTransB>
__device__ __forceinline__ void wgmma_rs(float (&d)[kN / 8][4], const std::uint32_t (&a)[4],
                                         std::uint64_t desc_b, bool accumulate) {
  static_assert(kN == 64 || kN == 128, "m64n64k16 or m64n128k16");
  static_assert(kTransB == 0 || kTransB == 1, "the transpose immediate is 0 or 1");
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "16-bit inputs");
#if FATTN_WGMMA_ENABLED
  const int acc = accumulate ? 1 : 0;
  if constexpr (kN == 64 && std::is_same_v<T, __half>) {
    asm volatile(FATTN_WGMMA_RS_TEXT(64, "f16", FATTN_WGMMA_REGS32, "%32", "%33", "%34", "%35",
                                     "%36", "%37", "%38")
                 : FATTN_WGMMA_ACC64(d, 0)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(acc), "n"(kTransB));
  } else if constexpr (kN == 64) {
    asm volatile(FATTN_WGMMA_RS_TEXT(64, "bf16", FATTN_WGMMA_REGS32, "%32", "%33", "%34", "%35",
                                     "%36", "%37", "%38")
                 : FATTN_WGMMA_ACC64(d, 0)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(acc), "n"(kTransB));
  } else if constexpr (std::is_same_v<T, __half>) {
    asm volatile(FATTN_WGMMA_RS_TEXT(128, "f16", FATTN_WGMMA_REGS64, "%64", "%65", "%66", "%67",
                                     "%68", "%69", "%70")
                 : FATTN_WGMMA_ACC64(d, 0), FATTN_WGMMA_ACC64(d, 8)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(acc), "n"(kTransB));
  } else {
    asm volatile(FATTN_WGMMA_RS_TEXT(128, "bf16", FATTN_WGMMA_REGS64, "%64", "%65", "%66", "%67",
                                     "%68", "%69", "%70")
                 : FATTN_WGMMA_ACC64(d, 0), FATTN_WGMMA_ACC64(d, 8)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(acc), "n"(kTransB));
  }
#else
  (void)d;
  (void)a;
  (void)desc_b;
  (void)accumulate;
  __trap();
#endif
}

#undef FATTN_WGMMA_ACC8
#undef FATTN_WGMMA_ACC64
#undef FATTN_WGMMA_REGS32
#undef FATTN_WGMMA_REGS64
#undef FATTN_WGMMA_SS_TEXT
#undef FATTN_WGMMA_RS_TEXT

// ---- the two products of a key tile, issued by the whole warpgroup ---------------------------
// For a layout of the shared tiles (Slices: core_tile.cuh's CoreMatrixSlices, tma.cuh's
// Sw128Slices), which says how far 16-wide slice kk of an operand moves its descriptor:
//   Slices::k_major<kRows>(kk)   along K of a K-major operand whose tile has kRows rows
//   Slices::mn_major<kCols>(kk)  along K (16 rows) of an MN-major operand with kCols columns

// S = Q·Kᵀ for the warpgroup's 64 rows and the tile's Bc keys as one group: D/16 SS MMAs,
// Q and K both K-major; q_desc points at the warpgroup's first row of a Q tile of kQRows
// rows. s is valid after the group is waited for.
template <class Slices, class T, int kD, int kBc, int kQRows>
__device__ __forceinline__ void issue_qk(float (&s)[kBc / 8][4], std::uint64_t q_desc,
                                         std::uint64_t k_desc) {
  wgmma_fence_operands(s);
  wgmma_fence();  // s was read by the last tile's softmax
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk)
    wgmma_ss<T, kBc, 0, 0>(s, q_desc + Slices::template k_major<kQRows>(kk),
                           k_desc + Slices::template k_major<kBc>(kk), kk > 0);
  wgmma_commit_group();
}

// O += P·V as one group: Bc/16 RS MMAs, P from registers, V MN-major from shared. Neither o
// nor a may be touched until the group is waited for. Above 128 columns (the widest MMA
// wgmma.cuh issues) each key slice is one MMA per 128 columns of V: o's blocks 16h..16h+15
// against V's columns from 128h (Slices::mn_columns: where they start in the tile of kBc
// keys).
template <class Slices, class T, int kD, int kKS>
__device__ __forceinline__ void issue_pv(std::uint32_t (&a)[kKS][4], float (&o)[kD / 8][4],
                                         std::uint64_t v_desc) {
  constexpr int kN = kD <= 128 ? kD : 128;  // columns per MMA
  static_assert(kD % kN == 0, "whole 128-column halves");
#pragma unroll
  for (int kk = 0; kk < kKS; ++kk) wgmma_fence_operands(a[kk]);
  wgmma_fence_operands(o);
  wgmma_fence();  // o was rescaled and a written by ordinary instructions
#pragma unroll
  for (int kk = 0; kk < kKS; ++kk) {
    const std::uint64_t desc = v_desc + Slices::template mn_major<kD>(kk);
    if constexpr (kN == kD) {
      wgmma_rs<T, kD, 1>(o, a[kk], desc, true);
    } else {
#pragma unroll
      for (int n0 = 0; n0 < kD; n0 += kN)
        wgmma_rs<T, kN, 1>(*reinterpret_cast<float(*)[kN / 8][4]>(&o[n0 / 8]), a[kk],
                           desc + Slices::template mn_columns<16 * kKS>(n0), true);
    }
  }
  wgmma_commit_group();
}

}  // namespace fattn::cuda
