// ggml-fattn — the mask's visible keys and band (mask_band.hpp).
#include "mask_band.hpp"

#include <algorithm>
#include <vector>

namespace ggml_fattn {
namespace {

constexpr std::uint16_t kNegInfHalf = 0xFC00;  // float16 −inf
constexpr std::uint16_t kZeroHalf = 0x0000, kNegZeroHalf = 0x8000;

bool is_zero(std::uint16_t x) { return x == kZeroHalf || x == kNegZeroHalf; }

// One row: its first and last visible key, and whether it is one run of zeros.
struct Row {
  std::int64_t first = -1, last = -1;
  bool zero_run = true;
};

Row read_row(const std::uint16_t* row, std::int64_t keys) {
  Row r;
  for (std::int64_t j = 0; j < keys; ++j) {
    if (row[j] == kNegInfHalf) continue;
    if (r.first < 0) r.first = j;
    else if (j != r.last + 1) r.zero_run = false;  // a hidden key inside the run
    r.last = j;
    if (!is_zero(row[j])) r.zero_run = false;
  }
  return r;
}

}  // namespace

MaskBand read_mask(const std::uint16_t* mask, std::int64_t rows, std::int64_t keys,
                   std::int64_t row_stride) {
  std::vector<Row> seen(static_cast<std::size_t>(rows));
  MaskBand band;
  band.first = keys;
  band.end = 0;
  bool runs = true;
  for (std::int64_t i = 0; i < rows; ++i) {
    const Row r = read_row(mask + i * row_stride, keys);
    seen[static_cast<std::size_t>(i)] = r;
    if (r.first < 0) {
      runs = false;  // a row that sees nothing is no band's
      continue;
    }
    band.first = std::min(band.first, r.first);
    band.end = std::max(band.end, r.last + 1);
    runs = runs && r.zero_run;
  }
  if (band.end <= band.first || !runs) return band;
  // Causal, bottom-right aligned in [first, end): row i's last key is its limit,
  // end − rows + i; a window starts a row `window_left` keys before its limit.
  auto limit = [&](std::int64_t i) { return band.end - rows + i; };
  std::int64_t window_left = -1;  // from the first row that starts after the first key
  for (std::int64_t i = 0; i < rows && window_left < 0; ++i)
    if (seen[static_cast<std::size_t>(i)].first > band.first)
      window_left = limit(i) - seen[static_cast<std::size_t>(i)].first;
  for (std::int64_t i = 0; i < rows; ++i) {
    const Row& r = seen[static_cast<std::size_t>(i)];
    const std::int64_t start =
        window_left < 0 ? band.first : std::max(band.first, limit(i) - window_left);
    if (r.last != limit(i) || r.first != start) return band;
  }
  band.is_band = true;
  band.window_left = window_left;
  return band;
}

}  // namespace ggml_fattn
