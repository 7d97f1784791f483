// fattn — which keys a query row sees: the one place every CUDA kernel asks.
//
// The fused kernels (mma.sync 16-bit, 3xTF32/TF32, FMA, wgmma, TMA), the naive kernels and
// the float64 reference all decide visibility here, as FlashAttention-2's Mask and
// BlockInfo do for its kernels. A key j is visible to query row i when
//   j < kv_len                              (the sequence end), and
//   band_lo <= j - i <= band_hi             (the band: model/problem.hpp's; each edge only
//                                            where Params has it: the upper one is the causal
//                                            limit or a right window, the lower one a left
//                                            window)
// Per-sequence lengths and masks plug in here.
//
// The questions, at three grains:
//   hidden(row, key)                        one score (hidden<false>: without the lower edge)
//   tile_hides_keys(k0, keys, first_row)    a key tile against rows first_row.. : whether
//                                           the sequence end or the upper edge hides any
//                                           score of it
//   crosses_limit(k0, keys, first_row)      whether the upper edge of some row from
//                                           first_row on falls inside the tile (the tiles
//                                           whose hidden values the kernels must keep out
//                                           of P·V, see fused_mma.cuh)
//   below_band(k0, last_row)                whether the tile starts below the lower edge of a
//                                           row up to last_row (the kernels that take a lower
//                                           edge ask it beside the two above)
//   kv_begin(q_begin), kv_end(q_end)        the keys rows [q_begin, q_end) may see: which key
//                                           tiles a block loads
//   q_begin(k0), q_end(k_end)               the rows keys [k0, k_end) may be seen by: which
//                                           query tiles the backward's key blocks visit
//   tile_has_hidden_pair, pair_hidden       the backward's masking, over rows past q_len too
// A view over the kernel's Params (a reference, not a copy), or over one sequence's band
// where each sequence has its own length (SequenceBand: the decode kernel).
//
// Who asks what today: every kernel takes kv_end from here (FusedBlock's tile count,
// the naive and reference kernels' rows); the wgmma kernels, the reference and the decode
// kernel (over each sequence's band) ask all of it.
// The kernels that have run on an H100 (fused_mma, fused_tf32, fused_fma, naive;
// warp_softmax.cuh's scale_and_mask and pv_visible_keys) still write the boolean tests of
// the upper edge inline: moving a short-circuit test into these functions changes their SASS
// (cuobjdump, sm_80 and sm_90: NVVM turns the inlined branch into selects and ptxas
// schedules the loop differently), so they move here when an H100 can run their tests and
// benchmark again. They take no lower edge (the plan never gives them one).
//
// Without nvcc the functions are plain inline C++, so the host tests check them against
// the CPU model's band (tests/test_cuda_band.cpp).
#pragma once

#include "cuda/params.hpp"

#if defined(__CUDACC__)
#define FATTN_BAND_FN __host__ __device__ __forceinline__
#else
#define FATTN_BAND_FN inline
#endif

namespace fattn::cuda {

// The questions over any band that holds Params' band fields (q_len, kv_len, has_band_lo,
// band_lo, has_band_hi, band_hi): the forward kernels' Params (Visibility below), or one
// sequence's band where each sequence has its own (SequenceBand below).
template <class Band>
struct VisibilityOf {
  const Band& p;

  // The first key that query rows [q_begin, ..) may see, clamped to [0, kv_len].
  FATTN_BAND_FN int kv_begin(int q_begin) const {
    if (!p.has_band_lo) return 0;
    const long long first = static_cast<long long>(q_begin) + p.band_lo;
    if (first < 0) return 0;
    return first < p.kv_len ? static_cast<int>(first) : p.kv_len;
  }

  // One past the last key that query rows [.., q_end) may see, clamped to [0, kv_len].
  FATTN_BAND_FN int kv_end(int q_end) const {
    if (!p.has_band_hi) return p.kv_len;
    const long long last = static_cast<long long>(q_end) - 1 + p.band_hi;
    if (last < 0) return 0;
    return last + 1 < p.kv_len ? static_cast<int>(last + 1) : p.kv_len;
  }

  // Whether query row `row` does not see key `key`: the sequence end and the upper edge,
  // and (kLowerEdge: the kernels that take one) the lower edge.
  template <bool kLowerEdge = true>
  FATTN_BAND_FN bool hidden(int row, int key) const {
    const bool hides = key >= p.kv_len || (p.has_band_hi && key > row + p.band_hi);
    if constexpr (kLowerEdge) return hides || (p.has_band_lo && key < row + p.band_lo);
    return hides;
  }

  // Whether keys [k0, k0 + keys) pass the upper edge of a row from first_row on.
  FATTN_BAND_FN bool crosses_limit(int k0, int keys, int first_row) const {
    return p.has_band_hi && k0 + keys - 1 > first_row + p.band_hi;
  }

  // Whether some key of [k0, k0 + keys) is hidden from a row from first_row on by the
  // sequence end or the upper edge.
  FATTN_BAND_FN bool tile_hides_keys(int k0, int keys, int first_row) const {
    return k0 + keys > p.kv_len || crosses_limit(k0, keys, first_row);
  }

  // Whether keys from k0 on lie below the lower edge of a row up to last_row.
  FATTN_BAND_FN bool below_band(int k0, int last_row) const {
    return p.has_band_lo && k0 < last_row + p.band_lo;
  }

  // The backward's questions (backward_tma.cuh), whose tiles hold rows past q_len too:
  // Whether query `row` (of any tile) does not see `key`.
  FATTN_BAND_FN bool pair_hidden(int row, int key) const { return row >= p.q_len || hidden(row, key); }
  // Whether some pair of rows [q0, q0 + rows) × keys [k0, k0 + keys) is hidden: by an edge of
  // the band or past either sequence's end (exact: false means every pair is visible).
  FATTN_BAND_FN bool tile_has_hidden_pair(int q0, int rows, int k0, int keys) const {
    return q0 + rows > p.q_len || k0 + keys > p.kv_len ||
           (p.has_band_hi && k0 + keys - 1 > q0 + p.band_hi) ||
           (p.has_band_lo && k0 < q0 + rows - 1 + p.band_lo);
  }
  // The first query row that may see a key of [k0, ..), and one past the last that may see a
  // key of [.., k_end) (k_end <= kv_len), clamped to [0, q_len]: which query tiles a key block
  // visits.
  FATTN_BAND_FN int q_begin(int k0) const {
    if (!p.has_band_hi) return 0;
    const long long first = static_cast<long long>(k0) - p.band_hi;  // j <= i + band_hi
    return first < 0 ? 0 : first < p.q_len ? static_cast<int>(first) : p.q_len;
  }
  FATTN_BAND_FN int q_end(int k_end) const {
    if (!p.has_band_lo) return p.q_len;
    const long long end = static_cast<long long>(k_end) - p.band_lo;  // j >= i + band_lo
    return end < 0 ? 0 : end < p.q_len ? static_cast<int>(end) : p.q_len;
  }
};

// The forward and backward kernels' band: one for the whole call, in their Params.
using Visibility = VisibilityOf<Params>;
FATTN_BAND_FN Visibility visibility(const Params& p) { return Visibility{p}; }

// One sequence's band in a batch whose sequences each have their own length (the decode
// kernel: a sequence's keys after the append): the diagonals aligned bottom-right, as
// model/problem.hpp aligns a KV cache's queries (query q_len − 1's diagonal is key
// kv_len − 1; a window keeps `window_left` keys before a query's diagonal and
// `window_right` after it, causal none after it); each edge
// present where the call has it, clamped as set_band (band.hpp) clamps the forward's, so
// i ± edge stays inside int. Read through VisibilityOf<SequenceBand>.
struct SequenceBand {
  int q_len, kv_len;
  bool has_band_lo, has_band_hi;
  int band_lo, band_hi;

  FATTN_BAND_FN static SequenceBand bottom_right(int q_len, int kv_len, bool causal,
                                                 int window_left, int window_right) {
    SequenceBand s{q_len, kv_len, window_left >= 0, causal || window_right >= 0, 0, 0};
    const long long align = static_cast<long long>(kv_len) - q_len;
    const long long lowest = -(static_cast<long long>(q_len) - 1), highest = kv_len - 1LL;
    if (s.has_band_hi) {  // causal: the diagonal itself (a right window hides no more)
      const long long hi = causal ? align : align + window_right;
      s.band_hi = static_cast<int>(hi > highest ? highest : hi < lowest - 1 ? lowest - 1 : hi);
    }
    if (s.has_band_lo) {
      const long long lo = align - window_left;
      s.band_lo = static_cast<int>(lo < lowest ? lowest : lo > highest + 1 ? highest + 1 : lo);
    }
    return s;
  }
};

}  // namespace fattn::cuda
