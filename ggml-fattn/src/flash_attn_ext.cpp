// ggml-fattn — GGML_OP_FLASH_ATTN_EXT on fattn's CPU kernels (flash_attn_ext.hpp).
#include "flash_attn_ext.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "fattn/attention.hpp"
#include "ggml.h"
#include "mask_band.hpp"

namespace ggml_fattn {
namespace {

// The op params ggml_flash_attn_ext and its setters write (ggml.c).
struct Params {
  float scale, max_bias, softcap;
  std::int32_t n_kv_max;
};
Params params_of(const ggml_tensor* op) {
  Params p{};
  std::memcpy(&p.scale, op->op_params + 0, sizeof(float));
  std::memcpy(&p.max_bias, op->op_params + 1, sizeof(float));
  std::memcpy(&p.softcap, op->op_params + 2, sizeof(float));
  std::memcpy(&p.n_kv_max, op->op_params + 4, sizeof(std::int32_t));
  return p;
}

std::int64_t elements(std::size_t bytes, const ggml_tensor* t) {
  return static_cast<std::int64_t>(bytes / ggml_type_size(t->type));
}

fattn::DType dtype_of(ggml_type type) {
  switch (type) {
    case GGML_TYPE_F16: return fattn::DType::float16;
    case GGML_TYPE_BF16: return fattn::DType::bfloat16;
    case GGML_TYPE_Q8_0: return fattn::DType::q8_0;
    default: return fattn::DType::float32;
  }
}

bool cache_type(ggml_type type) {
  return type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16 ||
         type == GGML_TYPE_Q8_0;
}

// A view's stride in fattn's units: elements, or bytes for q8_0 (fattn/tensor.hpp).
std::int64_t stride_of(std::size_t bytes, const ggml_tensor* t) {
  return t->type == GGML_TYPE_Q8_0 ? static_cast<std::int64_t>(bytes) : elements(bytes, t);
}

// Rows contiguous and every stride a whole number of elements: a fattn view reads it.
bool viewable(const ggml_tensor* t) {
  const std::size_t e = ggml_type_size(t->type);
  if (t->nb[0] != e) return false;
  for (int d = 1; d < 4; ++d)
    if (t->nb[d] % e != 0) return false;
  return true;
}

// ggml's ALiBi slope of head h (ggml-cpu's formula, in float as it computes it).
float alibi_slope(float max_bias, std::uint32_t n_head, std::uint32_t h) {
  const std::uint32_t n_head_log2 = 1u << static_cast<std::uint32_t>(std::floor(std::log2(n_head)));
  const float m0 = std::pow(2.0f, -max_bias / static_cast<float>(n_head_log2));
  const float m1 = std::pow(2.0f, -(max_bias / 2.0f) / static_cast<float>(n_head_log2));
  return h < n_head_log2 ? std::pow(m0, static_cast<float>(h + 1))
                         : std::pow(m1, static_cast<float>(2 * (h - n_head_log2) + 1));
}

}  // namespace

std::string refusal(const ggml_tensor* op) {
  const ggml_tensor *q = op->src[0], *k = op->src[1], *v = op->src[2], *mask = op->src[3],
                    *sinks = op->src[4];
  std::ostringstream why;
  const Params p = params_of(op);
  if (q->type != GGML_TYPE_F32) why << "q is " << ggml_type_name(q->type) << ", not f32";
  else if (!cache_type(k->type) || k->type != v->type)
    why << "K/V types " << ggml_type_name(k->type) << "/" << ggml_type_name(v->type)
        << " (fattn: f32, f16, bf16 or q8_0, one for both)";
  else if (k->ne[0] != v->ne[0] || q->ne[0] != k->ne[0])
    why << "head dims K " << k->ne[0] << ", V " << v->ne[0] << " differ";
  else if (q->ne[0] < fattn::kMinHeadDim || q->ne[0] > fattn::kMaxHeadDim)
    why << "head dim " << q->ne[0] << " outside [" << fattn::kMinHeadDim << ", "
        << fattn::kMaxHeadDim << "]";
  else if (op->type != GGML_TYPE_F32 || op->nb[0] != sizeof(float))
    why << "output not f32 with contiguous rows";
  else if (!viewable(q) || !viewable(k) || !viewable(v) || !viewable(op))
    why << "a stride that is not a whole number of elements";
  else if (k->ne[1] != v->ne[1] || k->ne[2] != v->ne[2] || q->ne[3] != k->ne[3] ||
           q->ne[3] != v->ne[3] || k->ne[2] == 0 || q->ne[2] % k->ne[2] != 0)
    why << "shapes ggml's kernel broadcasts another way";
  else if (p.n_kv_max != 0)
    why << "a sparse mask (n_kv_max " << p.n_kv_max << ")";
  else if (!std::isfinite(p.scale) || !std::isfinite(p.softcap) || p.softcap < 0.0f ||
           !std::isfinite(p.max_bias) || p.max_bias < 0.0f)
    why << "op params scale " << p.scale << ", softcap " << p.softcap << ", max_bias " << p.max_bias;
  else if (p.max_bias > 0.0f && !mask)
    why << "ALiBi without a mask";
  else if (mask && (mask->type != GGML_TYPE_F16 || !ggml_is_contiguous(mask) ||
                    mask->ne[0] < k->ne[1] || mask->ne[1] < q->ne[1] ||
                    (mask->ne[2] != 1 && mask->ne[2] != q->ne[2]) || mask->ne[3] == 0 ||
                    q->ne[3] % mask->ne[3] != 0))
    why << "a mask that is not contiguous f16 broadcasting over all heads or none";
  else if (sinks && (sinks->type != GGML_TYPE_F32 || sinks->ne[0] != q->ne[2] ||
                     !ggml_is_contiguous(sinks)))
    why << "sinks that are not f32 [" << q->ne[2] << "]";
  return why.str();
}

namespace {

// Mask slice `slice` (of the mask's last dim) as float16 elements.
const std::uint16_t* mask_slice(const ggml_tensor* mask, std::int64_t slice) {
  return reinterpret_cast<const std::uint16_t*>(static_cast<const char*>(mask->data) +
                                                slice * mask->nb[3]);
}

// What each slice of the mask says (mask_band.hpp), read once per slice whatever the batch
// it broadcasts over; a slice per head gives the union of the heads' keys and no band.
std::vector<MaskBand> read_masks(const ggml_tensor* mask, std::int64_t n_q, std::int64_t n_kv) {
  const std::int64_t row_stride = elements(mask->nb[1], mask),
                     head_stride = elements(mask->nb[2], mask);
  std::vector<MaskBand> bands(static_cast<std::size_t>(mask->ne[3]));
  for (std::int64_t slice = 0; slice < mask->ne[3]; ++slice) {
    const std::uint16_t* rows = mask_slice(mask, slice);
    MaskBand& band = bands[static_cast<std::size_t>(slice)];
    band = read_mask(rows, n_q, n_kv, row_stride);
    for (std::int64_t h = 1; h < mask->ne[2]; ++h) {
      const MaskBand other = read_mask(rows + h * head_stride, n_q, n_kv, row_stride);
      band.first = std::min(band.first, other.first);
      band.end = std::max(band.end, other.end);
      band.is_band = false;
    }
  }
  return bands;
}

// Sequence b's queries as fattn reads them: in place (float32 and q8_0 caches), or rounded
// to the cache's 16-bit type into `rounded` as ggml's kernel rounds them (to nearest even).
// (ggml quantizes the queries to q8_0 for a q8_0 cache's integer dot products; fattn
// multiplies them in float32 with the widened cache: closer to the exact scores.)
fattn::TensorView queries(const ggml_tensor* q, ggml_type cache, std::int64_t b,
                          std::vector<std::uint16_t>& rounded) {
  const std::int64_t D = q->ne[0], n_q = q->ne[1], Hq = q->ne[2];
  const char* base = static_cast<const char*>(q->data) + b * q->nb[3];
  const fattn::DType dtype =
      cache == GGML_TYPE_Q8_0 ? fattn::DType::float32 : dtype_of(cache);
  if (dtype == fattn::DType::float32)
    return {const_cast<char*>(base), 4, {1, Hq, n_q, D},
            {0, elements(q->nb[2], q), elements(q->nb[1], q), 1}, dtype};
  // ggml-base's row conversions, which round as the CPU backend's from_float (ggml-cpu is a
  // module to load, not a library to link, in GGML_BACKEND_DL builds).
  rounded.resize(static_cast<std::size_t>(n_q * Hq * D));
  for (std::int64_t i = 0; i < n_q; ++i)
    for (std::int64_t h = 0; h < Hq; ++h) {
      const auto* row = reinterpret_cast<const float*>(base + i * q->nb[1] + h * q->nb[2]);
      std::uint16_t* to = rounded.data() + (i * Hq + h) * D;
      if (cache == GGML_TYPE_BF16)
        ggml_fp32_to_bf16_row(row, reinterpret_cast<ggml_bf16_t*>(to), D);
      else
        ggml_fp32_to_fp16_row(row, reinterpret_cast<ggml_fp16_t*>(to), D);
    }
  return {rounded.data(), 4, {1, Hq, n_q, D}, {0, D, Hq * D, 1}, dtype};
}

// Keys [first, first + kept) of sequence b of a K or V cache view.
fattn::TensorView cache_keys(const ggml_tensor* t, std::int64_t b, std::int64_t first,
                             std::int64_t kept) {
  char* data = static_cast<char*>(t->data) + b * t->nb[3] + first * t->nb[1];
  return {data, 4, {1, t->ne[2], kept, t->ne[0]},
          {0, stride_of(t->nb[2], t), stride_of(t->nb[1], t), 1}, dtype_of(t->type)};
}

// Sequence b's output rows, all 0: no row sees a key.
void zero_rows(const ggml_tensor* op, std::int64_t b) {
  char* base = static_cast<char*>(op->data) + b * op->nb[3];
  for (std::int64_t i = 0; i < op->ne[2]; ++i)
    for (std::int64_t h = 0; h < op->ne[1]; ++h)
      std::memset(base + i * op->nb[2] + h * op->nb[1], 0,
                  static_cast<std::size_t>(op->ne[0]) * sizeof(float));
}

}  // namespace

void compute(const ggml_tensor* op, int n_threads, Scratch& scratch) {
  const ggml_tensor *q = op->src[0], *k = op->src[1], *v = op->src[2], *mask = op->src[3],
                    *sinks = op->src[4];
  const Params p = params_of(op);
  const std::int64_t D = q->ne[0], n_q = q->ne[1], Hq = q->ne[2], n_kv = k->ne[1];

  fattn::Options options;
  options.scale = static_cast<double>(p.scale);
  options.softcap = static_cast<double>(p.softcap);
  options.num_threads = n_threads;
  // bfloat16 caches: float32 FMAs on the widened elements, P kept in float32, as ggml's
  // kernel computes (vdpbf16ps rounds P to bfloat16 for P·V: a 1e-3 error where ggml's is
  // 1e-6, ggml-fattn/tests/test_backend.cpp).
  options.bf16_products = fattn::Bf16Products::fma;
  fattn::TensorView sinks_view, slopes_view, mask_view;
  if (sinks) {
    sinks_view = {sinks->data, 1, {Hq, 0, 0, 0}, {1, 0, 0, 0}, fattn::DType::float32};
    options.sinks = &sinks_view;
  }
  if (p.max_bias > 0.0f) {
    scratch.slopes.resize(static_cast<std::size_t>(Hq));
    for (std::int64_t h = 0; h < Hq; ++h)
      scratch.slopes[static_cast<std::size_t>(h)] =
          alibi_slope(p.max_bias, static_cast<std::uint32_t>(Hq), static_cast<std::uint32_t>(h));
    slopes_view = {scratch.slopes.data(), 1, {Hq, 0, 0, 0}, {1, 0, 0, 0}, fattn::DType::float32};
  }
  const std::vector<MaskBand> bands = mask ? read_masks(mask, n_q, n_kv) : std::vector<MaskBand>{};

  for (std::int64_t b = 0; b < q->ne[3]; ++b) {
    // The keys some row sees, and the band they form.
    const std::int64_t slice = mask ? b % mask->ne[3] : 0;
    const MaskBand band = mask ? bands[static_cast<std::size_t>(slice)] : MaskBand{0, n_kv, false, -1};
    if (band.end <= band.first) {
      zero_rows(op, b);
      continue;
    }
    const std::int64_t kept = band.end - band.first;
    const fattn::TensorView out{static_cast<char*>(op->data) + b * op->nb[3], 4, {1, Hq, n_q, D},
                                {0, elements(op->nb[1], op), elements(op->nb[2], op), 1},
                                fattn::DType::float32};
    fattn::Options call = options;
    if (band.is_band) {
      call.causal = fattn::Causal::bottom_right;
      call.window_left = band.window_left;
    } else if (mask) {
      mask_view = {const_cast<std::uint16_t*>(mask_slice(mask, slice)) + band.first, 4,
                   {1, mask->ne[2], n_q, kept},
                   {0, elements(mask->nb[2], mask), elements(mask->nb[1], mask), 1},
                   fattn::DType::float16};
      call.attn_mask = &mask_view;
      if (p.max_bias > 0.0f) call.attn_mask_scale = &slopes_view;
    }
    fattn::attention_forward(queries(q, k->type, b, scratch.queries),
                             cache_keys(k, b, band.first, kept), cache_keys(v, b, band.first, kept),
                             out, nullptr, call);
  }
}

}  // namespace ggml_fattn
