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

}  // namespace

Inputs make_inputs(const Shape& s, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  Inputs in;
  in.q = random_normal(s.batch * s.q_heads * s.q_len * s.head_dim, engine);
  in.k = random_normal(s.batch * s.kv_heads * s.kv_len * s.head_dim, engine);
  in.v = random_normal(s.batch * s.kv_heads * s.kv_len * s.head_dim, engine);
  in.q_view = fattn::TensorView::bhsd(in.q.data(), s.batch, s.q_heads, s.q_len, s.head_dim);
  in.k_view = fattn::TensorView::bhsd(in.k.data(), s.batch, s.kv_heads, s.kv_len, s.head_dim);
  in.v_view = fattn::TensorView::bhsd(in.v.data(), s.batch, s.kv_heads, s.kv_len, s.head_dim);
  return in;
}

Outputs make_outputs(const Shape& s) {
  Outputs o;
  o.out.resize(static_cast<std::size_t>(s.batch * s.q_heads * s.q_len * s.head_dim));
  o.out_view = fattn::TensorView::bhsd(o.out.data(), s.batch, s.q_heads, s.q_len, s.head_dim);
  if (s.lse_written) {
    o.lse.resize(static_cast<std::size_t>(s.batch * s.q_heads * s.q_len));
    o.lse_view = fattn::TensorView::lse(o.lse.data(), s.batch, s.q_heads, s.q_len);
    o.lse_or_null = &o.lse_view;
  }
  return o;
}

void poison(Outputs& outputs) {
  constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();
  std::fill(outputs.out.begin(), outputs.out.end(), kPoison);
  std::fill(outputs.lse.begin(), outputs.lse.end(), kPoison);
}

}  // namespace fattn_bench
