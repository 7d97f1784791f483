// fattn-bench — the tensors of one problem: random-normal Q, K, V and an output.
#pragma once

#include <cstdint>
#include <vector>

#include "fattn/tensor.hpp"
#include "model.hpp"

namespace fattn_bench {

struct Inputs {
  std::vector<float> q, k, v;
  fattn::TensorView q_view, k_view, v_view;  // contiguous (B, H, S, D)
};

// N(0, 1) entries (never zeros), reproducible from `seed`.
Inputs make_inputs(const Shape& shape, std::uint64_t seed);

struct Outputs {
  std::vector<float> out, lse;
  fattn::TensorView out_view, lse_view;
  const fattn::TensorView* lse_or_null = nullptr;  // for attention_forward
};

// An output (B, Hq, Sq, D), and a logsumexp (B, Hq, Sq) if shape.lse_written.
Outputs make_outputs(const Shape& shape);

// Fills out and lse with quiet NaN, so an element a kernel fails to write shows up.
void poison(Outputs& outputs);

}  // namespace fattn_bench
