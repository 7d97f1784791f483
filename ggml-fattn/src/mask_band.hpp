// ggml-fattn — what a FLASH_ATTN_EXT mask says, read once per call: the keys any query row
// sees, and whether the mask is exactly a band fattn runs without reading it.
//
// llama.cpp's masks hold 0 for a visible (query, key) pair and −inf for a hidden one
// (ALiBi models: −|distance| where visible). Keys no row sees (the cache's unused cells,
// padded to 256, and the keys of other sequences) are dropped from the call: they add
// nothing to any row's softmax. Where every row's visible keys are one run of zeros that
// ends at a fixed offset from the row (causal, bottom-right aligned), starting at the first
// key or at a fixed distance before the end (a sliding window), the call is that band,
// the same answer bit for bit as the mask; anything else runs with the mask.
#pragma once

#include <cstdint>

namespace ggml_fattn {

struct MaskBand {
  std::int64_t first = 0, end = 0;  // keys [first, end) are seen by some row (end ≤ first: none)
  bool is_band = false;             // rows see exactly the band below, with value 0
  // The band in the kept keys [first, end): row i sees keys j ≤ i + (end − first) − rows,
  // and j ≥ that limit − window_left where window_left ≥ 0 (−1: no left edge).
  std::int64_t window_left = -1;
};

// Reads rows × keys float16 elements (row r at mask + r · row_stride) once.
MaskBand read_mask(const std::uint16_t* mask, std::int64_t rows, std::int64_t keys,
                   std::int64_t row_stride);

}  // namespace ggml_fattn
