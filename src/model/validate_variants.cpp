// fattn — validation of the attention variants (Options: attn_mask, window, softcap,
// alibi_slopes, sinks), and their description in the Problem.
#include <cmath>
#include <sstream>
#include <string>

#include "model/checks.hpp"
#include "model/problem.hpp"

namespace fattn::detail {
namespace {

void expect_window_side(const char* name, std::int64_t value) {
  if (value >= -1) return;
  std::ostringstream m;
  m << name << " must be >= -1 (-1: unbounded), got " << value;
  fail(m.str());
}

// A vector (Hq) or, where batch_allowed, a matrix (B, Hq) of per-head values.
Extent check_per_head(const char* name, const TensorView& t, bool batch_allowed,
                      const Problem& p, DType dtype, Device device) {
  if (t.rank != 1 && !(batch_allowed && t.rank == 2)) {
    std::ostringstream m;
    m << name << " must have rank 1 (query heads)"
      << (batch_allowed ? " or 2 (batch, query heads)" : "") << ", got rank " << t.rank;
    fail(m.str());
  }
  const Extent extent = check_view(name, t, t.rank, dtype, device);
  if (t.rank == 2) expect_size(name, t, 0, "batch", "q.size(0)", p.batch);
  expect_size(name, t, t.rank - 1, "query heads", "q.size(1)", p.q_heads);
  return extent;
}

// An additive mask's dtypes: the 16-bit and float32 ones for any q (a float16 mask with
// float32 queries is ggml's FLASH_ATTN_EXT), float64 for float64 problems too.
bool additive_mask_dtype(DType mask, DType q) {
  return mask == DType::float32 || mask == DType::float16 || mask == DType::bfloat16 ||
         (mask == DType::float64 && q == DType::float64);
}

Extent check_mask(const TensorView& mask, const Problem& p, DType dtype, Device device) {
  if (mask.dtype != DType::boolean && !additive_mask_dtype(mask.dtype, dtype)) {
    std::ostringstream m;
    m << "attn_mask must have dtype bool, float32, float16 or bfloat16"
      << (dtype == DType::float64 ? " or float64" : "") << ", got " << to_string(mask.dtype);
    fail(m.str());
  }
  const Extent extent = check_view("attn_mask", mask, 4, mask.dtype, device);
  const std::int64_t full[4] = {p.batch, p.q_heads, p.q_len, p.kv_len};
  const char* meaning[4] = {"batch", "query heads", "query sequence", "key sequence"};
  const char* source[4] = {"q.size(0)", "q.size(1)", "q.size(2)", "k.size(2)"};
  for (int d = 0; d < 4; ++d)
    if (mask.size(d) != 1 && mask.size(d) != full[d]) {
      std::ostringstream m;
      m << dim_name("attn_mask", d) << " (" << meaning[d] << ") must be 1 (broadcast) or "
        << source[d] << " = " << full[d] << ", got " << mask.size(d);
      fail(m.str());
    }
  return extent;
}

}  // namespace

Dropout checked_dropout(const Options& options) {
  if (!(options.dropout_p >= 0.0 && options.dropout_p < 1.0)) {
    std::ostringstream m;
    m << "dropout_p must be in [0, 1) (0: off), got " << options.dropout_p;
    fail(m.str());
  }
  Dropout d;
  if (options.dropout_p == 0.0) return d;
  d.p = options.dropout_p;
  d.threshold = Dropout::threshold_of(d.p);
  d.scale = static_cast<float>(1.0 / (1.0 - d.p));
  d.seed = options.dropout_seed;
  d.offset = options.dropout_offset;
  return d;
}

VariantExtents check_variants(const Options& options, const TensorView& q, Problem* p) {
  expect_window_side("window_left", options.window_left);
  expect_window_side("window_right", options.window_right);
  if (!(options.softcap >= 0.0) || !std::isfinite(options.softcap)) {
    std::ostringstream m;
    m << "softcap must be finite and > 0 (0: off), got " << options.softcap;
    fail(m.str());
  }
  p->dropout = checked_dropout(options);
  const DType per_head = lse_dtype(q.dtype);  // float32 (float64 for float64 problems)
  VariantExtents extents;
  p->window_left = options.window_left;
  p->window_right = options.window_right;
  p->mods.softcap = options.softcap;
  if (const TensorView* a = options.alibi_slopes) {
    extents.alibi = check_per_head("alibi_slopes", *a, true, *p, per_head, q.device);
    p->mods.alibi = static_cast<const float*>(a->data);
    p->mods.alibi_batch = a->rank == 2 ? a->stride(0) : 0;
    if (a->stride(a->rank - 1) != 1)
      fail("alibi_slopes must have contiguous query heads (stride 1), got stride " +
           std::to_string(a->stride(a->rank - 1)));
  }
  if (const TensorView* s = options.sinks) {
    extents.sinks = check_per_head("sinks", *s, false, *p, per_head, q.device);
    if (s->stride(0) != 1)
      fail("sinks must be contiguous (stride 1), got stride " + std::to_string(s->stride(0)));
    p->mods.sinks = static_cast<const float*>(s->data);
  }
  if (const TensorView* mask = options.attn_mask) {
    extents.mask = check_mask(*mask, *p, q.dtype, q.device);
    ScoreMods& m = p->mods;
    m.mask = mask->data;
    m.mask_dtype = mask->dtype;
    // A broadcast (size-1) dimension is read with stride 0 whatever stride it has.
    auto stride = [&](int d) { return mask->size(d) == 1 ? 0 : mask->stride(d); };
    m.mask_batch = stride(0);
    m.mask_head = stride(1);
    m.mask_seq = stride(2);
    m.mask_key = stride(3);
  }
  if (const TensorView* scale = options.attn_mask_scale) {
    if (!options.attn_mask || options.attn_mask->dtype == DType::boolean)
      fail(std::string("attn_mask_scale scales an additive attn_mask; got ") +
           (options.attn_mask ? "a boolean attn_mask" : "no attn_mask"));
    extents.mask_scale = check_per_head("attn_mask_scale", *scale, false, *p, per_head, q.device);
    if (scale->stride(0) != 1)
      fail("attn_mask_scale must be contiguous (stride 1), got stride " +
           std::to_string(scale->stride(0)));
    // A factor of 0 would turn a hidden pair's −inf into NaN; checked where the host reads.
    if (q.device == Device::cpu)
      for (std::int64_t h = 0; h < p->q_heads; ++h) {
        const double value = per_head == DType::float64
                                 ? static_cast<const double*>(scale->data)[h]
                                 : static_cast<const float*>(scale->data)[h];
        if (!(value > 0.0) || !std::isfinite(value)) {
          std::ostringstream m;
          m << "attn_mask_scale[" << h << "] must be finite and > 0, got " << value;
          fail(m.str());
        }
      }
    p->mods.mask_scale = static_cast<const float*>(scale->data);
  }
  return extents;
}

bool has_variants(const Options& options) {
  return options.attn_mask || options.window_left != -1 || options.window_right != -1 ||
         options.softcap != 0.0 || options.alibi_slopes || options.sinks ||
         options.attn_mask_scale;
}

std::string variant_names(const Options& options) {
  std::string names;
  auto add = [&](bool on, const char* name) {
    if (on) names += (names.empty() ? "" : ", ") + std::string(name);
  };
  add(options.attn_mask != nullptr, "attn_mask");
  add(options.window_left != -1 || options.window_right != -1, "window");
  add(options.softcap != 0.0, "softcap");
  add(options.alibi_slopes != nullptr, "alibi_slopes");
  add(options.sinks != nullptr, "sinks");
  add(options.attn_mask_scale != nullptr, "attn_mask_scale");
  return names;
}

}  // namespace fattn::detail
