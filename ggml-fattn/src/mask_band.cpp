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
  // Causal, bottom-right aligned in [first, end): row i's last key is first + kept − rows + i.
  const std::int64_t kept = band.end - band.first;
  std::int64_t window_left = -1;
  for (std::int64_t i = 0; i < rows; ++i) {
    const Row& r = seen[static_cast<std::size_t>(i)];
    const std::int64_t limit = band.first + kept - rows + i;
    if (r.last != limit) return band;
    if (r.first == band.first && (window_left < 0 || limit - band.first <= window_left))
      continue;  // starts at the first key: no left edge, or one not reached yet
    const std::int64_t w = limit - r.first;  // keys [limit − w, limit]
    if (window_left >= 0 && w != window_left) return band;
    window_left = w;
  }
  // A row starting at the first key must be within the window where there is one.
  if (window_left >= 0)
    for (std::int64_t i = 0; i < rows; ++i) {
      const Row& r = seen[static_cast<std::size_t>(i)];
      const std::int64_t limit = band.first + kept - rows + i;
      if (std::max(band.first, limit - window_left) != r.first) return band;
    }
  band.is_band = true;
  band.window_left = window_left;
  return band;
}

}  // namespace ggml_fattn
