// fattn — argument validation: every check runs before any memory is touched.
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "model/checked.hpp"
#include "model/checks.hpp"
#include "model/problem.hpp"

namespace fattn::detail {

void fail(const std::string& message) { throw Error("fattn: " + message); }

std::string dim_name(const char* tensor, int dim) {
  return std::string(tensor) + ".size(" + std::to_string(dim) + ")";
}

Extent check_view(const char* name, const TensorView& t, int rank, DType dtype, Device device) {
  if (t.data == nullptr) fail(std::string(name) + " has a null data pointer");
  if (t.rank != rank) {
    std::ostringstream m;
    m << name << " must have rank " << rank << ", got " << t.rank;
    fail(m.str());
  }
  if (t.device != device) {
    std::ostringstream m;
    m << name << " must be on " << to_string(device) << " like q, got " << to_string(t.device);
    fail(m.str());
  }
  if (t.dtype != dtype) {
    std::ostringstream m;
    m << name << " must have dtype " << to_string(dtype) << ", got " << to_string(t.dtype);
    fail(m.str());
  }
  std::int64_t last_offset = 0;
  for (int d = 0; d < rank; ++d) {
    if (t.size(d) <= 0) {
      std::ostringstream m;
      m << dim_name(name, d) << " must be positive, got " << t.size(d);
      fail(m.str());
    }
    if (t.stride(d) < 0) {
      std::ostringstream m;
      m << name << ".stride(" << d << ") must be non-negative, got " << t.stride(d);
      fail(m.str());
    }
    std::int64_t reach = 0;
    if (!checked_mul(t.size(d) - 1, t.stride(d), &reach) ||
        !checked_add(last_offset, reach, &last_offset))
      fail(std::string(name) + ": sizes times strides overflow 64-bit offsets");
  }
  if (dtype == DType::q8_0) {  // rank 4: its rows are blocks of 34 bytes, strides bytes
    if (t.size(3) % kQ8_0BlockValues != 0) {
      std::ostringstream m;
      m << dim_name(name, 3) << " (head dim) must be a multiple of " << kQ8_0BlockValues
        << " for dtype q8_0, got " << t.size(3);
      fail(m.str());
    }
    if (t.stride(3) != 1) {
      std::ostringstream m;
      m << name << ".stride(3) must be 1 for dtype q8_0 (a row's blocks back to back), got "
        << t.stride(3);
      fail(m.str());
    }
    const std::int64_t row_bytes = q8_0_row_bytes(t.size(3));
    for (int d = 0; d < 3; ++d)  // strides count bytes: a row must not start inside another
      if (t.size(d) > 1 && t.stride(d) != 0 && t.stride(d) < row_bytes) {
        std::ostringstream m;
        m << name << ".stride(" << d << ") must be 0 or at least the " << row_bytes
          << " bytes of a q8_0 row (q8_0 strides count bytes), got " << t.stride(d);
        fail(m.str());
      }
    if (!checked_add(last_offset, row_bytes - t.size(3), &last_offset))  // the row's last byte
      fail(std::string(name) + ": sizes times strides overflow 64-bit offsets");
  }
  std::int64_t elements = 1;
  for (int d = 0; d < rank; ++d)
    if (!checked_mul(elements, t.size(d), &elements))
      fail(std::string(name) + ": the product of its sizes overflows 64 bits");
  std::int64_t bytes = 0;
  if (!checked_add(last_offset, 1, &bytes) || !checked_mul(bytes, element_size(dtype), &bytes))
    fail(std::string(name) + ": its extent in bytes overflows 64 bits");
  const auto first = reinterpret_cast<std::uintptr_t>(t.data);
  if (first + static_cast<std::uintptr_t>(bytes) < first)
    fail(std::string(name) + ": its extent wraps around the address space");
  return {first, first + static_cast<std::uintptr_t>(bytes)};
}

void expect_size(const char* name, const TensorView& t, int dim, const char* meaning,
                 const std::string& source, std::int64_t expected) {
  if (t.size(dim) == expected) return;
  std::ostringstream m;
  m << dim_name(name, dim) << " (" << meaning << ") must equal " << source << " = " << expected
    << ", got " << t.size(dim);
  fail(m.str());
}

DType kv_dtype_of(const TensorView& q, const TensorView& k, const TensorView& v) {
  if (k.dtype != DType::q8_0 && v.dtype != DType::q8_0) return q.dtype;
  if (q.device != Device::cpu)
    fail(std::string("k and v of dtype q8_0 are read by the CPU kernels only; q is on ") +
         to_string(q.device));
  if (q.dtype != DType::float32)
    fail(std::string("q must have dtype float32 with k and v of dtype q8_0, got ") +
         to_string(q.dtype));
  return DType::q8_0;
}

// An output must not have two index tuples at one address: sorted by stride,
// each dimension must step over everything the smaller ones span.
void expect_no_self_overlap(const char* name, const TensorView& t) {
  int order[4] = {0, 1, 2, 3};
  for (int a = 0; a < t.rank; ++a)
    for (int b = a + 1; b < t.rank; ++b)
      if (t.stride(order[b]) < t.stride(order[a])) std::swap(order[a], order[b]);
  std::int64_t span = 1;  // offsets [0, span) are reachable by the smaller dimensions
  for (int n = 0; n < t.rank; ++n) {
    const int d = order[n];
    if (t.dtype == DType::q8_0 && d == 3) {  // a q8_0 row: its bytes, dims contiguous
      span = q8_0_row_bytes(t.size(3));
      continue;
    }
    if (t.size(d) == 1) continue;
    if (t.stride(d) < span) {
      std::ostringstream m;
      m << name << " has overlapping elements (stride(" << d << ") = " << t.stride(d)
        << " is smaller than the " << span << " elements its inner dimensions span)";
      fail(m.str());
    }
    span = t.stride(d) * (t.size(d) - 1) + span;
  }
}

void expect_disjoint(const char* out_name, Extent out, const char* in_name, Extent in) {
  if (out.first < in.last && in.first < out.last)
    fail(std::string(out_name) + " must not overlap " + in_name +
         " (the kernels read inputs while writing outputs)");
}

void expect_head_dim(std::int64_t head_dim) {
  if (head_dim >= kMinHeadDim && head_dim <= kMaxHeadDim) return;
  std::ostringstream m;
  m << "q.size(3) (head dim) must be in [" << kMinHeadDim << ", " << kMaxHeadDim << "], got "
    << head_dim;
  fail(m.str());
}

double checked_scale(const Options& options, std::int64_t head_dim) {
  const double scale =
      options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
  if (!std::isfinite(scale)) {
    std::ostringstream m;
    m << "scale must be finite, got " << scale;
    fail(m.str());
  }
  if (options.num_threads < 0) {
    std::ostringstream m;
    m << "num_threads must be >= 0 (0: all cores), got " << options.num_threads;
    fail(m.str());
  }
  if (options.kv_splits < 0) {
    std::ostringstream m;
    m << "kv_splits must be >= 0 (0: chosen by fattn), got " << options.kv_splits;
    fail(m.str());
  }
  if (options.decode_prefetch_tiles < -1 || options.decode_prefetch_tiles > kMaxDecodePrefetchTiles) {
    std::ostringstream m;
    m << "decode_prefetch_tiles must be -1 (chosen by fattn) or 0 to " << kMaxDecodePrefetchTiles
      << ", got " << options.decode_prefetch_tiles;
    fail(m.str());
  }
  if (options.decode_prefetch_level != -1 &&
      (options.decode_prefetch_level < 1 || options.decode_prefetch_level > kMaxDecodePrefetchLevel)) {
    std::ostringstream m;
    m << "decode_prefetch_level must be -1 (chosen by fattn) or 1 to " << kMaxDecodePrefetchLevel
      << " (the cache level the prefetch fills), got " << options.decode_prefetch_level;
    fail(m.str());
  }
  if (options.runner && !options.runner->run) fail("runner.run must not be null");
  return scale;
}

namespace {

void expect_like(const char* name, const TensorView& t, const char* model_name,
                 const TensorView& model, const char* meaning) {
  for (int d = 0; d < model.rank; ++d)
    expect_size(name, t, d, meaning, dim_name(model_name, d), model.size(d));
}

// Byte ranges of the forward's tensors, as validated (out and lse only when given).
struct ForwardExtents {
  Extent q, k, v, out, lse;
  VariantExtents variants;
};

// make_problem, also handing back the extents it checked (make_backward_problem needs them).
// kv_pages: k and v are a paged cache, whose first dim counts pages, not q's batch.
Problem check_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView* out, const TensorView* lse, const Options& options,
                      ForwardExtents* extents, bool kv_pages = false);

}  // namespace

Problem make_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView* out, const TensorView* lse, const Options& options) {
  ForwardExtents extents;
  return check_forward(q, k, v, out, lse, options, &extents);
}

Problem make_paged_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                           const TensorView* out, const TensorView* lse, const Options& options) {
  ForwardExtents extents;
  return check_forward(q, k, v, out, lse, options, &extents, true);
}

namespace {

Problem check_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView* out, const TensorView* lse, const Options& options,
                      ForwardExtents* extents, bool kv_pages) {
  const DType dtype = q.dtype;
  const Device device = q.device;
  const DType kv_dtype = kv_dtype_of(q, k, v);
  const bool kv_q8_0 = kv_dtype == DType::q8_0;
  const Extent q_extent = extents->q = check_view("q", q, 4, dtype, device);
  const Extent k_extent = extents->k = check_view("k", k, 4, kv_dtype, device);
  const Extent v_extent = extents->v = check_view("v", v, 4, kv_dtype, device);

  if (kv_pages) {
    expect_size("v", v, 0, "pages", "k.size(0)", k.size(0));
  } else {
    expect_size("k", k, 0, "batch", "q.size(0)", q.size(0));
    expect_size("v", v, 0, "batch", "q.size(0)", q.size(0));
  }
  expect_size("v", v, 1, "kv heads", "k.size(1)", k.size(1));
  expect_size("v", v, 2, "kv sequence", "k.size(2)", k.size(2));
  if (q.size(1) % k.size(1) != 0) {
    std::ostringstream m;
    m << "q.size(1) (query heads) must be a multiple of k.size(1) (kv heads) = " << k.size(1)
      << ", got " << q.size(1);
    fail(m.str());
  }
  const std::int64_t head_dim = q.size(3);
  expect_head_dim(head_dim);
  expect_size("k", k, 3, "head dim", "q.size(3)", head_dim);
  expect_size("v", v, 3, "head dim", "q.size(3)", head_dim);

  // out: q's dtype, or float32 for a 16-bit q on the CPU (float32 accumulators, not rounded).
  const bool sixteen_bit = dtype == DType::float16 || dtype == DType::bfloat16;
  const bool out_float32 =
      out && out->dtype == DType::float32 && device == Device::cpu && sixteen_bit;
  if (out && out->dtype != dtype && !out_float32) {
    std::ostringstream m;
    m << "out must have dtype " << to_string(dtype) << (sixteen_bit ? " (or float32 on the CPU)" : "")
      << ", got " << to_string(out->dtype);
    fail(m.str());
  }
  if (out) {
    // out's dtype is checked above (q's, or float32): here its view.
    const Extent out_extent = extents->out = check_view("out", *out, 4, out->dtype, device);
    for (int d = 0; d < 4; ++d) expect_size("out", *out, d, "as q", dim_name("q", d), q.size(d));
    expect_no_self_overlap("out", *out);
    expect_disjoint("out", out_extent, "q", q_extent);
    expect_disjoint("out", out_extent, "k", k_extent);
    expect_disjoint("out", out_extent, "v", v_extent);
    if (lse) {
      const Extent lse_extent = extents->lse = check_view("lse", *lse, 3, lse_dtype(dtype), device);
      expect_size("lse", *lse, 0, "batch", "q.size(0)", q.size(0));
      expect_size("lse", *lse, 1, "query heads", "q.size(1)", q.size(1));
      expect_size("lse", *lse, 2, "query sequence", "q.size(2)", q.size(2));
      expect_no_self_overlap("lse", *lse);
      expect_disjoint("lse", lse_extent, "q", q_extent);
      expect_disjoint("lse", lse_extent, "k", k_extent);
      expect_disjoint("lse", lse_extent, "v", v_extent);
      expect_disjoint("lse", lse_extent, "out", out_extent);
    }
  }

  const double scale = checked_scale(options, head_dim);

  Problem p;
  p.batch = q.size(0);
  p.q_heads = q.size(1);
  p.kv_heads = k.size(1);
  p.q_len = q.size(2);
  p.kv_len = k.size(2);
  p.head_dim = head_dim;
  p.scale = scale;
  p.causal = options.causal;
  p.dtype = dtype;
  p.kv_q8_0 = kv_q8_0;
  p.out_float32 = out_float32;
  const VariantExtents variants = extents->variants = check_variants(options, q, &p);
  p.band_lo = p.band_lo_of(0);  // without a KV cache, every sequence has kv_len keys
  p.band_hi = p.band_hi_of(0);
  const char* names[4] = {"attn_mask", "alibi_slopes", "sinks", "attn_mask_scale"};
  const Extent inputs[4] = {variants.mask, variants.alibi, variants.sinks, variants.mask_scale};
  for (int i = 0; i < 4; ++i) {
    if (out) expect_disjoint("out", extents->out, names[i], inputs[i]);
    if (lse) expect_disjoint("lse", extents->lse, names[i], inputs[i]);
  }
  p.q = strided(static_cast<const float*>(q.data), q);
  p.k = strided(static_cast<const float*>(k.data), k);
  p.v = strided(static_cast<const float*>(v.data), v);
  if (out) p.out = strided(static_cast<float*>(out->data), *out);
  if (lse) p.lse = strided(static_cast<float*>(lse->data), *lse);
  return p;
}

}  // namespace

void expect_no_q8_0_cache(const char* entry, const char* note, const TensorView& q,
                          const TensorView& k, const TensorView& v) {
  if (k.dtype != DType::q8_0 && v.dtype != DType::q8_0) return;
  fail(std::string(entry) + " takes k and v of q's dtype " + to_string(q.dtype) + ", got " +
       to_string(k.dtype) + " / " + to_string(v.dtype) + " (" + note + ")");
}

Problem make_backward_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const TensorView& dout,
                              const TensorView& lse, const TensorView* dlse,
                              const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const Options& options, const TensorView* dsinks) {
  if (out.dtype != q.dtype)
    fail(std::string("out (the forward's output) must have q's dtype ") + to_string(q.dtype) +
         " in the backward, got " + to_string(out.dtype));
  expect_no_q8_0_cache("the backward", "q8_0 is a forward-only cache format", q, k, v);
  ForwardExtents seen;
  Problem p = check_forward(q, k, v, &out, &lse, options, &seen);
  const DType dtype = q.dtype;
  const Device device = q.device;
  struct Named {
    const char* name;
    const TensorView* view;
    Extent extent;
  };
  Named inputs[11] = {{"q", &q, seen.q},
                     {"k", &k, seen.k},
                     {"v", &v, seen.v},
                     {"out", &out, seen.out},
                     {"dout", &dout, check_view("dout", dout, 4, dtype, device)},
                     {"lse", &lse, seen.lse},
                     {}};
  expect_like("dout", dout, "q", q, "as q");
  int n_inputs = 6;
  if (dlse) {
    inputs[n_inputs++] = {"dlse", dlse, check_view("dlse", *dlse, 3, lse_dtype(dtype), device)};
    expect_like("dlse", *dlse, "lse", lse, "as lse");
  }
  if (options.attn_mask) inputs[n_inputs++] = {"attn_mask", options.attn_mask, seen.variants.mask};
  if (options.alibi_slopes)
    inputs[n_inputs++] = {"alibi_slopes", options.alibi_slopes, seen.variants.alibi};
  if (options.sinks) inputs[n_inputs++] = {"sinks", options.sinks, seen.variants.sinks};
  if (options.attn_mask_scale)
    inputs[n_inputs++] = {"attn_mask_scale", options.attn_mask_scale, seen.variants.mask_scale};
  Named outputs[3] = {{"dq", &dq, check_view("dq", dq, 4, dtype, device)},
                      {"dk", &dk, check_view("dk", dk, 4, dtype, device)},
                      {"dv", &dv, check_view("dv", dv, 4, dtype, device)}};
  expect_like("dq", dq, "q", q, "as q");
  expect_like("dk", dk, "k", k, "as k");
  expect_like("dv", dv, "v", v, "as v");
  for (int o = 0; o < 3; ++o) {
    expect_no_self_overlap(outputs[o].name, *outputs[o].view);
    for (int i = 0; i < n_inputs; ++i)
      expect_disjoint(outputs[o].name, outputs[o].extent, inputs[i].name, inputs[i].extent);
    for (int other = 0; other < o; ++other)
      expect_disjoint(outputs[o].name, outputs[o].extent, outputs[other].name,
                      outputs[other].extent);
  }
  if (options.sinks && !dsinks) fail("dsinks (the sinks' gradient) must be given with sinks");
  if (dsinks && !options.sinks) fail("dsinks is given, but options.sinks is not set");
  if (dsinks) {
    const Extent dsinks_extent = check_view("dsinks", *dsinks, 1, lse_dtype(dtype), device);
    expect_like("dsinks", *dsinks, "sinks", *options.sinks, "as sinks");
    if (dsinks->stride(0) != 1)
      fail("dsinks must be contiguous (stride 1), got stride " + std::to_string(dsinks->stride(0)));
    for (int i = 0; i < n_inputs; ++i)
      expect_disjoint("dsinks", dsinks_extent, inputs[i].name, inputs[i].extent);
    for (int o = 0; o < 3; ++o)
      expect_disjoint("dsinks", dsinks_extent, outputs[o].name, outputs[o].extent);
    p.dsinks = static_cast<float*>(dsinks->data);
  }
  p.dout = strided(static_cast<const float*>(dout.data), dout);
  if (dlse) p.dlse = strided(static_cast<const float*>(dlse->data), *dlse);
  p.dq = strided(static_cast<float*>(dq.data), dq);
  p.dk = strided(static_cast<float*>(dk.data), dk);
  p.dv = strided(static_cast<float*>(dv.data), dv);
  return p;
}

}  // namespace fattn::detail
