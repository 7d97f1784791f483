// fattn — the argument checks that every entry point's validation is built from. Each
// throws fattn::Error naming the argument, the expected and the actual value.
#pragma once

#include <cstdint>
#include <string>

#include "fattn/attention.hpp"
#include "model/problem.hpp"

namespace fattn::detail {

using fattn::kMaxHeadDim;  // attention.hpp's head-dim range
using fattn::kMinHeadDim;

// Byte range [first, last) a view can touch.
struct Extent {
  std::uintptr_t first, last;
};

[[noreturn]] void fail(const std::string& message);  // throws Error("fattn: " + message)
std::string dim_name(const char* tensor, int dim);    // "q.size(2)"

// Non-null, of this rank, dtype and device, positive sizes, non-negative strides, and
// an extent that fits 64-bit offsets; returns the extent.
Extent check_view(const char* name, const TensorView& t, int rank, DType dtype, Device device);
void expect_size(const char* name, const TensorView& t, int dim, const char* meaning,
                 const std::string& source, std::int64_t expected);
// An output must not have two index tuples at one address.
void expect_no_self_overlap(const char* name, const TensorView& t);
// K and V's dtype: q's, or q8_0 for a CPU call with float32 q (where only one of them is q8_0,
// the other's check_view against it says so).
DType kv_dtype_of(const TensorView& q, const TensorView& k, const TensorView& v);
void expect_disjoint(const char* out_name, Extent out, const char* in_name, Extent in);
void expect_head_dim(std::int64_t head_dim);  // q.size(3) in [kMinHeadDim, kMaxHeadDim]
// The scale (default 1/sqrt(D)), checked finite, and the thread options.
double checked_scale(const Options& options, std::int64_t head_dim);

// The variants (Options: attn_mask, window, softcap, alibi_slopes, sinks), checked and
// written into p (validate_variants.cpp); their byte ranges, {0, 0} where absent.
struct VariantExtents {
  Extent mask{0, 0}, alibi{0, 0}, sinks{0, 0}, mask_scale{0, 0};
};
VariantExtents check_variants(const Options& options, const TensorView& q, Problem* p);
bool has_variants(const Options& options);
// Options' dropout_p (checked in [0, 1)), its threshold and scale, and the stream.
Dropout checked_dropout(const Options& options);
std::string variant_names(const Options& options);  // "attn_mask, softcap": those set

inline DType lse_dtype(DType dtype) {
  return dtype == DType::float64 ? DType::float64 : DType::float32;
}

template <class T>
Strided<T> strided(T* data, const TensorView& t) {
  return {data, t.stride(0), t.stride(1), t.stride(2), t.rank == 4 ? t.stride(3) : 0};
}

}  // namespace fattn::detail
