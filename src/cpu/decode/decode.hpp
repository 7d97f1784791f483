// fattn — the decode kernel: short queries against long keys (decode, speculative
// decoding, chunked prefill), K and V read in place (a KV cache, paged or not).
//
// A work item is (sequence b, a few kv heads, a tile of each group's query rows, a chunk
// of the keys). For its rows (every query head of a group at once, cpu/decode/ops.hpp):
//   for each key tile, for each kv head:
//        next ← the next head's tile, asked of memory during this one's compute (Prefetch)
//        st ← qs·Kᵀ                 (tile_scores: from the key rows for ≤ 4 rows, else
//                                    through the transposed tile; items of 48 rows or
//                                    more: the query rows along the lanes instead,
//                                    cpu/decode/query_lanes.hpp; a bfloat16 cache on
//                                    vdpbf16ps, cpu/decode/bf16.hpp and
//                                    cpu/decode/query_lanes_bf16.hpp)
//        m, l, st ← online softmax  (softmax_update; the visibility object says which
//                                    keys each row sees)
//        os ← alpha·os + st·V       (pv_accumulate)
//   out ← os / l, lse ← ln(2)·(m + log2 l)            (or a partial, with split keys)
// K and V are read where they lie when each row holds D contiguous elements, D a whole
// number of vectors (16-bit elements widened to float32 as they are loaded, so a 16-bit
// cache moves half the bytes; a bfloat16 cache on AVX512-BF16 is multiplied as it lies,
// on vdpbf16ps); otherwise (strided dims, odd head dims) each key tile is
// first staged as float32 in address order, zero-padded.
// Split-KV (flash-decoding): when sequences × kv heads × row tiles cannot keep every
// worker busy, each sequence's keys are cut into `splits` chunks computed in parallel;
// each chunk leaves (os, m, l), and the worker that finishes a row tile's last chunk
// merges them in chunk order, so the result has the same bits on every run with the same
// thread count.
// Working memory: per worker O(D·(rows + Bk)), plus the split partials; none grows with Sk.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "model/parallel.hpp"
#include "model/problem.hpp"
#include "cpu/decode/mods.hpp"
#include "cpu/decode/ops.hpp"
#include "cpu/decode/query_lanes.hpp"
#include "cpu/decode/query_lanes_bf16.hpp"
#include "cpu/decode/bf16.hpp"
#include "cpu/common/online_softmax.hpp"
#include "cpu/common/workspace.hpp"

namespace fattn::cpu {

// How a decode problem is cut into work items, and where each piece of working memory
// lies: every size and offset computed once, here.
template <class S>
struct DecodeWorkspace {
  using Ops = DecodeOps<S>;
  // Query rows per work item: a whole decode group (32 heads × Sq 2 at MHA) in one tile.
  static constexpr std::int64_t kRowTile = 64;
  // A work item takes each key tile of K and V for several kv heads at once (in place,
  // or staged in address order in a (B, S, Hkv, D) cache: stage_rows) and keeps their
  // running states (qs, os, m, l) side by side: as many heads as their tiles and states
  // fit this many floats (1 MiB, half of L2).
  static constexpr std::int64_t kItemFloats = 262144;
  // Split the keys until there are this many items per worker (load balance across the
  // dynamic schedule) ...
  static constexpr std::int64_t kItemsPerWorker = 4;
  // ... but not into chunks under this many keys (each chunk costs a partial and a merge).
  static constexpr std::int64_t kMinChunkKeys = 512;

  // K and V read where they lie (DecodeOps::reads_in_place), else staged tile by tile.
  bool in_place;
  // The tiles' layout: query rows along the lanes (DecodeQueryLanes) for the items that
  // take it (query_lanes_for), keys along them (DecodeOps) for the others. lane_rows: the
  // rows of the running states and scores, its Br where any item takes query lanes.
  bool query_lanes;
  std::int64_t lane_rows;
  std::int64_t rows, tile_rows, row_tiles, heads_per_item, head_groups, splits, items, D, Dp;
  // Floats from the start of the working memory; per head: qs, os, m, l, alpha, and the
  // query rows' bfloat16 bits qb where the scores use them (on_bf16_dot_products).
  std::int64_t worker_floats, head_floats, kt_at, st_at, heads_at, k_stage_at, v_stage_at;
  std::int64_t qs_at, os_at, m_at, l_at, alpha_at, qb_at;  // within a head's state
  bool dot_bf16;
  std::int64_t partial_floats, partials_at, total;

  // splits: 0 picks by the rule above; n > 0 asks for n (capped at one per key tile).
  DecodeWorkspace(const detail::Problem& p, int workers, std::int64_t requested_splits = 0) {
    Sizes n;
    in_place = Ops::reads_in_place(p);
    dot_bf16 = on_bf16_dot_products<S>(p.dtype);  // the scores from the query rows' bits
    D = p.head_dim;
    Dp = Ops::padded_dim(D);
    rows = n.mul(p.group_size(), p.q_len);
    tile_rows = std::min(rows, kRowTile);
    row_tiles = n.div_up(rows, kRowTile);
    query_lanes = DecodeQueryLanes<S>::applies(p, !in_place, in_place && dot_bf16) &&
                  DecodeQueryLanes<S>::takes(tile_rows);
    lane_rows = query_lanes ? DecodeQueryLanes<S>::Br : tile_rows;
    Layout head;  // lane_rows ≤ 64, Dp ≤ 256: no overflow
    qs_at = head.take(lane_rows * Dp);
    os_at = head.take(lane_rows * Dp);
    m_at = head.take(lane_rows);
    l_at = head.take(lane_rows);
    alpha_at = head.take(lane_rows);
    qb_at = head.take(dot_bf16 ? n.div_up(tile_rows * Dp, 2) : 0);  // two bfloat16 per float
    head_floats = head.end;
    const std::int64_t stage_floats = Ops::Bk * Dp;  // one head's key tile of K or V
    heads_per_item = std::clamp<std::int64_t>(kItemFloats / (head_floats + 2 * stage_floats), 1,
                                              p.kv_heads);
    head_groups = n.div_up(p.kv_heads, heads_per_item);
    Layout worker;
    kt_at = worker.take(D * Ops::Bk);
    st_at = worker.take(lane_rows * Ops::Bk);
    heads_at = worker.take(n.mul(head_floats, heads_per_item));
    // The staging buffers only where tiles are staged (no room taken when read in place).
    const std::int64_t staged_floats = in_place ? 0 : n.mul(stage_floats, heads_per_item);
    k_stage_at = worker.take(staged_floats);
    v_stage_at = worker.take(staged_floats);
    worker_floats = worker.end;
    n.overflow |= worker.n.overflow;

    const std::int64_t base = n.mul(n.mul(p.batch, head_groups), row_tiles);
    std::int64_t max_keys = 0;
    for (std::int64_t b = 0; b < p.batch; ++b) max_keys = std::max(max_keys, p.keys_of(b));
    const std::int64_t key_tiles = std::max<std::int64_t>(1, n.div_up(max_keys, Ops::Bk));
    if (requested_splits > 0) {
      splits = std::min(requested_splits, key_tiles);
    } else {
      const std::int64_t wanted = n.div_up(kItemsPerWorker * workers, std::max<std::int64_t>(base, 1));
      splits = std::clamp<std::int64_t>(wanted, 1, std::max<std::int64_t>(1, max_keys / kMinChunkKeys));
    }
    items = n.mul(base, splits);
    partial_floats = n.align(n.mul(tile_rows, Dp + 2));  // os, then m and l per row
    partials_at = n.mul(worker_floats, workers);
    // One partial per (sequence, kv head, row tile, chunk).
    const std::int64_t partials = n.mul(n.mul(n.mul(p.batch, p.kv_heads), row_tiles), splits);
    total = n.add(partials_at, splits > 1 ? n.mul(partials, partial_floats) : 0);
    if (n.overflow) total = -1;
  }

  struct Item {
    std::int64_t b, hk_begin, hk_end, r0, rows, row_tile, chunk;
  };
  bool query_lanes_for(const Item& it) const {
    return query_lanes && DecodeQueryLanes<S>::takes(it.rows);
  }
  // ... on bfloat16 dot products (DecodeQueryLanesBf16: a bfloat16 cache read in place).
  bool dot_lanes_for(const Item& it) const { return query_lanes_for(it) && in_place && dot_bf16; }
  // Items run head group by head group, the chunks of one row tile side by side.
  Item item(const detail::Problem& p, std::int64_t index) const {
    const std::int64_t chunk = index % splits, tile = index / splits;
    const std::int64_t t = tile % row_tiles, group = tile / row_tiles;
    const std::int64_t b = group / head_groups, hk0 = group % head_groups * heads_per_item;
    const std::int64_t r0 = t * kRowTile;
    return {b, hk0, std::min(hk0 + heads_per_item, p.kv_heads), r0,
            std::min(kRowTile, rows - r0), t, chunk};
  }
  // Where the partial of (b, hk, row tile, chunk) lies.
  std::int64_t partial_at(const detail::Problem& p, std::int64_t b, std::int64_t hk,
                          std::int64_t row_tile, std::int64_t chunk) const {
    return partials_at + (((b * p.kv_heads + hk) * row_tiles + row_tile) * splits + chunk) * partial_floats;
  }
  // Keys [begin, end) of an item's chunk that its rows may see: the keys from the first
  // row's first visible one (its key group's start: a window's left edge) to the last
  // row's last, cut into `splits` chunks of whole key tiles.
  void key_range(const detail::Problem& p, const Item& it, std::int64_t* begin,
                 std::int64_t* end) const {
    const std::int64_t keys = p.keys_of(it.b);
    const std::int64_t first_row_query = Ops::group_row(p, 0, it.r0).query;
    const std::int64_t last_row_query = Ops::group_row(p, 0, it.r0 + it.rows - 1).query;
    const std::int64_t last = std::min(keys, p.visible_end(it.b, last_row_query));
    const std::int64_t first = std::min(
        last, p.visible_begin(it.b, first_row_query) / Ops::kKeyGroup * Ops::kKeyGroup);
    const std::int64_t tiles_per_chunk = (last - first + Ops::Bk * splits - 1) / (Ops::Bk * splits);
    const std::int64_t chunk_keys = tiles_per_chunk * Ops::Bk;
    *begin = std::min(last, first + it.chunk * chunk_keys);
    *end = std::min(last, *begin + chunk_keys);
  }
};

// Writes rows [r0, r0 + rows) of kv head hk's group: out ← os / l, lse.
template <class S>
void store_group_rows(const detail::Problem& p, std::int64_t b, std::int64_t hk, std::int64_t r0,
                      std::int64_t rows, float* os, float* m, float* l) {
  using Ops = DecodeOps<S>;
  const std::int64_t D = p.head_dim, Dp = Ops::padded_dim(D);
  if (p.mods.sinks) DecodeModOps<S>::add_sink_to_rows(p, hk, r0, rows, Dp, os, m, l);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto [h, i] = Ops::group_row(p, hk, r0 + r);
    store_row(p.out, p.dtype, b, h, i, D, os + r * Dp, Ops::reciprocal(l[r]));
    if (p.lse.data) *p.lse.row(b, h, i) = Ops::logsumexp(m[r], l[r]);
  }
}

// Merges the split partials of one (sequence, kv head, row tile) in chunk order
// (log-sum-exp weights) into os, m, l.
template <class S>
void merge_partials(const DecodeWorkspace<S>& ws, std::int64_t rows, const float* partials,
                    float* os, float* m, float* l) {
  using Ops = DecodeOps<S>;
  const std::int64_t Dp = ws.Dp;
  for (std::int64_t r = 0; r < rows; ++r) {
    float m_all = Ops::kNegInf;
    for (std::int64_t c = 0; c < ws.splits; ++c)
      m_all = std::max(m_all, partials[c * ws.partial_floats + rows * Dp + 2 * r]);
    const float ref = OnlineSoftmax<S>::reference(m_all);
    float sum = 0.0f;
    std::fill(os + r * Dp, os + (r + 1) * Dp, 0.0f);
    for (std::int64_t c = 0; c < ws.splits; ++c) {  // each chunk's state rescaled to ref
      const float* part = partials + c * ws.partial_floats;
      const float w = OnlineSoftmax<S>::weight(part[rows * Dp + 2 * r], ref);
      sum += w * part[rows * Dp + 2 * r + 1];
      for (std::int64_t d = 0; d < Dp; ++d) os[r * Dp + d] += w * part[r * Dp + d];
    }
    m[r] = m_all;
    l[r] = sum;
  }
}

// Where an item's key tiles come from: the cache itself, rows of E read in place ...
template <class S, class E>
struct TilesInCache {
  using Ops = DecodeOps<S>;
  using Item = typename DecodeWorkspace<S>::Item;
  const detail::Problem& p;
  detail::Strided<const E> k, v;  // p.k and p.v retyped to their element type

  void prepare(const Item&, std::int64_t, std::int64_t) const {}
  typename Ops::template Rows<E> k_rows(const Item& it, std::int64_t hk, std::int64_t j0,
                                        std::int64_t nj) const {
    return Ops::in_cache(p, k, it.b, hk, j0, nj);
  }
  typename Ops::template Rows<E> v_rows(const Item& it, std::int64_t hk, std::int64_t j0,
                                        std::int64_t nj) const {
    return Ops::in_cache(p, v, it.b, hk, j0, nj);
  }
  // The rows read after kv head hk's tile at j0: the next head's, or after the item's
  // last head the first head's next tile (none after the item's last tile).
  typename Ops::Prefetch next(const Item& it, std::int64_t hk, std::int64_t j0,
                              std::int64_t kv_end) const {
    const bool wraps = hk + 1 == it.hk_end;
    const std::int64_t head = wraps ? it.hk_begin : hk + 1, j = wraps ? j0 + Ops::Bk : j0;
    const std::int64_t rows = std::min<std::int64_t>(Ops::Bk, kv_end - j);
    if (rows <= 0) return {};
    return {k_rows(it, head, j, rows), v_rows(it, head, j, rows), rows, p.head_dim};
  }
};

// ... or float32 copies, each key tile of the item's heads staged before its compute.
template <class S>
struct StagedTiles {
  using Ops = DecodeOps<S>;
  using Item = typename DecodeWorkspace<S>::Item;
  const detail::Problem& p;
  float *k_stage, *v_stage;  // the worker's staging buffers

  void prepare(const Item& it, std::int64_t j0, std::int64_t nj) const {
    Ops::stage_rows(p, p.k, it.b, it.hk_begin, it.hk_end, j0, nj, k_stage);
    Ops::stage_rows(p, p.v, it.b, it.hk_begin, it.hk_end, j0, nj, v_stage);
  }
  typename Ops::template Rows<float> k_rows(const Item& it, std::int64_t hk, std::int64_t,
                                            std::int64_t) const {
    return Ops::staged(k_stage, hk - it.hk_begin, p.head_dim);
  }
  typename Ops::template Rows<float> v_rows(const Item& it, std::int64_t hk, std::int64_t,
                                            std::int64_t) const {
    return Ops::staged(v_stage, hk - it.hk_begin, p.head_dim);
  }
  typename Ops::Prefetch next(const Item&, std::int64_t, std::int64_t, std::int64_t) const {
    return {};
  }
};

// One kv head's running state within a worker's memory.
struct HeadState {
  float *qs, *os, *m, *l, *alpha;
  std::uint16_t* qb;  // null unless the workspace's dot_bf16
};

// A worker running one item: its kv heads' running states and its tiles, in the worker's
// slice of the working memory (DecodeWorkspace's offsets).
template <class S>
struct DecodeWorker {
  using Ops = DecodeOps<S>;
  using Workspace = DecodeWorkspace<S>;
  using QueryLanes = DecodeQueryLanes<S>;
  const detail::Problem& p;
  const Workspace& ws;
  float* w;        // this worker's memory
  float q_factor;  // scale·log2(e)

  HeadState state(std::int64_t slot) const {
    float* h = w + ws.heads_at + slot * ws.head_floats;
    return {h + ws.qs_at, h + ws.os_at, h + ws.m_at, h + ws.l_at, h + ws.alpha_at,
            ws.dot_bf16 ? reinterpret_cast<std::uint16_t*>(h + ws.qb_at) : nullptr};
  }
  // The same memory as the query-lane tiles' state: qt in qs's place, ot in os's.
  static typename QueryLanes::State lanes(const HeadState& h) {
    return {h.qs, h.os, h.m, h.l, h.alpha};
  }

  // Each head's query rows, scaled by scale·log2(e) (and their bits, for dot_bf16), and
  // fresh (m, l, os).
  void start(const typename Workspace::Item& it) const {
    for (std::int64_t hk = it.hk_begin; hk < it.hk_end; ++hk) {
      const HeadState h = state(hk - it.hk_begin);
      if (ws.dot_lanes_for(it)) {  // pairs of the bits
#if defined(FATTN_AVX512_BF16)
        Ops::load_q_rows(p, it.b, hk, it.r0, it.rows, q_factor, h.os, h.qb);
        DecodeQueryLanesBf16<S>::to_lanes(h.qb, it.rows, ws.Dp, reinterpret_cast<std::uint32_t*>(h.qs));
        QueryLanes::Tile::start_rows(h.m, h.l, h.os, p.head_dim);
#endif
        continue;
      }
      if (ws.query_lanes_for(it)) {  // the rows loaded in os's place, then along the lanes
        Ops::load_q_rows(p, it.b, hk, it.r0, it.rows, q_factor, h.os, nullptr);
        QueryLanes::to_lanes(h.os, it.rows, p.head_dim, ws.Dp, h.qs);
        QueryLanes::Tile::start_rows(h.m, h.l, h.os, p.head_dim);
        continue;
      }
      Ops::load_q_rows(p, it.b, hk, it.r0, it.rows, q_factor, h.qs, h.qb);
      Ops::start_rows(it.rows, p.head_dim, h.m, h.l, h.os);
    }
  }

  StagedTiles<S> staged_tiles() const {
    return {p, w + ws.k_stage_at, w + ws.v_stage_at};
  }

  // Keys [j0, j0 + nj) for every head of the item: scores, online softmax, P·V; the
  // tiles from `tiles` (TilesInCache or StagedTiles).
  template <class Tiles>
  void key_tile(const typename Workspace::Item& it, std::int64_t j0, std::int64_t nj,
                std::int64_t kv_end, const Tiles& tiles) const {
    const std::int64_t D = p.head_dim;
    float *kt = w + ws.kt_at, *st = w + ws.st_at;
    std::int32_t first[Workspace::kRowTile], visible[Workspace::kRowTile];  // each row's keys of the tile
    for (std::int64_t r = 0; r < it.rows; ++r) {
      const std::int64_t i = Ops::group_row(p, 0, it.r0 + r).query;
      first[r] = static_cast<std::int32_t>(std::clamp<std::int64_t>(p.visible_begin(it.b, i) - j0, 0, nj));
      visible[r] = static_cast<std::int32_t>(std::clamp<std::int64_t>(p.visible_end(it.b, i) - j0, 0, nj));
    }
    typename QueryLanes::Mods::LanePair pairs[Workspace::kRowTile];
    tiles.prepare(it, j0, nj);
    for (std::int64_t hk = it.hk_begin; hk < it.hk_end; ++hk) {
      const HeadState h = state(hk - it.hk_begin);
      typename Ops::Prefetch next = tiles.next(it, hk, j0, kv_end);
      const auto k = tiles.k_rows(it, hk, j0, nj);
      const auto v = tiles.v_rows(it, hk, j0, nj);
      if constexpr (std::is_same_v<decltype(k), const typename QueryLanes::Rows>) {
        if (ws.query_lanes_for(it)) {
          QueryLanes::key_tile(k, v, nj, it.rows, seen(it, hk, j0, nj, first, visible, pairs), D, lanes(h), st, next);
          continue;
        }
      }
#if defined(FATTN_AVX512_BF16)
      if constexpr (std::is_same_v<decltype(k), const typename DecodeQueryLanesBf16<S>::Rows>) {
        if (ws.dot_lanes_for(it)) {
          DecodeQueryLanesBf16<S>::key_tile(k, v, nj, it.rows, seen(it, hk, j0, nj, first, visible, pairs), D,
                                            q_factor, lanes(h), kt, st, next);
          continue;
        }
      }
#endif
      scores(h, it.rows, k, nj, kt, st, next);
      if (p.mods.any() || p.has_window())  // a mask hiding the tile from every row: skipped
        if (!DecodeModOps<S>::apply(p, it.b, hk, it.r0, it.rows, j0, nj, st)) continue;
      Ops::softmax_update(st, it.rows, visible, h.m, h.l, h.alpha);
      values(st, it.rows, visible, nj, v, h);
    }
  }

  // What kv head hk's rows of the item see of keys [j0, j0 + nj) on the query-lane tiles:
  // the ranges first and visible, and with variants the rows' pairs (written to `pairs`).
  typename QueryLanes::Seen seen(const typename Workspace::Item& it, std::int64_t hk, std::int64_t j0,
                                 std::int64_t nj, const std::int32_t* first,
                                 const std::int32_t* visible,
                                 typename QueryLanes::Mods::LanePair* pairs) const {
    if (!p.mods.any()) return {first, visible, nullptr, {}};
    for (std::int64_t r = 0; r < it.rows; ++r) {
      const auto [head, query] = Ops::group_row(p, hk, it.r0 + r);
      pairs[r] = {head, query};
    }
    return {first, visible, &p, {it.b, 0, 0, it.rows, j0, nj, pairs}};
  }

  // st ← the tile's scores: on vdpbf16ps for a bfloat16 cache on dot_bf16 problems
  // (cpu/decode/bf16.hpp), else in float32 (DecodeOps::tile_scores).
  template <class Rows>
  void scores(const HeadState& h, std::int64_t rows, const Rows& k, std::int64_t nj, float* kt,
              float* st, typename Ops::Prefetch& next) const {
#if defined(FATTN_AVX512_BF16)
    if constexpr (std::is_same_v<Rows, typename DecodeScoresBf16<S>::Rows>)
      if (ws.dot_bf16) return DecodeScoresBf16<S>::tile_scores(h.qb, q_factor, rows, p.head_dim, k, nj, kt, st, next);
#endif
    Ops::tile_scores(h.qs, rows, p.head_dim, k, nj, kt, st, next);
  }

  // os ← alpha·os + P·V: on vdpbf16ps for a bfloat16 cache on dot_bf16 problems
  // (cpu/decode/bf16.hpp), else in float32.
  template <class Rows>
  void values(const float* probs, std::int64_t rows, const std::int32_t* visible, std::int64_t nj,
              const Rows& v, const HeadState& h) const {
    const std::int64_t D = p.head_dim;
#if defined(FATTN_AVX512_BF16)
    if constexpr (std::is_same_v<Rows, typename DecodeValuesBf16<S>::Rows>)
      if (ws.dot_bf16) return DecodeValuesBf16<S>::accumulate(probs, rows, visible, nj, v, h.alpha, D, h.os);
#endif
    Ops::pv_accumulate(probs, rows, visible, nj, v, h.alpha, D, h.os);
  }

  // The item's rows: out and lse, or with split keys its chunk's partial (os, m, l).
  void finish(const typename Workspace::Item& it, float* memory) const {
    const std::int64_t Dp = ws.Dp;
    for (std::int64_t hk = it.hk_begin; hk < it.hk_end; ++hk) {
      HeadState h = state(hk - it.hk_begin);
      if (ws.query_lanes_for(it)) {  // ot into the rows layout, in the query tile's place
        QueryLanes::to_rows(h.os, it.rows, p.head_dim, Dp, h.qs);
        h.os = h.qs;
      }
      if (ws.splits == 1) {
        store_group_rows<S>(p, it.b, hk, it.r0, it.rows, h.os, h.m, h.l);
        continue;
      }
      float* part = memory + ws.partial_at(p, it.b, hk, it.row_tile, it.chunk);
      std::copy(h.os, h.os + it.rows * Dp, part);
      for (std::int64_t r = 0; r < it.rows; ++r) {
        part[it.rows * Dp + 2 * r] = h.m[r];
        part[it.rows * Dp + 2 * r + 1] = h.l[r];
      }
    }
  }
};

template <class S>
void decode_forward(const detail::Problem& p, const detail::Exec& exec, float* memory,
                    std::int64_t requested_splits) {
  using Ops = DecodeOps<S>;
  using Workspace = DecodeWorkspace<S>;
  const Workspace ws(p, exec.workers, requested_splits);
  const float q_factor = static_cast<float>(p.scale) * Ops::kLog2e;
  auto worker_of = [&](int worker) {
    return DecodeWorker<S>{p, ws, memory + worker * ws.worker_floats, q_factor};
  };
  // With split keys, the chunks of one (sequence, head group, row tile) count themselves
  // done here; the worker whose chunk comes last merges the partials. One parallel
  // section, not a second one for the merge: each section's start and end costs a wake-up
  // of every worker, on a busy machine a scheduler tick (docs/perf-log.md, 2026-11-27).
  // (make_unique value-initializes: every counter starts at 0.)
  std::unique_ptr<std::atomic<std::int64_t>[]> chunks_done;
  if (ws.splits > 1)
    chunks_done = std::make_unique<std::atomic<std::int64_t>[]>(
        static_cast<std::size_t>(ws.items / ws.splits));
  // The last chunk of a row tile: its partials, merged in chunk order whichever worker
  // finishes last, so the result has the same bits on every run.
  auto merge = [&](const typename Workspace::Item& it, const DecodeWorker<S>& run) {
    const HeadState h = run.state(0);
    for (std::int64_t hk = it.hk_begin; hk < it.hk_end; ++hk) {
      merge_partials<S>(ws, it.rows, memory + ws.partial_at(p, it.b, hk, it.row_tile, 0), h.os,
                        h.m, h.l);
      store_group_rows<S>(p, it.b, hk, it.r0, it.rows, h.os, h.m, h.l);
    }
  };

  // tiles_of(worker): where its key tiles come from, TilesInCache (the cache's elements
  // read where they lie) or its StagedTiles (float32 copies in its own buffers).
  auto run_items = [&](auto tiles_of) {
    detail::parallel_items(exec, ws.items, [&](std::int64_t index, int worker) {
      const DecodeWorker<S> run = worker_of(worker);
      const auto tiles = tiles_of(run);
      const auto it = ws.item(p, index);
      std::int64_t kv_begin, kv_end;
      ws.key_range(p, it, &kv_begin, &kv_end);
      run.start(it);
      for (std::int64_t j0 = kv_begin; j0 < kv_end; j0 += Ops::Bk)
        run.key_tile(it, j0, std::min<std::int64_t>(Ops::Bk, kv_end - j0), kv_end, tiles);
      run.finish(it, memory);
      // acq_rel: this chunk's partial is published to, and the others' seen by, the merger.
      if (ws.splits > 1 &&
          chunks_done[index / ws.splits].fetch_add(1, std::memory_order_acq_rel) == ws.splits - 1)
        merge(it, run);
    });
  };
  if (!ws.in_place) {
    run_items([](const DecodeWorker<S>& run) { return run.staged_tiles(); });
  } else {
    with_element_type(p.k, p.dtype, [&](const auto& k) {
      using E = std::remove_const_t<std::remove_reference_t<decltype(*k.data)>>;
      const TilesInCache<S, E> cache{p, k, detail::retype<const E>(p.v)};
      run_items([&](const DecodeWorker<S>&) { return cache; });
    });
  }
}

}  // namespace fattn::cpu
