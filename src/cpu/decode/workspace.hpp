// fattn — the decode kernel's working memory and work items (DecodeWorkspace), where an
// item's key tiles come from (TilesInCache, StagedTiles), and the rows' last steps: the
// split partials' merge and the output.
#pragma once

#include <algorithm>
#include <cstdint>

#include "model/problem.hpp"
#include "cpu/decode/mods.hpp"
#include "cpu/decode/ops.hpp"
#include "cpu/decode/query_lanes.hpp"
#include "cpu/common/online_softmax.hpp"
#include "cpu/common/workspace.hpp"
#include "cpu/kernels.hpp"

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
  // running states (qs, os, m, l) side by side: as many heads as their states (and
  // staged tiles, where staged) fit this many floats (1 MiB, half of L2). Read in place,
  // the tiles take no room: an item whose heads cover only part of each key's row (MHA,
  // 32 kv heads: 10 heads a item when the staging room counted) reads 5 KB of every 16 KB
  // and decoded 14-16 GB/s where all 32 heads, reading whole rows, decode 19-20
  // (dev-zen4, docs/perf-log.md 2026-12-06).
  static constexpr std::int64_t kItemFloats = 262144;
  // Split the keys until there are this many items per worker (load balance across the
  // dynamic schedule) ...
  static constexpr std::int64_t kItemsPerWorker = 4;
  // ... but not into chunks under this many keys (each chunk costs a partial and a merge).
  static constexpr std::int64_t kMinChunkKeys = 512;
  // The software prefetch asks for the rows of the key tile after the one it computes
  // (TilesInCache::next_tile). Measured against the other distances and against the
  // hardware prefetchers alone (decode, B 1, Hq 32, Hkv 8, D 128, 32k keys, float32,
  // 2 threads, GB/s): on dev-zen3 (AVX2) 1 tile 11.8-15.4, 2 tiles 11.4-11.7, none
  // 8.8-10.9 (docs/perf-log.md, 2026-12-07); Options::decode_prefetch_tiles sweeps it.
  static constexpr int kPrefetchTiles = 1;
  // ... into the cache level decode_prefetch_level_choice() probed for this core (L2 where
  // the core keeps PREFETCHT1 there, else L1; src/cpu/prefetch_level.cpp).

  // K and V read where they lie (DecodeOps::reads_in_place), else staged tile by tile.
  bool in_place;
  // The tiles' layout: query rows along the lanes (DecodeQueryLanes) for the items that
  // take it (query_lanes_for), keys along them (DecodeOps) for the others. lane_rows: the
  // rows of the running states and scores, its Br where any item takes query lanes.
  bool query_lanes;
  std::int64_t lane_rows;
  std::int64_t rows, tile_rows, row_tiles, heads_per_item, head_groups, splits, items, D, Dp;
  bool short_cache_heads = false;  // heads_per_item cut to give every worker an item
  int prefetch_tiles;  // key tiles ahead the software prefetch asks for (0: none)
  int prefetch_level;  // the cache level it fills (1: L1, 2: L2; 0: no prefetch)
  // Floats from the start of the working memory; per head: qs, os, m, l, alpha, and the
  // query rows' bfloat16 bits qb where the scores use them (on_bf16_dot_products).
  std::int64_t worker_floats, head_floats, kt_at, st_at, heads_at, k_stage_at, v_stage_at;
  std::int64_t qs_at, os_at, m_at, l_at, alpha_at, qb_at;  // within a head's state
  bool dot_bf16;
  std::int64_t partial_floats, partials_at, total;

  // request.splits: 0 picks by the rule above; n > 0 asks for n (capped at one per key
  // tile). request.prefetch_tiles: -1 takes kPrefetchTiles; staged tiles take none;
  // request.prefetch_level: -1 takes decode_prefetch_level_choice().
  DecodeWorkspace(const detail::Problem& p, int workers, const DecodeRequest& request = {}) {
    Sizes n;
    dot_bf16 = on_bf16_dot_products<S>(p.dtype);  // the scores from the query rows' bits
    D = p.head_dim;
    Dp = Ops::padded_dim(D);
    rows = n.mul(p.group_size(), p.q_len);
    tile_rows = std::min(rows, kRowTile);
    row_tiles = n.div_up(rows, kRowTile);
    // A q8_0 cache is staged where the query-lane tiles take the item (they read float32
    // rows; staged once, a tile serves 48-64 rows), else read in place.
    in_place = Ops::reads_in_place(p) &&
               !(p.kv_q8_0 && DecodeQueryLanes<S>::applies(p, true, false) &&
                 DecodeQueryLanes<S>::takes(tile_rows));
    prefetch_tiles = request.prefetch_tiles < 0 ? kPrefetchTiles : request.prefetch_tiles;
    if (!in_place) prefetch_tiles = 0;  // staged tiles: nothing read where it lies to ask for
    prefetch_level = prefetch_tiles == 0         ? 0
                     : request.prefetch_level < 0 ? decode_prefetch_level_choice().level
                                                  : request.prefetch_level;
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
    const std::int64_t item_head_floats = head_floats + (in_place ? 0 : 2 * stage_floats);
    heads_per_item = std::clamp<std::int64_t>(kItemFloats / item_head_floats, 1, p.kv_heads);
    std::int64_t max_keys = 0;
    for (std::int64_t b = 0; b < p.batch; ++b) max_keys = std::max(max_keys, p.keys_of(b));
    // The most key chunks the split rule below may cut.
    const std::int64_t most_chunks = std::max<std::int64_t>(1, max_keys / kMinChunkKeys);
    // Keys too few for two chunks and fewer (sequence, row tile) pairs than workers: the
    // heads are dealt out among the workers instead, so that a short cache is not decoded on
    // one core while the others wait. An item then reads part of each key's row, which
    // costs streaming rate at long contexts, not here: the whole cache is under
    // 2·kMinChunkKeys keys.
    const std::int64_t row_items = n.mul(p.batch, row_tiles);
    if (request.splits <= 0 && most_chunks == 1 && row_items < workers) {
      const std::int64_t groups = std::min(p.kv_heads, n.div_up(workers, row_items));
      const std::int64_t dealt = n.div_up(p.kv_heads, groups);
      short_cache_heads = dealt < heads_per_item;
      heads_per_item = std::min(heads_per_item, dealt);
    }
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

    const std::int64_t base = n.mul(row_items, head_groups);
    const std::int64_t key_tiles = std::max<std::int64_t>(1, n.div_up(max_keys, Ops::Bk));
    if (request.splits > 0) {
      splits = std::min(request.splits, key_tiles);
    } else {
      const std::int64_t wanted = n.div_up(kItemsPerWorker * workers, std::max<std::int64_t>(base, 1));
      splits = std::clamp<std::int64_t>(wanted, 1, most_chunks);
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
    store_row(p.out, p.out_dtype(), b, h, i, D, os + r * Dp, Ops::reciprocal(l[r]));
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
  // The rows of the item's key tile `ahead` tiles after the one at j0 (none past kv_end,
  // none for ahead 0), asked for into cache level `level` (1 or 2): every head's K rows,
  // then every head's V rows, each in the order they lie in memory. (Farther than one
  // tile, the tiles between are left to the hardware prefetchers at a chunk's start.)
  typename Ops::Prefetch next_tile(const Item& it, std::int64_t j0, std::int64_t kv_end,
                                   int ahead, int level) const {
    using Prefetch = typename Ops::Prefetch;
    const std::int64_t j = j0 + ahead * Ops::Bk, rows = std::min<std::int64_t>(Ops::Bk, kv_end - j);
    if (ahead == 0 || rows <= 0) return {};
    const std::int64_t heads = it.hk_end - it.hk_begin;
    return {Prefetch::span_of(k_rows(it, it.hk_begin, j, rows), k.head, heads, rows),
            Prefetch::span_of(v_rows(it, it.hk_begin, j, rows), v.head, heads, rows),
            row_bytes_of<E>(p.head_dim), level == 2};
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
  typename Ops::Prefetch next_tile(const Item&, std::int64_t, std::int64_t, int, int) const { return {}; }
};

}  // namespace fattn::cpu
