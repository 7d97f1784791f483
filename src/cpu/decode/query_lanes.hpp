// fattn — the decode kernel's tiles with the query rows along the vector lanes
// (cpu/decode/decode.hpp), for items of many rows (Sq = 16 at GQA 4:1 is 64 rows), with every
// variant.
//
// The fused kernel's layout and tile operations (cpu/common/tile_ops.hpp), on K and V where they
// lie:
//   qt [D][Br]   the item's query rows, transposed, pre-scaled by scale·log2(e)
//   st [Bk][Br]  scores, keys × rows: each key element broadcast from its row in the cache
//                (TileOps::KeyRows), MK keys against all Br rows at once
//   ot [D][Br]   output accumulator: each value element broadcast from its row (Values)
//   m, l, alpha [Br]
// Against the keys-along-lanes tiles (cpu/decode/ops.hpp) there is no transposed key tile to
// write and read, and the softmax needs no sums across lanes. Row r is the group's row
// r as there (DecodeOps::group_row); lanes past the item's rows compute on zero queries and are
// never stored.
// The variants change st as on the fused kernel's tiles, by the same code (ScoreModOps,
// its tiles' lanes named pair by pair); the causal limit and the window are each row's
// range of keys (LaneRanges); the sinks join each row as it is written (decode.hpp).
#pragma once

#include <algorithm>
#include <cstdint>

#include "model/problem.hpp"
#include "cpu/decode/ops.hpp"
#include "cpu/common/score_mods.hpp"
#include "cpu/common/tile_ops.hpp"

namespace fattn::cpu {

template <class S>
struct DecodeQueryLanes {
  using Ops = DecodeOps<S>;
  using Tile = TileOps<S>;
  using Mods = ScoreModOps<S>;
  using Rows = typename Ops::template Rows<float>;
  static constexpr int Br = Tile::Br, MK = Tile::MK;
  // Only 64-row tiles take this layout (applies); there a key tile is whole score blocks,
  // which st's Bk rows rely on.
  static constexpr bool kUsed = Br == 64;
  static_assert(!kUsed || Ops::Bk % MK == 0, "a key tile is a whole number of score blocks");

  // Items of at least this many rows take these tiles, fewer the keys-along-lanes ones:
  // a tile's time here does not shrink with its rows. GQA 4:1, D = 128, Sk = 8k, (B, S,
  // H, D), 2 threads, dev-zen5, GFLOP/s query lanes / key lanes: 64 rows 399-413 /
  // 312-328, 56 rows 355-364 / 295-300, 48 rows 308-314 / 296-301, 40 rows 238-257 /
  // 260-268, 32 rows 190-203 / 237-245 (docs/perf-log.md, "query rows along the lanes").
  // bfloat16 on vdpbf16ps (DecodeQueryLanesBf16 / DecodeScoresBf16 and DecodeValuesBf16),
  // the same shapes: 56 rows 633-642 / 516-531, 48 rows 548-554 / 516-521, 40 rows
  // 459-466 / 503-512, 32 rows 363-365 / 452-462 ("bfloat16 query lanes").
  static constexpr std::int64_t kMinRows = 48;

  // Whether problem p's items may take these tiles (float32 rows, float32 copies where
  // `staged`, or bfloat16 rows on bfloat16 dot products: DecodeQueryLanesBf16), those of
  // at least kMinRows rows; every variant and window.
  static bool applies(const detail::Problem& p, bool staged, bool bf16_dots) {
    if constexpr (!kUsed) return false;  // measured with AVX-512's 64-row tiles only
    return staged || p.dtype == DType::float32 || bf16_dots;
  }
  static bool takes(std::int64_t item_rows) { return item_rows >= kMinRows && item_rows <= Br; }

  // One kv head's running state in these tiles (the head's qs and os areas hold qt and ot).
  struct State {
    float *qt, *ot, *m, *l, *alpha;
  };

  // Value rows of a key tile, in the cache's key groups (a paged cache's pages), from
  // dim d0: TileOps::pv_block's value policy.
  struct Values {
    Rows v;
    std::int64_t d0 = 0;
    const float* row(std::int64_t j) const { return v.row(j) + d0; }
    Values from_dim(std::int64_t d) const { return {v, d0 + d}; }
  };

  // qt[d][r] = qs[r][d] for the item's rows r < rows (the rows as DecodeOps::load_q_rows
  // loads them), zero for the lanes past them.
  static void to_lanes(const float* qs, std::int64_t rows, std::int64_t D, std::int64_t Dp,
                       float* qt) {
    std::fill(qt, qt + D * Br, 0.0f);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t d = 0; d < D; ++d) qt[d * Br + r] = qs[r * Dp + d];
  }

  // st[j][·] = k_j · qt for the tile's nj keys, MK at a time; `next` is asked for between
  // the blocks. A block's keys past nj read the tile's last key again (their scores are
  // never used), so no row past the tile is read.
  static void scores(const Rows& k, std::int64_t nj, const float* qt, std::int64_t D, float* st,
                     typename Ops::Prefetch& next) {
    for (std::int64_t j = 0; j < nj; j += MK) {
      typename Tile::KeyRows keys;
      for (int r = 0; r < MK; ++r) keys.row[r] = k.row(std::min<std::int64_t>(j + r, nj - 1));
      Tile::scores_block(keys, qt, D, st + j * Br, [&] { next.issue_line(); });
    }
    next.issue_rest();
  }

  // Which keys of a tile each row sees, and the variants that change its scores.
  struct Seen {
    const std::int32_t* begin;  // per row: its first key (a window's left edge), else 0
    const std::int32_t* end;    // per row: one past its last key
    const detail::Problem* p;   // the problem whose variants apply; null: none
    typename Mods::Tile pairs;  // the rows' (head, query) pairs against the tile's keys
  };

  // Each lane's range of the keys it sees (lanes past the rows see all nj), every lane
  // filled; whether some lane does not see the whole tile.
  static bool lane_ranges(const Seen& seen, std::int64_t rows, std::int64_t nj,
                          typename Tile::LaneRanges* ranges) {
    bool masked = false;
    for (int u = 0; u < Tile::NV; ++u)
      for (int i = 0; i < Tile::L; ++i) {
        const std::int64_t r = u * Tile::L + i;
        ranges->begin[u][i] = r < rows ? seen.begin[r] : 0;
        ranges->end[u][i] = r < rows ? seen.end[r] : static_cast<std::int32_t>(nj);
        masked |= ranges->begin[u][i] > 0 || ranges->end[u][i] < nj;
      }
    return masked;
  }

  // What the attn_mask says of the tile (before its scores: a tile it hides from every
  // row is skipped).
  static MaskCover cover(const Seen& seen) {
    return seen.p ? Mods::mask_cover(*seen.p, seen.pairs) : MaskCover::unchanged;
  }

  // The tile's scores st into probabilities: the variants applied, the keys each row does
  // not see hidden, online softmax; `ranges` receives which keys each lane sees, and the
  // result says whether some lane does not see the whole tile.
  static bool probabilities(float* st, std::int64_t nj, std::int64_t rows, const Seen& seen,
                            MaskCover mask, const State& h, typename Tile::LaneRanges* ranges) {
    if (seen.p) Mods::apply(*seen.p, seen.pairs, mask, st);
    const bool masked = lane_ranges(seen, rows, nj, ranges);
    if (masked) Tile::mask_tile(st, nj, *ranges);
    Tile::softmax_update(st, nj, h.m, h.l, h.alpha);
    return masked;
  }

  // What a key tile's softmax step leaves its P·V: which keys each lane sees.
  struct Step {
    typename Tile::LaneRanges ranges;
    bool masked = false;  // some lane does not see the whole tile
  };

  // One key tile for one kv head, the forward loop's softmax step: scores and
  // probabilities; false where the attn_mask hides the tile from every row (no P·V).
  static bool softmax_step(const Rows& k, std::int64_t nj, std::int64_t rows, const Seen& seen,
                           std::int64_t D, const State& h, float* st,
                           typename Ops::Prefetch& next, Step* step) {
    const MaskCover mask = cover(seen);
    if (mask == MaskCover::hidden) return false;
    scores(k, nj, h.qt, D, st, next);
    step->masked = probabilities(st, nj, rows, seen, mask, h, &step->ranges);
    return true;
  }
  // ... and its P·V step: ot ← alpha·ot + P·V.
  static void pv_step(const Rows& v, std::int64_t nj, std::int64_t D, const State& h,
                      const float* st, const Step& step) {
    if (step.masked)
      Tile::pv_rows(Values{v}, nj, st, h.alpha, D, h.ot, step.ranges);
    else
      Tile::pv_rows(Values{v}, nj, st, h.alpha, D, h.ot, typename Tile::AllVisible{});
  }

  // os[r][d] = ot[d][r] for the item's rows, zero for d in [D, Dp): the keys-along-lanes
  // layout, which the output, the sinks and the split partials take.
  static void to_rows(const float* ot, std::int64_t rows, std::int64_t D, std::int64_t Dp,
                      float* os) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t d = 0; d < D; ++d) os[r * Dp + d] = ot[d * Br + r];
      std::fill(os + r * Dp + D, os + (r + 1) * Dp, 0.0f);
    }
  }
};

}  // namespace fattn::cpu
