// fattn — what the Hopper backward kernels (backward_tma.cuh) receive: the forward's Params
// (q, k, v and their strides, the shapes, the band, the scale) and the gradients' tensors.
// Plain C++: the host plan (backward.cpp) fills it.
#pragma once

#include "cuda/params.hpp"

namespace fattn::cuda {

struct BackwardParams {
  Params p;  // p.out / p.lse are unused: out, lse and dlse are read by the row pass only
  const void* out = nullptr;
  const void* dout = nullptr;
  const float* lse = nullptr;
  const float* dlse = nullptr;  // null: no gradient flows through lse
  Strides3 out_stride, dout_stride, lse_stride, dlse_stride;  // lse, dlse: (batch, head, seq)
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  Strides3 dq_stride, dk_stride, dv_stride;
  bool dq_pairs = false, dk_pairs = false, dv_pairs = false;  // 2-element stores allowed

  // The row pass's output, read by both gradient kernels: per (batch, query head) a row of
  // rows_pad floats (q_len rounded up to whole query tiles of either kernel, so a tile never
  // reads past it):
  //   lse_log2  the forward's logsumexp in log2 units (lse · log2 e); +inf past q_len, where
  //             it makes every probability 0
  //   delta     rowsum(dout ∘ out) − dlse (FlashAttention-2's D); 0 past q_len
  float* lse_log2 = nullptr;
  float* delta = nullptr;
  int rows_pad = 0;

  // With sinks (p.sinks): the row pass writes each row's term of the sink's gradient,
  // −exp(sink − lse)·delta (0 past q_len and where lse is −inf), into sink_terms (laid out as
  // delta); a per-head sum in a fixed order writes dsinks (float32, q_heads).
  float* sink_terms = nullptr;
  float* dsinks = nullptr;
};

}  // namespace fattn::cuda
