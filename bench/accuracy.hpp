// fattn-bench — max abs error of an output against the float64 reference.
//
// Small problems (B·Hq·Sq·Sk <= 2^26) are checked on the whole output, against
// Impl::reference. Larger ones on kSampledRows rows spread evenly over the flattened
// (batch, head, row) index — first and last rows included — against
// fattn::reference_row, which keeps the check to a fraction of a second.
#pragma once

#include <cstdint>
#include <vector>

#include "fattn/attention.hpp"
#include "inputs.hpp"
#include "model.hpp"

namespace fattn_bench {

inline constexpr std::int64_t kFullCheckMaxPairs = std::int64_t{1} << 26;  // B·Hq·Sq·Sk
inline constexpr int kSampledRows = 32;

// max(err, |a − b|), but NaN as soon as one difference is NaN (an output element left
// unwritten in a NaN-poisoned output shows; std::max alone would drop it).
double worse(double err, double a, double b);

class ReferenceCheck {
 public:
  // options: causal, scale and threads as the kernels under test use them.
  ReferenceCheck(const Inputs& inputs, const Shape& shape, const fattn::Options& options);

  // max |out − reference| over the checked rows; NaN if any checked value is NaN.
  double max_abs_err(const std::vector<float>& out) const;
  bool all_rows() const { return all_rows_; }
  const char* rows_label() const { return all_rows_ ? "all" : "sampled"; }

 private:
  struct Row {
    std::int64_t offset;         // of element (b, h, i, 0) in the (B, Hq, Sq, D) output
    std::vector<double> values;  // D values
  };
  bool all_rows_ = false;
  std::vector<float> full_;  // the whole reference output, when all_rows_
  std::vector<Row> rows_;    // the sampled rows otherwise
};

}  // namespace fattn_bench
