// fattn-bench — max abs error against the float64 reference (see accuracy.hpp).
#include "accuracy.hpp"

#include <cmath>
#include <limits>

namespace fattn_bench {

double worse(double err, double a, double b) {
  const double diff = std::fabs(a - b);
  if (std::isnan(diff) || std::isnan(err)) return std::numeric_limits<double>::quiet_NaN();
  return diff > err ? diff : err;
}

ReferenceCheck::ReferenceCheck(const Inputs& in, const Shape& s, const fattn::Options& options) {
  all_rows_ = s.batch * s.q_heads * s.q_len * s.kv_len <= kFullCheckMaxPairs;
  fattn::Options reference = options;
  reference.impl = fattn::Impl::reference;
  if (all_rows_) {
    Outputs out = make_outputs(Shape{s.batch, s.q_heads, s.kv_heads, s.q_len, s.kv_len, s.head_dim,
                                     s.causal, /*lse_written=*/false});
    fattn::attention_forward(in.q_view, in.k_view, in.v_view, out.out_view, nullptr, reference);
    full_ = std::move(out.out);
    return;
  }
  const std::int64_t total_rows = s.batch * s.q_heads * s.q_len;
  for (int n = 0; n < kSampledRows; ++n) {
    const std::int64_t flat = n * (total_rows - 1) / (kSampledRows - 1);
    const std::int64_t i = flat % s.q_len, bh = flat / s.q_len;
    Row row{flat * s.head_dim, std::vector<double>(static_cast<std::size_t>(s.head_dim))};
    fattn::reference_row(in.q_view, in.k_view, in.v_view, reference, bh / s.q_heads, bh % s.q_heads,
                         i, row.values.data());
    rows_.push_back(std::move(row));
  }
}

double ReferenceCheck::max_abs_err(const std::vector<float>& out) const {
  double err = 0.0;
  if (all_rows_) {
    for (std::size_t e = 0; e < out.size(); ++e) err = worse(err, out[e], full_[e]);
    return err;
  }
  for (const Row& row : rows_)
    for (std::size_t d = 0; d < row.values.size(); ++d)
      err = worse(err, out[static_cast<std::size_t>(row.offset) + d], row.values[d]);
  return err;
}

}  // namespace fattn_bench
