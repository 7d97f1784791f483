// fattn-bench — the tensors of one problem: random-normal Q, K, V and an output, in
// float32, bfloat16 or float16.
#pragma once

#include <cstdint>
#include <vector>

#include "fattn/tensor.hpp"
#include "model.hpp"

namespace fattn_bench {

struct Inputs {
  // The values in float32 (rounded to the dtype first): what the float64 reference reads.
  std::vector<float> q, k, v;
  fattn::TensorView q_view, k_view, v_view;  // contiguous (B, H, S, D), float32
  // What the kernels read: the float32 views, or the same values in 16 bits.
  std::vector<std::uint16_t> q16, k16, v16;
  fattn::TensorView q_in, k_in, v_in;
};

// A NaN in bfloat16 and in float16: what 16-bit outputs are poisoned with.
inline constexpr std::uint16_t kNaN16 = 0x7fc0;

// N(0, 1) entries (never zeros) in `dtype`, reproducible from `seed`.
Inputs make_inputs(const Shape& shape, std::uint64_t seed, fattn::DType dtype = fattn::DType::float32);

struct Outputs {
  std::vector<float> out, lse;
  std::vector<std::uint16_t> out16;  // a 16-bit output's storage
  fattn::TensorView out_view, lse_view;
  const fattn::TensorView* lse_or_null = nullptr;  // for attention_forward
  // The output as float32 values (a 16-bit one widened).
  std::vector<float> out_values() const;
};

// An output (B, Hq, Sq, D) in `dtype`, and a logsumexp (B, Hq, Sq) if shape.lse_written.
Outputs make_outputs(const Shape& shape, fattn::DType dtype = fattn::DType::float32);

// Fills out and lse with NaN, so an element a kernel fails to write shows up.
void poison(Outputs& outputs);

}  // namespace fattn_bench
