// fattn — the dropout mask of a call's options (fattn/attention.hpp, dropout_mask).
#include <string>

#include "fattn/attention.hpp"
#include "model/problem.hpp"

namespace fattn {

void dropout_mask(const Options& options, std::int64_t batch, std::int64_t q_heads,
                  std::int64_t q_len, std::int64_t kv_len, std::uint8_t* keep) {
  if (!(options.dropout_p >= 0.0 && options.dropout_p < 1.0))
    throw Error("fattn: dropout_p must be in [0, 1) (0: off), got " +
                std::to_string(options.dropout_p));
  if (batch < 0 || q_heads < 0 || q_len < 0 || kv_len < 0)
    throw Error("fattn: dropout_mask's sizes must be >= 0");
  detail::Dropout d;
  d.p = options.dropout_p;
  d.threshold = detail::Dropout::threshold_of(d.p);
  d.seed = options.dropout_seed;
  d.offset = options.dropout_offset;
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < q_heads; ++h)
      for (std::int64_t i = 0; i < q_len; ++i)
        for (std::int64_t j = 0; j < kv_len; ++j, ++keep)
          *keep = !d.on() || detail::dropout_keeps(d, b, h, q_heads, i, j);
}

}  // namespace fattn
