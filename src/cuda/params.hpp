// fattn — what every CUDA kernel receives: one problem, raw pointers, element strides.
//
// The plan (plan.cpp, make_params) fills this from the validated detail::Problem. Data
// pointers are untyped here: the kernels are templates on the element type. Every
// row of head_dim elements is contiguous (the dispatcher checks stride(3) == 1), so
// only the batch, head and sequence strides are kept.
#pragma once

#include <cstdint>

namespace fattn::cuda {

struct Strides3 {
  std::int64_t batch = 0, head = 0, seq = 0;  // in elements
};

struct Params {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  // null: no logsumexp asked for
  Strides3 q_stride, k_stride, v_stride, out_stride, lse_stride;  // lse: (batch, head, seq)

  int batch = 0, q_heads = 0, kv_heads = 0;
  int group = 1;  // q_heads / kv_heads: query heads sharing one kv head (GQA)
  int q_len = 0, kv_len = 0;
  int head_dim = 0;  // the real head dim; kernels compiled for a larger one zero-pad

  // The band's upper edge (the lower one and the variants are below: the fields before them
  // keep their places, so the kernels that do not read them keep their machine code).
  bool has_band_hi = false;
  int band_hi = 0;

  double scale = 0.0;       // softmax scale (natural units; the float64 reference uses it)
  float scale_log2 = 0.0f;  // scale · log2(e): scores are kept in log2 units
  bool out_pairs = false;   // out allows 2-element vector stores (alignment, even strides)

  // The band of visible diagonals (model/problem.hpp's band_lo/band_hi; cuda/band.hpp sets
  // it): key j < kv_len is visible to query i iff band_lo <= j - i (where has_band_lo) and
  // j - i <= band_hi (where has_band_hi). The upper edge is the causal limit (either
  // alignment) or a right window, the lower one a left window. visibility.cuh asks every
  // question about it.
  bool has_band_lo = false;
  int band_lo = 0;

  // What changes the scores beyond Q·Kᵀ·scale (score_mods.cuh; the CPU's detail::ScoreMods):
  float softcap = 0.0f;           // 0: off; else s ← softcap·tanh(s / softcap)
  const float* alibi = nullptr;   // slope of (b, h) at alibi[b·alibi_batch + h]; s ← s − slope·|i + kv_len − q_len − j|
  std::int64_t alibi_batch = 0;   // 0 for (q_heads) slopes
  const float* sinks = nullptr;   // [q_heads] logits (natural units) in every row's denominator
  // A lower band edge or any score change: the kernels that take them run their variant
  // instantiation (kernels.hpp's takes_variants), the others are never planned for it.
  bool variants = false;
};

}  // namespace fattn::cuda
