// fattn — the attention variants of torch.ops.<ns>.attention(_backward) as fattn::Options:
// attn_mask, window_left/right, softcap, alibi_slopes, sinks (fattn/attention.hpp has their
// semantics; the library checks every size, dtype and value and names what is wrong).
#pragma once

#include <torch/extension.h>

#include <optional>

#include "fattn/attention.hpp"
#include "torch_views.hpp"

namespace fattn_torch {

// The views the options point at, and the 4-D mask they read (a mask of fewer dimensions
// gets leading size-1 dimensions: torch's broadcasting, as views, no copy).
struct Variants {
  at::Tensor mask;
  fattn::TensorView mask_view, alibi_view, sinks_view;

  Variants(at::ScalarType q_type, const std::optional<at::Tensor>& attn_mask,
           std::int64_t window_left, std::int64_t window_right, double softcap,
           const std::optional<at::Tensor>& alibi, const std::optional<at::Tensor>& sinks,
           fattn::Options* options) {
    options->window_left = window_left;
    options->window_right = window_right;
    options->softcap = softcap;
    if (attn_mask) {
      mask = *attn_mask;
      TORCH_CHECK(mask.dim() <= 4, "fattn: attn_mask must have at most 4 dimensions "
                  "(batch, heads, query, key), got ", mask.dim(), " with shape ", mask.sizes());
      while (mask.dim() < 4) mask = mask.unsqueeze(0);
      // torch SDPA's rule, which the library widens (any float mask, for ggml's float16
      // masks over float32 queries): the torch operators keep torch's.
      const auto type = mask.scalar_type();
      TORCH_CHECK(type == at::kBool || type == q_type,
                  "fattn: attn_mask must have dtype bool or q's dtype ", dtype_name(q_type),
                  ", got ", dtype_name(type));
      mask_view = view_of(mask, "attn_mask",
                          type == at::kBool ? std::optional(fattn::DType::boolean) : std::nullopt);
      options->attn_mask = &mask_view;
    }
    if (alibi) {
      alibi_view = view_of(*alibi, "alibi_slopes");
      options->alibi_slopes = &alibi_view;
    }
    if (sinks) {
      sinks_view = view_of(*sinks, "sinks");
      options->sinks = &sinks_view;
    }
  }
  Variants(const Variants&) = delete;
  Variants& operator=(const Variants&) = delete;
};

// Attention dropout (fattn/attention.hpp, Options::dropout_p): the probability, and the
// stream's seed (a one-element int64 tensor the Python wrappers draw from torch's generator,
// so that torch.compile traces the draw) and offset (within [0, 2^32)).
inline void set_dropout(double p, const std::optional<at::Tensor>& seed, std::int64_t offset,
                        fattn::Options* options) {
  TORCH_CHECK(offset >= 0 && offset <= 0xffffffffLL,
              "fattn: dropout_offset must be in [0, 2^32), got ", offset);
  options->dropout_p = p;
  options->dropout_offset = static_cast<std::uint32_t>(offset);
  if (p == 0.0) return;
  TORCH_CHECK(seed.has_value(), "fattn: dropout_p = ", p, " needs dropout_seed (a one-element "
              "int64 tensor)");
  TORCH_CHECK(seed->scalar_type() == at::kLong && seed->numel() == 1,
              "fattn: dropout_seed must be a one-element int64 tensor, got ",
              dtype_name(seed->scalar_type()), " with shape ", seed->sizes());
  options->dropout_seed = static_cast<std::uint64_t>(seed->item<std::int64_t>());
}

}  // namespace fattn_torch
