// ggml-fattn — GGML_OP_FLASH_ATTN_EXT on fattn's CPU kernels.
//
// The op's contract (ggml.h, ggml_flash_attn_ext; ggml-cpu's kernel is its reference):
//   q [D, n_q, Hq, B] float32   k, v [D, n_kv, Hkv, B] (rows contiguous, any strides)
//   mask [n_kv, ≥ n_q, 1 or Hq, B or a divisor] float16, additive, contiguous (optional)
//   sinks [Hq] float32 (optional)   out [D, Hq, n_q, B] float32
//   op params: scale, max_bias (ALiBi: head h adds slope(h) · mask), logit_softcap,
//   precision, n_kv_max (a sparse mask; not taken)
// fattn takes it where K and V share one of float32, float16 and bfloat16 with equal head
// dims in fattn's range, the mask broadcasts over heads or has one slice per head, and the
// tensors are where the host reads them (supports). The queries are rounded to the cache's
// 16-bit type as ggml's kernel rounds them; the output is written in float32 from float32
// accumulators.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ggml.h"

namespace ggml_fattn {

// Why fattn does not take `op` (a FLASH_ATTN_EXT node); empty: it does.
std::string refusal(const ggml_tensor* op);

// Reusable host memory of one backend (the 16-bit queries, the ALiBi slopes).
struct Scratch {
  std::vector<std::uint16_t> queries;
  std::vector<float> slopes;
};

// Runs op (one refusal() left empty) with fattn on n_threads threads; throws fattn::Error
// if fattn's own checks refuse the call.
void compute(const ggml_tensor* op, int n_threads, Scratch& scratch);

}  // namespace ggml_fattn
