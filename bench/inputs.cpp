// fattn-bench — random-normal inputs and NaN-poisoned outputs (see inputs.hpp).
#include "inputs.hpp"

#include <algorithm>
#include <limits>
#include <random>

namespace fattn_bench {
namespace {

std::vector<float> random_normal(std::int64_t count, std::mt19937_64& engine) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<std::size_t>(count));
  for (float& x : values) x = normal(engine);
  return values;
}

// values rounded to dtype in place, and their 16-bit bits (float32: nothing).
std::vector<std::uint16_t> round_to(std::vector<float>& values, fattn::DType dtype) {
  std::vector<std::uint16_t> bits;
  if (dtype == fattn::DType::float32) return bits;
  bits.reserve(values.size());
  for (float& x : values) {
    bits.push_back(fattn::to_16bit(x, dtype));
    x = fattn::from_16bit(bits.back(), dtype);
  }
  return bits;
}

fattn::TensorView bhsd(std::vector<float>& values, std::vector<std::uint16_t>& bits, std::int64_t b,
                       std::int64_t h, std::int64_t s, std::int64_t d, fattn::DType dtype) {
  if (dtype == fattn::DType::float32) return fattn::TensorView::bhsd(values.data(), b, h, s, d);
  return fattn::TensorView::bhsd(bits.data(), b, h, s, d, dtype);
}

}  // namespace

Inputs make_inputs(const Shape& s, std::uint64_t seed, fattn::DType dtype) {
  std::mt19937_64 engine(seed);
  Inputs in;
  in.q = random_normal(s.batch * s.q_heads * s.q_len * s.head_dim, engine);
  in.k = random_normal(s.batch * s.kv_heads * s.kv_len * s.head_dim, engine);
  in.v = random_normal(s.batch * s.kv_heads * s.kv_len * s.head_dim, engine);
  in.q16 = round_to(in.q, dtype);
  in.k16 = round_to(in.k, dtype);
  in.v16 = round_to(in.v, dtype);
  in.q_view = fattn::TensorView::bhsd(in.q.data(), s.batch, s.q_heads, s.q_len, s.head_dim);
  in.k_view = fattn::TensorView::bhsd(in.k.data(), s.batch, s.kv_heads, s.kv_len, s.head_dim);
  in.v_view = fattn::TensorView::bhsd(in.v.data(), s.batch, s.kv_heads, s.kv_len, s.head_dim);
  in.q_in = bhsd(in.q, in.q16, s.batch, s.q_heads, s.q_len, s.head_dim, dtype);
  in.k_in = bhsd(in.k, in.k16, s.batch, s.kv_heads, s.kv_len, s.head_dim, dtype);
  in.v_in = bhsd(in.v, in.v16, s.batch, s.kv_heads, s.kv_len, s.head_dim, dtype);
  return in;
}

Outputs make_outputs(const Shape& s, fattn::DType dtype) {
  Outputs o;
  const auto elements = static_cast<std::size_t>(s.batch * s.q_heads * s.q_len * s.head_dim);
  if (dtype == fattn::DType::float32) {
    o.out.resize(elements);
    o.out_view = fattn::TensorView::bhsd(o.out.data(), s.batch, s.q_heads, s.q_len, s.head_dim);
  } else {
    o.out16.resize(elements);
    o.out_view = fattn::TensorView::bhsd(o.out16.data(), s.batch, s.q_heads, s.q_len, s.head_dim, dtype);
  }
  if (s.lse_written) {
    o.lse.resize(static_cast<std::size_t>(s.batch * s.q_heads * s.q_len));
    o.lse_view = fattn::TensorView::lse(o.lse.data(), s.batch, s.q_heads, s.q_len);
    o.lse_or_null = &o.lse_view;
  }
  return o;
}

std::vector<float> Outputs::out_values() const {
  if (out_view.dtype == fattn::DType::float32) return out;
  std::vector<float> values(out16.size());
  for (std::size_t e = 0; e < out16.size(); ++e) values[e] = fattn::from_16bit(out16[e], out_view.dtype);
  return values;
}

void poison(Outputs& outputs) {
  constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();
  std::fill(outputs.out.begin(), outputs.out.end(), kPoison);
  std::fill(outputs.out16.begin(), outputs.out16.end(), kNaN16);
  std::fill(outputs.lse.begin(), outputs.lse.end(), kPoison);
}

}  // namespace fattn_bench
