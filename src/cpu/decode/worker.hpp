// fattn — the decode kernel's worker: one work item's rows through the forward loop
// (cpu/forward/loop.hpp; DecodePass, each of the item's kv heads a unit), in one of three
// tile layouts chosen once per item (DecodeWorkspace::query_lanes_for, dot_lanes_for),
// each a policy of what a kv head's rows start as, what a key tile's softmax and P·V
// steps do to them and what they end as:
//   KeysOnLanes     st [rows][Bk], the keys along the lanes (cpu/decode/ops.hpp); for a
//                   bfloat16 cache on dot_bf16 problems the products on vdpbf16ps
//                   (cpu/decode/bf16.hpp)
//   QueryLanes      st [Bk][Br], the query rows along the lanes, the fused kernel's tiles
//                   (cpu/decode/query_lanes.hpp); with Bf16 the same on vdpbf16ps, a
//                   bfloat16 cache read in place (cpu/decode/query_lanes_bf16.hpp)
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "model/problem.hpp"
#include "cpu/decode/bf16.hpp"
#include "cpu/decode/mods.hpp"
#include "cpu/decode/ops.hpp"
#include "cpu/decode/query_lanes.hpp"
#include "cpu/decode/query_lanes_bf16.hpp"
#include "cpu/decode/workspace.hpp"
#include "cpu/forward/loop.hpp"

namespace fattn::cpu {

// One kv head's running state within a worker's memory.
struct HeadState {
  float *qs, *os, *m, *l, *alpha;
  std::uint16_t* qb;  // null unless the workspace's dot_bf16
};

// What one worker holds while it runs an item: the problem, the workspace, its slice of
// the working memory (DecodeWorkspace's offsets).
template <class S>
struct DecodeContext {
  using Ops = DecodeOps<S>;
  using Workspace = DecodeWorkspace<S>;
  using Item = typename Workspace::Item;
  static constexpr int kRowTile = Workspace::kRowTile;
  const detail::Problem& p;
  const Workspace& ws;
  float* w;        // this worker's memory
  float q_factor;  // scale·log2(e)

  HeadState state(std::int64_t slot) const {
    float* h = w + ws.heads_at + slot * ws.head_floats;
    return {h + ws.qs_at, h + ws.os_at, h + ws.m_at, h + ws.l_at, h + ws.alpha_at,
            ws.dot_bf16 ? reinterpret_cast<std::uint16_t*>(h + ws.qb_at) : nullptr};
  }
  float* kt() const { return w + ws.kt_at; }
  float* st() const { return w + ws.st_at; }
};

// Which keys of a key tile each row of an item sees: [first[r], visible[r]) of the tile.
template <class S>
struct RowKeys {
  std::int32_t first[DecodeWorkspace<S>::kRowTile], visible[DecodeWorkspace<S>::kRowTile];
};

template <class S>
struct KeysOnLanes {
  using Ops = DecodeOps<S>;
  using C = DecodeContext<S>;
  template <class Rows>
  static constexpr bool takes = true;

  static void start(const C& c, const typename C::Item& it, std::int64_t hk, const HeadState& h) {
    Ops::load_q_rows(c.p, it.b, hk, it.r0, it.rows, c.q_factor, h.qs, h.qb);
    Ops::start_rows(it.rows, c.p.head_dim, h.m, h.l, h.os);
  }
  // Nothing kept between a key tile's softmax step and its P·V but the scores in st.
  struct Step {};
  // Scores, the variants, online softmax; false where the attn_mask hides the tile from
  // every row (no P·V).
  template <class Rows>
  static bool softmax_step(const C& c, const typename C::Item& it, std::int64_t hk,
                           const HeadState& h, const Rows& k, std::int64_t j0, std::int64_t nj,
                           const RowKeys<S>& keys, typename Ops::Prefetch& next, Step*) {
    const detail::Problem& p = c.p;
    float* st = c.st();
    scores(c, h, it.rows, k, nj, st, next);
    if (p.mods.any() || p.has_window())
      if (!DecodeModOps<S>::apply(p, it.b, hk, it.r0, it.rows, j0, nj, st)) return false;
    Ops::softmax_update(st, it.rows, keys.visible, h.m, h.l, h.alpha);
    return true;
  }
  template <class Rows>
  static void pv_step(const C& c, const typename C::Item& it, const HeadState& h, const Rows& v,
                      std::int64_t nj, const RowKeys<S>& keys, const Step&) {
    values(c, c.st(), it.rows, keys.visible, nj, v, h);
  }
  static HeadState finish(const C&, const typename C::Item&, const HeadState& h) { return h; }

  // st ← the tile's scores: on vdpbf16ps for a bfloat16 cache on dot_bf16 problems, else
  // in float32 (DecodeOps::tile_scores).
  template <class Rows>
  static void scores(const C& c, const HeadState& h, std::int64_t rows, const Rows& k,
                     std::int64_t nj, float* st, typename Ops::Prefetch& next) {
#if defined(FATTN_AVX512_BF16)
    if constexpr (std::is_same_v<Rows, typename DecodeScoresBf16<S>::Rows>)
      if (c.ws.dot_bf16)
        return DecodeScoresBf16<S>::tile_scores(h.qb, c.q_factor, rows, c.p.head_dim, k, nj, c.kt(), st, next);
#endif
    Ops::tile_scores(h.qs, rows, c.p.head_dim, k, nj, c.kt(), st, next);
  }
  // os ← alpha·os + P·V: on vdpbf16ps for a bfloat16 cache on dot_bf16 problems, else
  // in float32.
  template <class Rows>
  static void values(const C& c, const float* probs, std::int64_t rows, const std::int32_t* visible,
                     std::int64_t nj, const Rows& v, const HeadState& h) {
    const std::int64_t D = c.p.head_dim;
#if defined(FATTN_AVX512_BF16)
    if constexpr (std::is_same_v<Rows, typename DecodeValuesBf16<S>::Rows>)
      if (c.ws.dot_bf16) return DecodeValuesBf16<S>::accumulate(probs, rows, visible, nj, v, h.alpha, D, h.os);
#endif
    Ops::pv_accumulate(probs, rows, visible, nj, v, h.alpha, D, h.os);
  }
};

// The query rows along the lanes: the fused kernel's float32 tiles (DecodeQueryLanes), or
// with Bf16 the same on vdpbf16ps, a bfloat16 cache read in place (DecodeQueryLanesBf16).
// A head's qs and os areas hold the tiles' qt and ot; at the end ot goes back to rows, in
// qs's place.
template <class S, bool Bf16>
struct QueryLanes {
  using Lanes = DecodeQueryLanes<S>;
  using C = DecodeContext<S>;
#if defined(FATTN_AVX512_BF16)
  using Kernel = std::conditional_t<Bf16, DecodeQueryLanesBf16<S>, Lanes>;
#else
  static_assert(!Bf16, "the bfloat16 query-lane tiles need AVX512-BF16");
  using Kernel = Lanes;
#endif
  template <class Rows>
  static constexpr bool takes = std::is_same_v<Rows, typename Kernel::Rows>;

  // The rows loaded in os's place (and their bits), then along the lanes.
  static void start(const C& c, const typename C::Item& it, std::int64_t hk, const HeadState& h) {
    DecodeOps<S>::load_q_rows(c.p, it.b, hk, it.r0, it.rows, c.q_factor, h.os, Bf16 ? h.qb : nullptr);
    if constexpr (Bf16)
      Kernel::to_lanes(h.qb, it.rows, c.ws.Dp, reinterpret_cast<std::uint32_t*>(h.qs));
    else
      Kernel::to_lanes(h.os, it.rows, c.p.head_dim, c.ws.Dp, h.qs);
    Lanes::Tile::start_rows(h.m, h.l, h.os, c.p.head_dim);
  }
  using Step = typename Lanes::Step;
  // The rows' key ranges, and with variants their (head, query) pairs, into the kernel's
  // softmax step.
  template <class Rows>
  static bool softmax_step(const C& c, const typename C::Item& it, std::int64_t hk,
                           const HeadState& h, const Rows& k, std::int64_t j0, std::int64_t nj,
                           const RowKeys<S>& keys, typename DecodeOps<S>::Prefetch& next,
                           Step* step) {
    const detail::Problem& p = c.p;
    typename Lanes::Mods::LanePair pairs[C::kRowTile];
    typename Lanes::Seen seen{keys.first, keys.visible, nullptr, {}};
    if (p.mods.any()) {
      for (std::int64_t r = 0; r < it.rows; ++r) {
        const auto [head, query] = DecodeOps<S>::group_row(p, hk, it.r0 + r);
        pairs[r] = {head, query};
      }
      seen = {keys.first, keys.visible, &p, {it.b, 0, 0, it.rows, j0, nj, pairs}};
    }
    if constexpr (Bf16)
      return Kernel::softmax_step(k, nj, it.rows, seen, p.head_dim, c.q_factor, state(h), c.st(),
                                  next, step);
    else
      return Kernel::softmax_step(k, nj, it.rows, seen, p.head_dim, state(h), c.st(), next, step);
  }
  template <class Rows>
  static void pv_step(const C& c, const typename C::Item&, const HeadState& h, const Rows& v,
                      std::int64_t nj, const RowKeys<S>&, const Step& step) {
    if constexpr (Bf16)
      Kernel::pv_step(v, nj, c.p.head_dim, state(h), c.kt(), c.st(), step);
    else
      Kernel::pv_step(v, nj, c.p.head_dim, state(h), c.st(), step);
  }
  static typename Lanes::State state(const HeadState& h) { return {h.qs, h.os, h.m, h.l, h.alpha}; }
  static HeadState finish(const C& c, const typename C::Item& it, const HeadState& h) {
    Lanes::to_rows(h.os, it.rows, c.p.head_dim, c.ws.Dp, h.qs);
    HeadState rows = h;
    rows.os = h.qs;
    return rows;
  }
};

// The forward loop's pass (cpu/forward/loop.hpp) for one decode item: each of its kv
// heads a unit, every one live in every key tile; the tiles from `tiles`, the steps in
// `Layout` (KeysOnLanes, QueryLanes).
template <class S, class Layout, class Tiles>
struct DecodePass {
  using Ops = DecodeOps<S>;
  using C = DecodeContext<S>;
  using Item = typename C::Item;
  static constexpr int kKeyTile = Ops::Bk;
  // Each head's P·V right after its softmax step: one Step and one st serve every head.
  static constexpr bool kSoftmaxAmongProducts = false;

  const C& c;
  const Item& it;
  const Tiles& tiles;
  std::int64_t kv_end;  // the chunk's end: no prefetch past it
  // Of the key tile in the loop: which keys each row sees, where it is, and what a head's
  // softmax step leaves its P·V.
  RowKeys<S> keys;
  std::int64_t nj = 0;
  typename Layout::Step step;
  // The rows of the key tile ws.prefetch_tiles ahead, asked of memory in equal shares
  // during the heads' scores.
  typename Ops::Prefetch next{};

  // Each row's visible keys of [j0, j0 + Bk); the tile staged where tiles are staged.
  // Every head of the item sees the tile.
  int visit(std::int64_t j0) {
    const detail::Problem& p = c.p;
    nj = std::min<std::int64_t>(Ops::Bk, kv_end - j0);
    for (std::int64_t r = 0; r < it.rows; ++r) {
      const std::int64_t i = Ops::group_row(p, 0, it.r0 + r).query;
      keys.first[r] = static_cast<std::int32_t>(std::clamp<std::int64_t>(p.visible_begin(it.b, i) - j0, 0, nj));
      keys.visible[r] = static_cast<std::int32_t>(std::clamp<std::int64_t>(p.visible_end(it.b, i) - j0, 0, nj));
    }
    tiles.prepare(it, j0, nj);
    next = tiles.next_tile(it, j0, kv_end, c.ws.prefetch_tiles, c.ws.prefetch_level);
    return static_cast<int>(it.hk_end - it.hk_begin);
  }
  // Head hk_begin + x; its share of the next tile asked of memory during its scores.
  bool softmax_step(std::int64_t j0, int x, int n) {
    const std::int64_t hk = it.hk_begin + x;
    next.share(x, n);
    return Layout::softmax_step(c, it, hk, c.state(x), tiles.k_rows(it, hk, j0, nj), j0, nj, keys,
                                next, &step);
  }
  void pv_step(std::int64_t j0, int x, int) {
    const std::int64_t hk = it.hk_begin + x;
    Layout::pv_step(c, it, c.state(x), tiles.v_rows(it, hk, j0, nj), nj, keys, step);
  }
};

// A worker running one item at a time: its kv heads' running states and its tiles.
template <class S>
struct DecodeWorker : DecodeContext<S> {
  using C = DecodeContext<S>;
  using Ops = DecodeOps<S>;
  using Item = typename C::Item;
  using C::p, C::ws, C::w;

  StagedTiles<S> staged_tiles() const { return {p, w + ws.k_stage_at, w + ws.v_stage_at}; }

  // Keys [kv_begin, kv_end) of the item's rows, tiles from `tiles` (TilesInCache or
  // StagedTiles), through the forward loop: out and lse, or with split keys its chunk's
  // partial (os, m, l), in the item's layout.
  template <class Tiles>
  void run(const Item& it, std::int64_t kv_begin, std::int64_t kv_end, const Tiles& tiles,
           float* memory) const {
    with_layout<Tiles>(it, [&](auto layout) {
      using Layout = typename decltype(layout)::type;
      for (std::int64_t hk = it.hk_begin; hk < it.hk_end; ++hk)
        Layout::start(*this, it, hk, this->state(hk - it.hk_begin));
      DecodePass<S, Layout, Tiles> pass{*this, it, tiles, kv_end, {}, 0, {}};
      forward_loop(pass, kv_begin, kv_end);
      for (std::int64_t hk = it.hk_begin; hk < it.hk_end; ++hk)
        finish(it, hk, Layout::finish(*this, it, this->state(hk - it.hk_begin)), memory);
    });
  }

 private:
  template <class L>
  struct Tag {
    using type = L;
  };
  // Calls f with the item's layout: the query-lane tiles (on vdpbf16ps for a bfloat16
  // cache read in place) for the items that take them, the keys along the lanes else.
  template <class Tiles, class F>
  void with_layout(const Item& it, F&& f) const {
    using Rows = decltype(std::declval<const Tiles&>().k_rows(it, 0, 0, 0));
#if defined(FATTN_AVX512_BF16)
    if constexpr (QueryLanes<S, true>::template takes<Rows>)
      if (ws.dot_lanes_for(it)) return f(Tag<QueryLanes<S, true>>{});
#endif
    if constexpr (QueryLanes<S, false>::template takes<Rows>)
      if (ws.query_lanes_for(it)) return f(Tag<QueryLanes<S, false>>{});
    f(Tag<KeysOnLanes<S>>{});
  }

  // Head hk's rows, h in the rows layout: out and lse, or its chunk's partial.
  void finish(const Item& it, std::int64_t hk, const HeadState& h, float* memory) const {
    if (ws.splits == 1) return store_group_rows<S>(p, it.b, hk, it.r0, it.rows, h.os, h.m, h.l);
    const std::int64_t Dp = ws.Dp;
    float* part = memory + ws.partial_at(p, it.b, hk, it.row_tile, it.chunk);
    std::copy(h.os, h.os + it.rows * Dp, part);
    for (std::int64_t r = 0; r < it.rows; ++r) {
      part[it.rows * Dp + 2 * r] = h.m[r];
      part[it.rows * Dp + 2 * r + 1] = h.l[r];
    }
  }
};

}  // namespace fattn::cpu
