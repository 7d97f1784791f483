// fattn — the float64 reference: the definition every kernel is tested against.
//
// Forward, for each query row: s_j = scale · Σ_d q_d k_jd over visible keys,
// m = max s_j, p_j = exp(s_j − m), out = Σ_j p_j v_j / Σ_j p_j, lse = m + ln Σ_j p_j.
// A row that sees no key gives out = 0 and lse = −inf. A NaN score makes its row NaN.
//
// Backward, for each query row, with P_j = p_j / Σ p and the row's exact output o:
//   dP_j = dout · v_j,   Δ = dout · o − dlse,   dS_j = P_j (dP_j − Δ)
//   dq = scale Σ_j dS_j k_j,   dk_j += scale dS_j q,   dv_j += P_j dout
// Everything is recomputed in float64 from q, k, v: the forward's saved out and lse
// are not read, so the reference checks them too.
//
// Element type T: float, BFloat16, Float16 (cpu/elements.hpp) or double (float64
// problems). A 16-bit output is the float64 result rounded to float, then to 16 bits.
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/problem.hpp"
#include "cpu/elements.hpp"
#include "cpu/kernels.hpp"

namespace fattn::cpu {
namespace {

using detail::retype;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

double wide(double x) { return x; }
template <class E>
double wide(E x) {
  return static_cast<double>(to_float(x));
}
template <class T>
T narrow(double x) {
  if constexpr (std::is_same_v<T, double>)
    return x;
  else
    return from_float<T>(static_cast<float>(x));
}

// The logsumexp is float64 for float64 problems, float32 for the others.
template <class T>
using Lse = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
struct Views {
  detail::Strided<const T> q, k, v, dout;
  detail::Strided<const Lse<T>> dlse;
  detail::Strided<T> out, dq, dk, dv;
  detail::Strided<Lse<T>> lse;
  explicit Views(const detail::Problem& p)
      : q(retype<const T>(p.q)), k(retype<const T>(p.k)), v(retype<const T>(p.v)),
        dout(retype<const T>(p.dout)), dlse(retype<const Lse<T>>(p.dlse)), out(retype<T>(p.out)),
        dq(retype<T>(p.dq)), dk(retype<T>(p.dk)), dv(retype<T>(p.dv)),
        lse(retype<Lse<T>>(p.lse)) {}
};

// Keys query row i of sequence b sees (a KV cache's own length and pages included).
std::int64_t visible_keys(const detail::Problem& p, std::int64_t b, std::int64_t i) {
  return p.visible_end(b, i);
}

// probs ← the row's softmax over its visible keys (float64), out_row ← Σ_j P_j v_j;
// returns the logsumexp (−inf for a row that sees no key).
template <class T>
double softmax_row(const detail::Problem& p, const Views<T>& t, std::int64_t b, std::int64_t h,
                   std::int64_t i, double* out_row, std::vector<double>& probs) {
  const std::int64_t hk = p.kv_head_of(h);
  const std::int64_t visible = visible_keys(p, b, i);
  const T* q = t.q.row(b, h, i);
  probs.assign(static_cast<std::size_t>(visible > 0 ? visible : 0), 0.0);
  double m = kNegInf;
  for (std::int64_t j = 0; j < visible; ++j) {
    const T* k = p.kv_row(t.k, b, hk, j);
    double dot = 0.0;
    for (std::int64_t d = 0; d < p.head_dim; ++d)
      dot += wide(q[d * t.q.dim]) * wide(k[d * t.k.dim]);
    const double s = dot * p.scale;
    probs[static_cast<std::size_t>(j)] = s;
    if (s > m) m = s;
  }
  for (std::int64_t d = 0; d < p.head_dim; ++d) out_row[d] = 0.0;
  if (visible <= 0) return kNegInf;
  const double m_ref = std::isinf(m) && m < 0 ? 0.0 : m;
  double sum = 0.0;
  for (std::int64_t j = 0; j < visible; ++j) {
    double& e = probs[static_cast<std::size_t>(j)];
    e = std::exp(e - m_ref);
    sum += e;
  }
  for (std::int64_t j = 0; j < visible; ++j) {
    double& e = probs[static_cast<std::size_t>(j)];
    e /= sum;
    const T* v = p.kv_row(t.v, b, hk, j);
    for (std::int64_t d = 0; d < p.head_dim; ++d)
      out_row[d] += e * wide(v[d * t.v.dim]);
  }
  return m_ref + std::log(sum);
}

template <class T>
void forward(const detail::Problem& p, const detail::Exec& exec) {
  const Views<T> t(p);
  detail::parallel_items(exec, p.batch * p.q_heads, [&](std::int64_t item, int) {
    const std::int64_t b = item / p.q_heads, h = item % p.q_heads;
    std::vector<double> probs, out(static_cast<std::size_t>(p.head_dim));
    for (std::int64_t i = 0; i < p.q_len; ++i) {
      const double lse = softmax_row(p, t, b, h, i, out.data(), probs);
      T* o = t.out.row(b, h, i);
      for (std::int64_t d = 0; d < p.head_dim; ++d)
        o[d * t.out.dim] = narrow<T>(out[static_cast<std::size_t>(d)]);
      if (t.lse.data) *t.lse.row(b, h, i) = static_cast<Lse<T>>(lse);
    }
  });
}

// One work item per (batch, kv head): it owns dk and dv of that head and dq of the
// query heads that share it, so no two items write one element.
template <class T>
void backward(const detail::Problem& p, const detail::Exec& exec) {
  const Views<T> t(p);
  const std::int64_t D = p.head_dim;
  detail::parallel_items(exec, p.batch * p.kv_heads, [&](std::int64_t item, int) {
    const std::int64_t b = item / p.kv_heads, hk = item % p.kv_heads;
    std::vector<double> probs, out(static_cast<std::size_t>(D)), dq(static_cast<std::size_t>(D));
    std::vector<double> dk(static_cast<std::size_t>(p.kv_len * D), 0.0), dv(dk.size(), 0.0);
    for (std::int64_t h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h)
      for (std::int64_t i = 0; i < p.q_len; ++i) {
        softmax_row(p, t, b, h, i, out.data(), probs);
        const T* q = t.q.row(b, h, i);
        const T* dout = t.dout.row(b, h, i);
        double delta = t.dlse.data ? -static_cast<double>(*t.dlse.row(b, h, i)) : 0.0;
        for (std::int64_t d = 0; d < D; ++d)
          delta += wide(dout[d * t.dout.dim]) * out[static_cast<std::size_t>(d)];
        for (double& x : dq) x = 0.0;
        for (std::size_t j = 0; j < probs.size(); ++j) {
          const T* k = t.k.row(b, hk, static_cast<std::int64_t>(j));
          const T* v = t.v.row(b, hk, static_cast<std::int64_t>(j));
          double dp = 0.0;
          for (std::int64_t d = 0; d < D; ++d)
            dp += wide(dout[d * t.dout.dim]) * wide(v[d * t.v.dim]);
          const double ds = probs[j] * (dp - delta) * p.scale;
          double* dk_row = dk.data() + static_cast<std::int64_t>(j) * D;
          double* dv_row = dv.data() + static_cast<std::int64_t>(j) * D;
          for (std::int64_t d = 0; d < D; ++d) {
            dq[static_cast<std::size_t>(d)] += ds * wide(k[d * t.k.dim]);
            dk_row[d] += ds * wide(q[d * t.q.dim]);
            dv_row[d] += probs[j] * wide(dout[d * t.dout.dim]);
          }
        }
        T* dq_out = t.dq.row(b, h, i);
        for (std::int64_t d = 0; d < D; ++d)
          dq_out[d * t.dq.dim] = narrow<T>(dq[static_cast<std::size_t>(d)]);
      }
    for (std::int64_t j = 0; j < p.kv_len; ++j) {
      T* dk_out = t.dk.row(b, hk, j);
      T* dv_out = t.dv.row(b, hk, j);
      for (std::int64_t d = 0; d < D; ++d) {
        dk_out[d * t.dk.dim] = narrow<T>(dk[static_cast<std::size_t>(j * D + d)]);
        dv_out[d * t.dv.dim] = narrow<T>(dv[static_cast<std::size_t>(j * D + d)]);
      }
    }
  });
}

// Calls f with a value of the problem's element type.
template <class F>
decltype(auto) with_reference_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::float64: return f(double{});
    case DType::bfloat16: return f(BFloat16{});
    case DType::float16: return f(Float16{});
    default: return f(float{});
  }
}

}  // namespace

double reference_row(const detail::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i,
                     double* out_row, std::vector<double>& scores) {
  return with_reference_type(p.dtype, [&](auto element) {
    return softmax_row(p, Views<decltype(element)>(p), b, h, i, out_row, scores);
  });
}

void reference_forward(const detail::Problem& p, const detail::Exec& exec) {
  with_reference_type(p.dtype, [&](auto element) { forward<decltype(element)>(p, exec); });
}

void reference_backward(const detail::Problem& p, const detail::Exec& exec) {
  with_reference_type(p.dtype, [&](auto element) { backward<decltype(element)>(p, exec); });
}

}  // namespace fattn::cpu
