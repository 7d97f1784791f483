// fattn — a vector of floats, as wide as the instruction set of the translation unit.
//
// Written with GCC/Clang vector extensions, so one source serves AVX-512 (64 bytes),
// AVX2 (32 bytes) and the portable path (16 bytes: SSE2 on x86-64, NEON on Arm):
// each kernel translation unit is compiled with its own -m flags and the compiler
// emits that ISA's instructions. Only the aligned scratch tiles are read as vectors;
// K and V elements enter as scalar broadcasts, so any stride works.
#pragma once

#include "cpu/common/isa_target.hpp"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace fattn::cpu {

// GCC does not apply vector_size to a template-dependent size, so each width is spelled out.
template <int Bytes>
struct VectorTypes;
template <>
struct VectorTypes<64> {
  typedef float vec __attribute__((vector_size(64)));
  typedef std::int32_t ivec __attribute__((vector_size(64)));
};
template <>
struct VectorTypes<32> {
  typedef float vec __attribute__((vector_size(32)));
  typedef std::int32_t ivec __attribute__((vector_size(32)));
};
template <>
struct VectorTypes<16> {
  typedef float vec __attribute__((vector_size(16)));
  typedef std::int32_t ivec __attribute__((vector_size(16)));
};

template <int Bytes>
struct Simd {
  using vec = typename VectorTypes<Bytes>::vec;
  using ivec = typename VectorTypes<Bytes>::ivec;
  static constexpr int lanes = Bytes / static_cast<int>(sizeof(float));
  static constexpr int alignment = Bytes;

  static vec load(const float* p) {
    vec v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store(float* p, vec v) { std::memcpy(p, &v, sizeof v); }
  // One broadcast instruction. Not vec{} + s: adding +0 is a real instruction (it
  // maps −0 to +0) and cost an FP op per broadcast in the micro-kernels; a lane-by-lane
  // fill became two 256-bit broadcasts and an insert with GCC 12.
  static vec splat(float s) {
#if defined(FATTN_AVX512)
    if constexpr (Bytes == 64) return _mm512_set1_ps(s);
#endif
#if defined(FATTN_AVX)
    if constexpr (Bytes == 32) return _mm256_set1_ps(s);
#endif
#if defined(__SSE__)
    if constexpr (Bytes == 16) return _mm_set1_ps(s);
#endif
    vec v;
    for (int i = 0; i < lanes; ++i) v[i] = s;
    return v;
  }
  static vec zero() { return vec{}; }
  // a*b + c; the kernel units are built with -ffp-contract=fast, so this is one FMA.
  static vec fma(vec a, vec b, vec c) { return a * b + c; }
  // max that ignores a NaN in m (the running max) but not in x: the caller's
  // softmax turns a NaN score into a NaN row through exp2, as the reference does.
  static vec max(vec x, vec m) { return x > m ? x : m; }
  // max(x, lo) and min(x, hi) that return x when x is NaN: one vmaxps/vminps
  // (their NaN rule returns the second operand); GCC 12 emits compare + blend for
  // the conditional form with a constant bound.
  enum class Bound { lower, upper };
  template <Bound kBound>
  static vec bounded(vec x, float bound) {
    constexpr bool kLower = kBound == Bound::lower;
    const vec b = splat(bound);
#if defined(FATTN_AVX512)
    if constexpr (Bytes == 64) return kLower ? _mm512_max_ps(b, x) : _mm512_min_ps(b, x);
#endif
#if defined(FATTN_AVX)
    if constexpr (Bytes == 32) return kLower ? _mm256_max_ps(b, x) : _mm256_min_ps(b, x);
#endif
#if defined(__SSE__)
    if constexpr (Bytes == 16) return kLower ? _mm_max_ps(b, x) : _mm_min_ps(b, x);
#endif
    if constexpr (kLower) return x < bound ? b : x;
    return x > bound ? b : x;
  }
  // Named instances, not wrappers: a wrapper's extra call level changed GCC 12's inlining
  // across the kernel units (objdump).
  static constexpr vec (*at_least)(vec, float) = bounded<Bound::lower>;
  static constexpr vec (*at_most)(vec, float) = bounded<Bound::upper>;
  static vec iota() {
    vec v;
    for (int i = 0; i < lanes; ++i) v[i] = static_cast<float>(i);
    return v;
  }
};

// c0·x^n + c1·x^(n−1) + … + cn by Horner's rule, highest coefficient first: one FMA per
// coefficient after the first, in the order written, so a polynomial approximation gives
// the same bits as its FMAs spelled out.
template <class S, class... C>
[[gnu::always_inline]] inline typename S::vec horner(typename S::vec x, float c0, C... c) {
  typename S::vec p = S::splat(c0);
  ((p = S::fma(p, x, S::splat(c))), ...);
  return p;
}

}  // namespace fattn::cpu
