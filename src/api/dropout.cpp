// fattn — the dropout mask of a call's options (fattn/attention.hpp, dropout_mask).
#include "fattn/attention.hpp"
#include "model/checks.hpp"

namespace fattn {

void dropout_mask(const Options& options, std::int64_t batch, std::int64_t q_heads,
                  std::int64_t q_len, std::int64_t kv_len, std::uint8_t* keep) {
  const detail::Dropout d = detail::checked_dropout(options);
  if (batch < 0 || q_heads < 0 || q_len < 0 || kv_len < 0)
    throw Error("fattn: dropout_mask's sizes must be >= 0");
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < q_heads; ++h)
      for (std::int64_t i = 0; i < q_len; ++i)
        for (std::int64_t j = 0; j < kv_len; ++j, ++keep)
          *keep = !d.on() || detail::dropout_keeps(d, b, h, q_heads, i, j);
}

}  // namespace fattn
