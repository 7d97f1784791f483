// fattn — the element types of the tensors the CPU kernels read and write.
//
// q, k, v, out (and the backward's dout, dq, dk, dv) are float32, bfloat16 or float16,
// and a forward's k and v may be q8_0 (int8 blocks with a float16 scale each, widened to
// float32 where a kernel copies or stages their rows); the kernels compute in float32
// whatever the inputs. A 16-bit element becomes a float
// where a kernel loads it into its own tile (the query tile, the key panels, the value
// rows) and a float becomes a 16-bit element where the kernel stores its output, both
// rounding to nearest even: the tensors themselves are never converted as a whole.
//
// The scalar conversions are plain integer code, exact on every platform; rows with
// contiguous dims convert 16 (AVX-512) or 8 (AVX2 + F16C) elements at a time. The
// kernels' hot loops read their own float32 tiles, so these run O(S·D) times per head
// while the loops run O(S²·D) (the decode kernel's staged rows excepted).
//
// The functions sit in an unnamed namespace: each kernel unit, compiled with its own
// instruction set, keeps its own copy (one shared inline copy could be the AVX-512 one).
#pragma once

#include "cpu/common/isa_target.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "model/checks.hpp"
#include "model/problem.hpp"
#include "cpu/common/simd.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace fattn::cpu {

struct BFloat16 {
  std::uint16_t bits;
};
struct Float16 {
  std::uint16_t bits;
};
// The bytes of a q8_0 tensor (DType::q8_0): a view retyped to Q8_0 counts its strides in
// bytes, and row() points at the first block of a row. Never indexed by value: its rows
// are read through convert_row.
struct Q8_0 {
  std::uint8_t byte;
};

namespace {

inline std::uint32_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

inline float to_float(float x) { return x; }
inline float to_float(BFloat16 x) { return bits_float(static_cast<std::uint32_t>(x.bits) << 16); }
inline float to_float(Float16 x) {
  const std::uint32_t sign = static_cast<std::uint32_t>(x.bits & 0x8000u) << 16;
  const std::uint32_t exponent = (x.bits >> 10) & 0x1fu, mantissa = x.bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa · 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));  // 112 = 127 − 15
}

// float → E, round to nearest even; NaN stays NaN (quiet), overflow becomes ±inf.
template <class E>
E from_float(float x);

template <>
inline float from_float<float>(float x) {
  return x;
}
template <>
inline BFloat16 from_float<BFloat16>(float x) {
  const std::uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<std::uint16_t>((u >> 16) | 0x40u)};
  return {static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
template <>
inline Float16 from_float<Float16>(float x) {
  const std::uint32_t u = float_bits(x);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u)  // NaN: keep the top mantissa bits, set the quiet bit
    return {static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu))};
  if (magnitude >= 0x477ff000u) return {static_cast<std::uint16_t>(sign | 0x7c00u)};  // ≥ 65520
  if (magnitude < 0x38800000u) {  // below 2^-14: a float16 subnormal, units of 2^-24
    const auto units = static_cast<std::uint32_t>(std::nearbyint(bits_float(magnitude) * 0x1p24f));
    return {static_cast<std::uint16_t>(sign | units)};  // 1024 units is the least normal: right
  }
  std::uint32_t r = magnitude - (112u << 23);  // rebias the exponent, 10 mantissa bits kept
  r += 0xfffu + ((r >> 13) & 1u);
  return {static_cast<std::uint16_t>(sign | (r >> 13))};
}

// Whether a kernel unit whose vectors are S runs bfloat16 inputs on bfloat16 dot products
// (vdpbf16ps): it was built with AVX512-BF16 (the avx512_bf16 table) and has 512-bit
// vectors. The fused forward (kernels_isa.cpp) and the decode kernel ask it.
template <class S>
bool on_bf16_dot_products([[maybe_unused]] DType dtype) {
#if defined(FATTN_AVX512_BF16)
  if constexpr (S::lanes == 16) return dtype == DType::bfloat16;
#endif
  return false;
}

#if defined(FATTN_AVX512_BF16)
// 32 bfloat16 held as integers (loaded, broadcast or shuffled as bits) as vdpbf16ps takes
// them: 16 pairs, the same bits.
inline __m512bh as_pairs(__m512i x) { return reinterpret_cast<const __m512bh&>(x); }
// 32 bfloat16 from `at` as bits, or where only 16 are left (`half`: a head dim that is an
// odd number of 16s) those and 16 zeros, whose products add nothing.
inline __m512i load_bf16x32(const void* at, bool half) {
  return half ? _mm512_zextsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(at)))
              : _mm512_loadu_si512(at);
}
#endif

// S::lanes contiguous elements as a vector of floats: one load for float32; for 16-bit
// elements a load and a widening (a shift for bfloat16, vcvtph2ps for float16) where the
// unit has the instructions, else element by element.
template <class S, class E>
typename S::vec load_vec(const E* src) {
  if constexpr (std::is_same_v<E, float>) {
    return S::load(src);
  } else {
#if defined(FATTN_AVX512)
    if constexpr (S::lanes == 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
      if constexpr (std::is_same_v<E, BFloat16>)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      else
        return _mm512_cvtph_ps(h);
    }
#endif
#if defined(FATTN_AVX)
    if constexpr (S::lanes == 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
      if constexpr (std::is_same_v<E, BFloat16>)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      else
        return _mm256_cvtph_ps(h);
    }
#endif
    typename S::vec v;
    for (int i = 0; i < S::lanes; ++i) v[i] = to_float(src[i]);
    return v;
  }
}

// Block `block` of a q8_0 row: its scale and its 32 int8 values.
inline const std::uint8_t* q8_0_block(const Q8_0* row, std::int64_t block) {
  return reinterpret_cast<const std::uint8_t*>(row) + block * kQ8_0BlockBytes;
}
inline float q8_0_scale(const std::uint8_t* block) {
  std::uint16_t bits;
  std::memcpy(&bits, block, sizeof bits);
#if defined(FATTN_AVX512) || defined(FATTN_AVX)
  return _cvtsh_ss(bits);  // F16C: one instruction where to_float is a dozen
#else
  return to_float(Float16{bits});
#endif
}

// S::lanes int8 values of a q8_0 block from `values` on, widened and times the block's
// scale (already in every lane): d·q, exact in float32 (11 + 8 significant bits).
template <class S>
typename S::vec q8_0_lanes(const std::int8_t* values, typename S::vec scale) {
#if defined(FATTN_AVX512)
  if constexpr (S::lanes == 16) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(values));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), scale);
  }
#endif
#if defined(FATTN_AVX)
  if constexpr (S::lanes == 8) {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(values));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), scale);
  }
#endif
  typename S::vec v;
  for (int i = 0; i < S::lanes; ++i) v[i] = scale[i] * static_cast<float>(values[i]);
  return v;
}
inline const std::int8_t* q8_0_values(const std::uint8_t* block) {
  return reinterpret_cast<const std::int8_t*>(block + sizeof(std::uint16_t));
}
// Block `block` of a q8_0 row as the kernels widen it: its scale in every lane, widened
// once for all of the block's vectors, and its values; lanes(o): S::lanes of them from
// value o on, d·q (q8_0_lanes).
template <class S>
struct Q8_0BlockLanes {
  typename S::vec scale;
  const std::int8_t* values;
  Q8_0BlockLanes() = default;
  explicit Q8_0BlockLanes(const std::uint8_t* block)
      : scale(S::splat(q8_0_scale(block))), values(q8_0_values(block)) {}
  Q8_0BlockLanes(const Q8_0* row, std::int64_t block) : Q8_0BlockLanes(q8_0_block(row, block)) {}
  typename S::vec lanes(std::int64_t offset) const { return q8_0_lanes<S>(values + offset, scale); }
};

// S::lanes values of a row from value d on (contiguous dims; d a multiple of S::lanes):
// load_vec at row + d, or for a q8_0 row the lanes of block d / 32 widened, d·q. The
// decode kernel reads its cache rows in place through this; convert_row widens whole rows.
template <class S, class E>
typename S::vec load_row_vec(const E* row, std::int64_t d) {
  if constexpr (!std::is_same_v<E, Q8_0>) {
    return load_vec<S>(row + d);
  } else {
    return Q8_0BlockLanes<S>(row, d / kQ8_0BlockValues).lanes(d % kQ8_0BlockValues);
  }
}

// N vectors of load_row_vec from value d on; of a q8_0 row each block's scale widened once,
// not once per vector: whole blocks (d and N lanes a whole number of blocks), or N vectors
// within one block (N a divisor of the block's vectors, d a multiple of N lanes).
// Always inlined: a call per key row in P·V cost the AVX2 q8_0 decode a fifth of its time
// (perf, dev-zen3).
template <class S, int N, class E>
[[gnu::always_inline]] inline void load_row_vecs(const E* row, std::int64_t d, typename S::vec (&out)[N]) {
  constexpr int kPerBlock = static_cast<int>(kQ8_0BlockValues) / S::lanes;
  if constexpr (std::is_same_v<E, Q8_0> && kPerBlock > N && kPerBlock % N == 0) {
    const Q8_0BlockLanes<S> block(row, d / kQ8_0BlockValues);
#pragma GCC unroll 8
    for (int u = 0; u < N; ++u) out[u] = block.lanes(d % kQ8_0BlockValues + u * S::lanes);
  } else if constexpr (std::is_same_v<E, Q8_0> && kPerBlock > 0 && N % kPerBlock == 0) {
#pragma GCC unroll 8
    for (int b = 0; b < N / kPerBlock; ++b) {
      const Q8_0BlockLanes<S> block(row, d / kQ8_0BlockValues + b);
#pragma GCC unroll 8
      for (int u = 0; u < kPerBlock; ++u) out[b * kPerBlock + u] = block.lanes(u * S::lanes);
    }
  } else {
#pragma GCC unroll 8
    for (int u = 0; u < N; ++u) out[u] = load_row_vec<S>(row, d + u * S::lanes);
  }
}

// Value d of a row whose dims are `dim` elements apart (q8_0: contiguous blocks), as float.
template <class E>
float row_value(const E* row, std::int64_t d, std::int64_t dim) {
  if constexpr (std::is_same_v<E, Q8_0>) {
    const std::uint8_t* block = q8_0_block(row, d / kQ8_0BlockValues);
    const auto q = static_cast<std::int8_t>(block[sizeof(std::uint16_t) + d % kQ8_0BlockValues]);
    return q8_0_scale(block) * static_cast<float>(q);
  } else {
    return to_float(row[d * dim]);
  }
}

// Bytes of a row of n contiguous elements of E (q8_0: n / 32 blocks).
template <class E>
std::int64_t row_bytes_of(std::int64_t n) {
  if constexpr (std::is_same_v<E, Q8_0>) return q8_0_row_bytes(n);
  return n * static_cast<std::int64_t>(sizeof(E));
}

// dst[d] = value d of a q8_0 row, d < n (n a multiple of 32; the row's blocks back to back,
// validated: `stride` is 1), a vector of load_row_vec at a time: 16 values (AVX-512), 8
// (AVX2) or 4. d·q is exact in float32 (11 + 8 significant bits), so every unit widens a row
// to the same floats.
inline void convert_row(const Q8_0* src, [[maybe_unused]] std::int64_t stride, std::int64_t n,
                        float* dst) {
#if defined(FATTN_AVX512)
  using S = Simd<64>;
#elif defined(FATTN_AVX)
  using S = Simd<32>;
#else
  using S = Simd<16>;
#endif
  for (std::int64_t d = 0; d < n; d += S::lanes) S::store(dst + d, load_row_vec<S>(src, d));
}

// dst[d] = src[d · stride] as float for d < n; whole vectors where the elements are
// contiguous and the unit has the instructions.
template <class E>
void convert_row(const E* src, std::int64_t stride, std::int64_t n, float* dst) {
  std::int64_t d = 0;
  if constexpr (!std::is_same_v<E, float>) {
    if (stride == 1) {
#if defined(FATTN_AVX512) || defined(FATTN_AVX)
#if defined(FATTN_AVX512)
      using S = Simd<64>;
#else
      using S = Simd<32>;
#endif
      for (; d + S::lanes <= n; d += S::lanes) S::store(dst + d, load_vec<S>(src + d));
#endif
    }
  }
  for (; d < n; ++d) dst[d] = to_float(src[d * stride]);
}

#if defined(FATTN_AVX512)
// dst[0..15] = 16 floats rounded to E (to nearest even; NaN stays a quiet NaN, overflow
// becomes ±inf), as from_float<E> does element by element.
template <class E>
void store_rounded16(__m512 x, E* dst) {
  if constexpr (std::is_same_v<E, float>) {
    _mm512_storeu_ps(dst, x);
  } else if constexpr (std::is_same_v<E, Float16>) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  } else {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi32_epi16(r));
  }
}
#endif

// Calls f with the view retyped to its element type: float, BFloat16 or Float16 (the
// Problem keeps every operand behind a float pointer; a 16-bit view's row() must be
// taken on the retyped view, where the strides count 16-bit elements).
template <class T, class F>
decltype(auto) with_element_type(const detail::Strided<T>& t, DType dtype, F&& f) {
  auto as = [&](auto element) {  // the element type, const where T is
    using E = decltype(element);
    return f(detail::retype<std::conditional_t<std::is_const_v<T>, const E, E>>(t));
  };
  if (dtype == DType::bfloat16) return as(BFloat16{});
  if (dtype == DType::float16) return as(Float16{});
  return as(float{});
}

// with_element_type for K and V, whose dtype may also be q8_0 (a view of Q8_0 bytes).
template <class F>
decltype(auto) with_kv_element_type(const detail::Strided<const float>& t, DType dtype, F&& f) {
  if (dtype == DType::q8_0) return f(detail::retype<const Q8_0>(t));
  return with_element_type(t, dtype, std::forward<F>(f));
}

// Whether a kernel reads an operand's rows where they are: float32 with contiguous dims,
// one sequence's rows `seq` apart (not paged). Any other operand is copied, head by head,
// into float32 rows (copy_head_rows), each row read where it lies.
inline bool rows_in_place(const detail::Strided<const float>& t, DType dtype) {
  return t.dim == 1 && dtype == DType::float32 && !t.paged();
}

// dst[j][d] = t[b][h][j][d] as float for rows [0, n): contiguous dims, rows D apart.
inline void copy_head_rows(const detail::Strided<const float>& t, DType dtype, std::int64_t b,
                           std::int64_t h, std::int64_t n, std::int64_t D, float* dst) {
  with_kv_element_type(t, dtype, [&](const auto& e) {
    for (std::int64_t j = 0; j < n; ++j) convert_row(e.row(b, h, j), e.dim, D, dst + j * D);
  });
}

// dst[d] = t[b][h][s][d] as float, d < D.
template <class T>
void load_row(const detail::Strided<T>& t, DType dtype, std::int64_t b,
                     std::int64_t h, std::int64_t s, std::int64_t D, float* dst) {
  with_element_type(t, dtype, [&](const auto& e) { convert_row(e.row(b, h, s), e.dim, D, dst); });
}

// t[b][h][s][d] = src[d] · factor, rounded to the tensor's dtype, d < D.
inline void store_row(const detail::Strided<float>& t, DType dtype, std::int64_t b,
                      std::int64_t h, std::int64_t s, std::int64_t D, const float* src,
                      float factor = 1.0f) {
  with_element_type(t, dtype, [&](const auto& e) {
    using E = std::remove_reference_t<decltype(*e.data)>;
    E* row = e.row(b, h, s);
    for (std::int64_t d = 0; d < D; ++d) row[d * e.dim] = from_float<E>(src[d] * factor);
  });
}

}  // namespace
}  // namespace fattn::cpu
