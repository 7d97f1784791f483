// fattn — the sinks' gradient of the kernels' backward.
//
// A sink joins the softmax denominator only, so with P_sink = e^(sink − lse) of a row,
// d lse / d sink = P_sink and d out / d sink = −P_sink · out: the row's term is
// −P_sink · Δ with Δ = dout·out − dlse (the backward's Δ). One pass over out and dout;
// each query head sums its rows in float64, in order, so the result is the same bits on
// every run and thread count.
#include <cmath>

#include "model/checks.hpp"
#include "model/problem.hpp"
#include "cpu/common/elements.hpp"
#include "cpu/kernels.hpp"

namespace fattn::cpu {

void sink_gradients(const detail::Problem& whole, const detail::Exec& exec) {
  detail::parallel_items(exec, whole.q_heads, [&](std::int64_t h, int) {
    const double sink = whole.mods.sinks[h];
    double sum = 0.0;
    float out[detail::kMaxHeadDim], dout[detail::kMaxHeadDim];
    for (std::int64_t b = 0; b < whole.batch; ++b) {
      const detail::SequenceOf seq(whole, b);  // a ragged problem's sequence b
      const detail::Problem& p = seq.get();
      for (std::int64_t i = 0; i < p.q_len; ++i) {
        const double lse = *p.lse.row(b, h, i);
        if (std::isinf(lse) && lse < 0) continue;  // no key and no sink: no gradient
        load_row(p.out, p.dtype, b, h, i, p.head_dim, out);
        load_row(p.dout, p.dtype, b, h, i, p.head_dim, dout);
        double delta = p.dlse.data ? -static_cast<double>(*p.dlse.row(b, h, i)) : 0.0;
        for (std::int64_t d = 0; d < p.head_dim; ++d)
          delta += static_cast<double>(out[d]) * static_cast<double>(dout[d]);
        sum -= std::exp(sink - lse) * delta;
      }
    }
    whole.dsinks[h] = static_cast<float>(sum);
  });
}

}  // namespace fattn::cpu
