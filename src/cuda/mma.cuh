// fattn — warp-level tensor-core operations (mma.sync, sm_80+) and their operand loads.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16 / m16n8k8"), with
// g = lane / 4 (the group) and t = lane % 4 (the thread in the group):
//   C/D 16×8 float, 4 registers:   c0,c1 = (row g,   cols 2t, 2t+1)
//                                  c2,c3 = (row g+8, cols 2t, 2t+1)
//   A 16×16 16-bit, 4 registers:   a0 = (row g, cols 2t..2t+1)     a1 = (row g+8, cols 2t..)
//                                  a2 = (row g, cols 2t+8..2t+9)   a3 = (row g+8, cols 2t+8..)
//   B 16×8 16-bit, 2 registers:    b0 = (rows 2t..2t+1, col g)     b1 = (rows 2t+8.., col g)
//   A 16×8 tf32, 4 registers:      a0 = (g, t)  a1 = (g+8, t)  a2 = (g, t+4)  a3 = (g+8, t+4)
//   B 8×8 tf32, 2 registers:       b0 = (row t, col g)   b1 = (row t+4, col g)
// The C layout of two adjacent 16×8 score blocks is the A layout of one 16×16 block
// of probabilities, which is what lets FlashAttention-2 keep P in registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace fattn::cuda {

// Four 8×8 16-bit matrices from shared memory. Lanes 8m..8m+7 give the addresses of
// the 8 rows (16 bytes each) of matrix m; register m receives matrix m, lane l
// holding row l/4, elements 2(l%4) and 2(l%4)+1.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* smem_row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// The same, transposed: lane l holds elements (rows 2(l%4), 2(l%4)+1; column l/4).
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* smem_row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// d += a·b, 16×8×16, 16-bit operands (T = __half or __nv_bfloat16), float32 accumulation.
// One instruction per type: PTX names the operand type in the opcode.
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4],
                                          std::uint32_t b0, std::uint32_t b1) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>,
                "mma.sync m16n8k16 takes float16 or bfloat16 operands");
  if constexpr (std::is_same_v<T, __half>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a·b, 16×8×8, tf32 operands (float32 bit patterns with the low 13 mantissa
// bits zero), float32 accumulation.
__device__ __forceinline__ void mma_1688_tf32(float (&d)[4], const std::uint32_t (&a)[4],
                                              std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// x rounded to the nearest tf32 (10 mantissa bits), as a float32 bit pattern.
__device__ __forceinline__ std::uint32_t to_tf32(float x) {
  std::uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// 3xTF32: x = big + small with both parts tf32; big·big + big·small + small·big
// recovers about 21 of float32's 24 mantissa bits of each product (the dropped
// small·small term is below 2^-21 relative), enough for float32-level accuracy.
// An operand that is not split keeps its big part only (small = 0): about 11 bits.
struct Tf32Split {
  std::uint32_t big, small;
};
template <bool kSplit = true>
__device__ __forceinline__ Tf32Split split_tf32(float x) {
  const std::uint32_t big = to_tf32(x);
  if constexpr (!kSplit) return {big, 0u};
  return {big, to_tf32(x - __uint_as_float(big))};
}

// d += a·b from split operands: big·big, plus small·big where a is split and big·small
// where b is split (small products first, so they are not lost in a large d).
// <true, true> is 3xTF32 (3 MMAs); <false, false> is plain TF32 (1 MMA).
template <bool kSplitA = true, bool kSplitB = true>
__device__ __forceinline__ void mma_1688_3xtf32(float (&d)[4], const Tf32Split (&a)[4],
                                                Tf32Split b0, Tf32Split b1) {
  const std::uint32_t a_big[4] = {a[0].big, a[1].big, a[2].big, a[3].big};
  if constexpr (kSplitA) {
    const std::uint32_t a_small[4] = {a[0].small, a[1].small, a[2].small, a[3].small};
    mma_1688_tf32(d, a_small, b0.big, b1.big);
  }
  if constexpr (kSplitB) mma_1688_tf32(d, a_big, b0.small, b1.small);
  mma_1688_tf32(d, a_big, b0.big, b1.big);
}

}  // namespace fattn::cuda
