// fattn — the float64 reference: the definition every kernel is tested against.
//
// Forward, for each query row: s_j = scale · Σ_d q_d k_jd over the keys of its band
// (causal limit, window), changed by the variants (softcap, ALiBi, attn_mask: row_scores);
// m = max(s_j, sink), p_j = exp(s_j − m), out = Σ_j p_j v_j / (e^(sink − m) + Σ_j p_j),
// lse = m + ln(e^(sink − m) + Σ_j p_j), the sink's terms absent without sinks.
// A row that sees no key (and has no sink) gives out = 0 and lse = −inf. A NaN score
// makes its row NaN.
//
// Backward, for each query row, with P_j = p_j / Σ p and the row's exact output o:
//   dP_j = dout · v_j,   Δ = dout · o − dlse,   dS_j = P_j (dP_j − Δ) · (1 − tanh²_j)
//   (the last factor with a softcap), d sink = −Σ_rows P_sink Δ
//   dq = scale Σ_j dS_j k_j,   dk_j += scale dS_j q,   dv_j += P_j dout
// Everything is recomputed in float64 from q, k, v: the forward's saved out and lse
// are not read, so the reference checks them too.
//
// Element type T: float, BFloat16, Float16 (cpu/common/elements.hpp) or double (float64
// problems); a q8_0 cache is widened to float32 first (WidenedKv). A 16-bit output is the
// float64 result rounded to float, then to 16 bits.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "model/problem.hpp"
#include "cpu/common/elements.hpp"
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

// The per-head values of the variants (alibi slopes, sinks): float64 for float64
// problems, float32 otherwise (the logsumexp's dtype).
template <class T>
double per_head(const float* values, std::int64_t index) {
  return static_cast<double>(reinterpret_cast<const Lse<T>*>(values)[index]);
}

// The attn_mask's change to the score of (b, h, i, j): −inf for a hidden pair, else the
// additive value times head h's attn_mask_scale (0 for a boolean true).
template <class T>
double mask_value(const detail::ScoreMods& m, std::int64_t b, std::int64_t h, std::int64_t i,
                  std::int64_t j) {
  const std::int64_t at = b * m.mask_batch + h * m.mask_head + i * m.mask_seq + j * m.mask_key;
  double value = 0.0;
  switch (m.mask_dtype) {
    case DType::boolean: return static_cast<const std::uint8_t*>(m.mask)[at] ? 0.0 : kNegInf;
    case DType::float16: value = wide(static_cast<const Float16*>(m.mask)[at]); break;
    case DType::bfloat16: value = wide(static_cast<const BFloat16*>(m.mask)[at]); break;
    case DType::float64: value = static_cast<const double*>(m.mask)[at]; break;
    default: value = static_cast<const float*>(m.mask)[at]; break;
  }
  if (!m.mask_scale || value == kNegInf) return value;
  return value * per_head<T>(m.mask_scale, h);
}

// One query row: its visible keys [begin, end), the probabilities P_j over them, and
// with a softcap d(capped score)/d(score) = 1 − tanh² of each.
struct Row {
  std::int64_t begin = 0, end = 0;
  std::vector<double> probs, cap_grads;
};

// The row's scores, written plainly in Options' order: scale·q·k, softcap, ALiBi,
// attn_mask, then the band (causal limit and window) decides which keys take part.
template <class T>
void row_scores(const detail::Problem& p, const Views<T>& t, std::int64_t b, std::int64_t h,
                std::int64_t i, Row& row) {
  const std::int64_t hk = p.kv_head_of(h);
  row.begin = p.visible_begin(b, i);
  row.end = std::max(row.begin, p.visible_end(b, i));
  const auto n = static_cast<std::size_t>(row.end - row.begin);
  row.probs.assign(n, 0.0);
  row.cap_grads.assign(n, 1.0);
  const T* q = t.q.row(b, h, i);
  const detail::ScoreMods& m = p.mods;
  for (std::int64_t j = row.begin; j < row.end; ++j) {
    const auto at = static_cast<std::size_t>(j - row.begin);
    const T* k = t.k.row(b, hk, j);
    double dot = 0.0;
    for (std::int64_t d = 0; d < p.head_dim; ++d)
      dot += wide(q[d * t.q.dim]) * wide(k[d * t.k.dim]);
    double s = dot * p.scale;
    if (m.softcap != 0.0) {
      const double tanh = std::tanh(s / m.softcap);
      s = m.softcap * tanh;
      row.cap_grads[at] = 1.0 - tanh * tanh;
    }
    if (m.alibi) {
      const double slope = per_head<T>(m.alibi, b * m.alibi_batch + h);
      s -= slope * std::abs(static_cast<double>(i + p.keys_of(b) - p.q_len - j));
    }
    if (m.mask) s += mask_value<T>(m, b, h, i, j);
    row.probs[at] = s;
  }
}

// The factor dropout gives P[b, h, i, j] before P·V: 1 without dropout, else 1/(1 − p)
// where the mask keeps it and 0 where it drops it (model/dropout.hpp).
double dropout_factor(const detail::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i,
                      std::int64_t j) {
  if (!p.dropout.on()) return 1.0;
  return detail::dropout_keeps(p.dropout, b, h, p.q_heads, i, j) ? 1.0 / (1.0 - p.dropout.p) : 0.0;
}

// probs ← the row's softmax over its visible keys (and the sink, with sinks; float64),
// out_row ← Σ_j P_j v_j; returns the logsumexp (−inf for a row that sees no key and has
// no sink).
template <class T>
double softmax_row(const detail::Problem& p, const Views<T>& t, std::int64_t b, std::int64_t h,
                   std::int64_t i, double* out_row, Row& row) {
  row_scores(p, t, b, h, i, row);
  const double sink = p.mods.sinks ? per_head<T>(p.mods.sinks, h) : kNegInf;
  double m = sink;
  for (const double s : row.probs) m = std::max(m, s);
  if (std::isnan(sink)) m = sink;
  for (std::int64_t d = 0; d < p.head_dim; ++d) out_row[d] = 0.0;
  const double m_ref = std::isinf(m) && m < 0 ? 0.0 : m;
  double sum = std::exp(sink - m_ref);
  for (double& e : row.probs) {
    e = std::exp(e - m_ref);
    sum += e;
  }
  if (sum == 0.0) return kNegInf;  // no key visible (or every score −inf), no sink
  const std::int64_t hk = p.kv_head_of(h);
  for (std::int64_t j = row.begin; j < row.end; ++j) {
    double& e = row.probs[static_cast<std::size_t>(j - row.begin)];
    e /= sum;
    const double kept = e * dropout_factor(p, b, h, i, j);
    const T* v = t.v.row(b, hk, j);
    for (std::int64_t d = 0; d < p.head_dim; ++d) out_row[d] += kept * wide(v[d * t.v.dim]);
  }
  return m_ref + std::log(sum);
}

// Calls f(p, t, b, head) for each batch b and each of `heads` heads, in parallel: p is
// sequence b's own problem (a ragged batch's lengths) and t its tensors.
template <class T, class F>
void for_each_sequence_head(const detail::Problem& whole, const detail::Exec& exec,
                            std::int64_t heads, F&& f) {
  detail::parallel_items(exec, whole.batch * heads, [&](std::int64_t item, int) {
    const std::int64_t b = item / heads;
    const detail::SequenceOf seq(whole, b);
    const detail::Problem& p = seq.get();
    f(p, Views<T>(p), b, item % heads);
  });
}

template <class T>
void forward(const detail::Problem& whole, const detail::Exec& exec) {
  for_each_sequence_head<T>(whole, exec, whole.q_heads, [&](const detail::Problem& p,
                                                            const Views<T>& t, std::int64_t b,
                                                            std::int64_t h) {
    Row row;
    std::vector<double> out(static_cast<std::size_t>(p.head_dim));
    for (std::int64_t i = 0; i < p.q_len; ++i) {
      const double lse = softmax_row(p, t, b, h, i, out.data(), row);
      if (p.out_float32) {  // a 16-bit problem's float32 out: rounded once, to float
        float* o = p.out.row(b, h, i);
        for (std::int64_t d = 0; d < p.head_dim; ++d)
          o[d * p.out.dim] = static_cast<float>(out[static_cast<std::size_t>(d)]);
      } else {
        T* o = t.out.row(b, h, i);
        for (std::int64_t d = 0; d < p.head_dim; ++d)
          o[d * t.out.dim] = narrow<T>(out[static_cast<std::size_t>(d)]);
      }
      if (t.lse.data) *t.lse.row(b, h, i) = static_cast<Lse<T>>(lse);
    }
  });
}

// One work item per (batch, kv head): it owns dk and dv of that head and dq of the
// query heads that share it, so no two items write one element. With sinks, each item
// writes the sinks' gradient terms of its query heads to sink_terms[b][h]; the sum over
// b runs afterwards, in order.
template <class T>
void backward(const detail::Problem& whole, const detail::Exec& exec) {
  const std::int64_t D = whole.head_dim;
  std::vector<double> sink_terms(
      static_cast<std::size_t>(whole.mods.sinks ? whole.batch * whole.q_heads : 0));
  for_each_sequence_head<T>(whole, exec, whole.kv_heads, [&](const detail::Problem& p,
                                                             const Views<T>& t, std::int64_t b,
                                                             std::int64_t hk) {
    Row row;
    std::vector<double> out(static_cast<std::size_t>(D)), dq(static_cast<std::size_t>(D));
    std::vector<double> dk(static_cast<std::size_t>(p.kv_len * D), 0.0), dv(dk.size(), 0.0);
    for (std::int64_t h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h)
      for (std::int64_t i = 0; i < p.q_len; ++i) {
        const double lse = softmax_row(p, t, b, h, i, out.data(), row);
        const T* q = t.q.row(b, h, i);
        const T* dout = t.dout.row(b, h, i);
        double delta = t.dlse.data ? -static_cast<double>(*t.dlse.row(b, h, i)) : 0.0;
        for (std::int64_t d = 0; d < D; ++d)
          delta += wide(dout[d * t.dout.dim]) * out[static_cast<std::size_t>(d)];
        // d lse / d sink = P_sink; d out / d sink = −P_sink·out: the sink's term −P_sink·Δ.
        if (p.mods.sinks && lse != kNegInf)
          sink_terms[static_cast<std::size_t>(b * p.q_heads + h)] -=
              std::exp(per_head<T>(p.mods.sinks, h) - lse) * delta;
        for (double& x : dq) x = 0.0;
        for (std::int64_t j = row.begin; j < row.end; ++j) {
          const auto at = static_cast<std::size_t>(j - row.begin);
          const T* k = t.k.row(b, hk, j);
          const T* v = t.v.row(b, hk, j);
          const double factor = dropout_factor(p, b, h, i, j);  // dropout: d out / d P
          double dp = 0.0;
          for (std::int64_t d = 0; d < D; ++d)
            dp += wide(dout[d * t.dout.dim]) * wide(v[d * t.v.dim]);
          dp *= factor;
          const double ds = row.probs[at] * (dp - delta) * row.cap_grads[at] * p.scale;
          double* dk_row = dk.data() + j * D;
          double* dv_row = dv.data() + j * D;
          for (std::int64_t d = 0; d < D; ++d) {
            dq[static_cast<std::size_t>(d)] += ds * wide(k[d * t.k.dim]);
            dk_row[d] += ds * wide(q[d * t.q.dim]);
            dv_row[d] += row.probs[at] * factor * wide(dout[d * t.dout.dim]);
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
  const detail::Problem& p = whole;
  if (!p.mods.sinks) return;
  auto* dsinks = reinterpret_cast<Lse<T>*>(p.dsinks);
  for (std::int64_t h = 0; h < p.q_heads; ++h) {
    double sum = 0.0;
    for (std::int64_t b = 0; b < p.batch; ++b)
      sum += sink_terms[static_cast<std::size_t>(b * p.q_heads + h)];
    dsinks[h] = static_cast<Lse<T>>(sum);
  }
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

// A q8_0 problem's K and V widened to float32 (exact: cpu/common/elements.hpp), in
// contiguous copies the problem's views then point at: every (sequence, kv head), or with
// `only` one of them, whose rows then stand for every index (batch and head strides 0: the
// view is right for that pair only); any other problem unchanged. (q8_0 K and V come with a
// dense attention_forward: no pages, no packing.)
class WidenedKv {
 public:
  struct Pair {
    std::int64_t b, hk;
  };
  explicit WidenedKv(const detail::Problem& p, const Pair* only = nullptr) : problem_(p) {
    if (!p.kv_q8_0) return;
    const std::int64_t D = p.head_dim, S = p.kv_len;
    const std::int64_t batches = only ? 1 : p.batch, heads = only ? 1 : p.kv_heads;
    k_.resize(static_cast<std::size_t>(batches * heads * S * D));
    v_.resize(k_.size());
    for (std::int64_t b = 0; b < batches; ++b)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t j = 0; j < S; ++j) {
          const std::int64_t at = ((b * heads + h) * S + j) * D;
          const std::int64_t from_b = only ? only->b : b, from_h = only ? only->hk : h;
          convert_row(retype<const Q8_0>(p.k).row(from_b, from_h, j), 1, D, k_.data() + at);
          convert_row(retype<const Q8_0>(p.v).row(from_b, from_h, j), 1, D, v_.data() + at);
        }
    const detail::Strided<const float> layout{nullptr, only ? 0 : heads * S * D, only ? 0 : S * D, D, 1};
    problem_.k = layout;
    problem_.k.data = k_.data();
    problem_.v = layout;
    problem_.v.data = v_.data();
    problem_.kv_q8_0 = false;
  }
  const detail::Problem& get() const { return problem_; }

 private:
  detail::Problem problem_;
  std::vector<float> k_, v_;
};

}  // namespace

double reference_row(const detail::Problem& problem, std::int64_t b, std::int64_t h,
                     std::int64_t i, double* out_row) {
  const WidenedKv::Pair pair{b, problem.kv_head_of(h)};  // one row: one kv head widened
  const WidenedKv widened(problem, &pair);
  const detail::Problem& p = widened.get();
  return with_reference_type(p.dtype, [&](auto element) {
    Row row;
    return softmax_row(p, Views<decltype(element)>(p), b, h, i, out_row, row);
  });
}

void reference_forward(const detail::Problem& problem, const detail::Exec& exec) {
  const WidenedKv widened(problem);
  const detail::Problem& p = widened.get();
  with_reference_type(p.dtype, [&](auto element) { forward<decltype(element)>(p, exec); });
}

void reference_backward(const detail::Problem& p, const detail::Exec& exec) {
  with_reference_type(p.dtype, [&](auto element) { backward<decltype(element)>(p, exec); });
}

}  // namespace fattn::cpu
