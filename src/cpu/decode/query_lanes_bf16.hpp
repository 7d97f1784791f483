// fattn — the decode kernel's query-lane tiles on AVX512-BF16, for a bfloat16 cache read
// in place: the fused bfloat16 kernel's tile operations (cpu/forward/dot_bf16_ops.hpp) on K and V
// where they lie.
//   qp [Dp/2][Br]  the item's query rows as pairs of their own bits (unscaled), rows along
//                  the lanes
//   st [Bk][Br]    scores ← scale·log2(e) · Σ over pairs: each key pair broadcast from its
//                  row in the cache (DotBf16Ops::KeyRows), MK keys against all Br rows
//   vp [Bk/2][D]   the tile's value rows interleaved in pairs (in kt's memory)
//   pp [Bk/2][Br]  P rounded to bfloat16 in pairs of keys, written over st
//   ot [D][Br]     float32 output accumulator, as DecodeQueryLanes'
// Against DecodeQueryLanes (float32 products) a vdpbf16ps adds two products, and against
// the keys-along-lanes tiles (DecodeScoresBf16, DecodeValuesBf16) there is no transposed
// key tile and each value pair is interleaved once per tile instead of once per row block.
// P is rounded in every tile; keys a row does not see get p = 0, which adds exactly 0 when
// the tile's values are finite. A tile with an infinite or NaN value takes the float32
// P·V (its values staged as float32 in kt's memory), which skips the hidden keys.
#pragma once

#include "cpu/common/isa_target.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/decode/query_lanes.hpp"
#include "cpu/forward/dot_bf16_ops.hpp"

namespace fattn::cpu {

#if defined(FATTN_AVX512_BF16)

template <class S>
struct DecodeQueryLanesBf16 {
  using Lanes = DecodeQueryLanes<S>;
  using Ops = DecodeOps<S>;
  using Tile = TileOps<S>;
  using Dot = DotBf16Ops<S>;
  using Pair = typename Dot::Pair;
  using Rows = typename Ops::template Rows<BFloat16>;
  static constexpr int Br = Lanes::Br;
  static constexpr int MK = Tile::MK;
  static constexpr int Bk = Ops::Bk;
  static_assert(Bk % 2 == 0, "a key tile is a whole number of key pairs");

  // qp[i][r] = the pair i of row r's bits (qb rows of Dp bits, as load_q_rows leaves them),
  // zero for the lanes past the item's rows.
  static void to_lanes(const std::uint16_t* qb, std::int64_t rows, std::int64_t Dp, Pair* qp) {
    const std::int64_t D2 = Dp / 2;
    std::fill(qp, qp + D2 * Br, Pair{0});
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t i = 0; i < D2; ++i) std::memcpy(qp + i * Br + r, qb + r * Dp + 2 * i, sizeof(Pair));
  }

  // st[j][·] for the tile's nj keys, MK at a time; a block's keys past nj read the tile's
  // last key again (their scores are never used).
  static void scores(const Rows& k, std::int64_t nj, const Pair* qp, std::int64_t D, float factor,
                     float* st, typename Ops::Prefetch& next) {
    for (std::int64_t j = 0; j < nj; j += MK) {
      typename Dot::KeyRows keys;
      for (int r = 0; r < MK; ++r) keys.row[r] = k.row(std::min<std::int64_t>(j + r, nj - 1));
      Dot::scores_block(keys, qp, D / 2, factor, st + j * Br, [&] { next.issue_line(); });
    }
    next.issue_rest();
  }

  // vp[j][·] = (v[2j][·], v[2j+1][·]) for the tile's key pairs (pairs never cross a key
  // group: groups hold an even number of keys); whether every value is finite.
  static bool pack_values(const Rows& v, std::int64_t nj, std::int64_t D, Pair* vp) {
    bool finite = true;
    for (std::int64_t j = 0; 2 * j < nj; ++j)
      finite &= Dot::interleave_rows(v.row(2 * j), 2 * j + 1 < nj ? v.row(2 * j + 1) : nullptr, D, vp + j * D);
    return finite;
  }

  // One key tile for one kv head: DecodeQueryLanes' two steps on bfloat16 pairs. The
  // softmax step: scores and probabilities; false where the attn_mask hides the tile from
  // every row.
  static bool softmax_step(const Rows& k, std::int64_t nj, std::int64_t rows,
                           const typename Lanes::Seen& seen, std::int64_t D, float factor,
                           const typename Lanes::State& h, float* st,
                           typename Ops::Prefetch& next, typename Lanes::Step* step) {
    const MaskCover mask = Lanes::cover(seen);
    if (mask == MaskCover::hidden) return false;
    scores(k, nj, reinterpret_cast<const Pair*>(h.qt), D, factor, st, next);
    // ranges filled whether or not some lane is masked: the float32 P·V below reads them.
    step->masked = Lanes::probabilities(st, nj, rows, seen, mask, h, &step->ranges);
    return true;
  }
  // The P·V step. kt: the worker's D·Bk floats, for vp (or the float32 values of a
  // non-finite tile).
  static void pv_step(const Rows& v, std::int64_t nj, std::int64_t D, const typename Lanes::State& h,
                      float* kt, float* st, const typename Lanes::Step& step) {
    auto* vp = reinterpret_cast<Pair*>(kt);
    if (pack_values(v, nj, D, vp)) {
      auto* pp = reinterpret_cast<Pair*>(st);  // row j of pp over row j of st, read by then
      Dot::round_p_pairs(st, nj, pp);
      return Dot::pv_accumulate(vp, nj, pp, h.alpha, D, h.ot);
    }
    for (std::int64_t j = 0; j < nj; ++j)  // a non-finite value: float32, hidden keys skipped
      for (std::int64_t d = 0; d < D; ++d) kt[j * D + d] = to_float(v.row(j)[d]);
    Tile::pv_rows(typename Tile::ValueRows{kt, D}, nj, st, h.alpha, D, h.ot, step.ranges);
  }
};

#endif

}  // namespace fattn::cpu
