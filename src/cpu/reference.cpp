// fattn — the float64 reference: the definition every kernel is tested against.
//
// For each query row: s_j = scale · Σ_d q_d k_jd over visible keys, m = max s_j,
// p_j = exp(s_j − m), out = Σ_j p_j v_j / Σ_j p_j, lse = m + ln Σ_j p_j.
// A row that sees no key gives out = 0 and lse = −inf. A NaN score makes its row NaN.
#include <cmath>
#include <limits>
#include <vector>

#include "core/problem.hpp"
#include "cpu/kernels.hpp"

namespace fattn::cpu {

double reference_row(const detail::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i,
                     double* out_row, std::vector<double>& scores) {
  const std::int64_t hk = p.kv_head_of(h);
  const std::int64_t visible = p.causal == Causal::none ? p.kv_len : p.kv_end(i + 1);
  const float* q = p.q.row(b, h, i);
  scores.assign(static_cast<std::size_t>(visible > 0 ? visible : 0), 0.0);
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t j = 0; j < visible; ++j) {
    const float* k = p.k.row(b, hk, j);
    double dot = 0.0;
    for (std::int64_t d = 0; d < p.head_dim; ++d)
      dot += static_cast<double>(q[d * p.q.dim]) * static_cast<double>(k[d * p.k.dim]);
    const double s = dot * p.scale;
    scores[static_cast<std::size_t>(j)] = s;
    if (s > m) m = s;
  }
  for (std::int64_t d = 0; d < p.head_dim; ++d) out_row[d] = 0.0;
  if (visible <= 0) return -std::numeric_limits<double>::infinity();
  const double m_ref = std::isinf(m) && m < 0 ? 0.0 : m;
  double sum = 0.0;
  for (std::int64_t j = 0; j < visible; ++j) {
    const double e = std::exp(scores[static_cast<std::size_t>(j)] - m_ref);
    sum += e;
    const float* v = p.v.row(b, hk, j);
    for (std::int64_t d = 0; d < p.head_dim; ++d) out_row[d] += e * static_cast<double>(v[d * p.v.dim]);
  }
  for (std::int64_t d = 0; d < p.head_dim; ++d) out_row[d] /= sum;
  return m_ref + std::log(sum);
}

void reference_forward(const detail::Problem& p, const detail::Exec& exec) {
  detail::parallel_items(exec, p.batch * p.q_heads, [&](std::int64_t item, int) {
    const std::int64_t b = item / p.q_heads, h = item % p.q_heads;
    std::vector<double> scores, out(static_cast<std::size_t>(p.head_dim));
    for (std::int64_t i = 0; i < p.q_len; ++i) {
      const double lse = reference_row(p, b, h, i, out.data(), scores);
      float* o = p.out.row(b, h, i);
      for (std::int64_t d = 0; d < p.head_dim; ++d)
        o[d * p.out.dim] = static_cast<float>(out[static_cast<std::size_t>(d)]);
      if (p.lse.data) *p.lse.row(b, h, i) = static_cast<float>(lse);
    }
  });
}

}  // namespace fattn::cpu
