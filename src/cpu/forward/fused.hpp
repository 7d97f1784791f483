// fattn — the fused CPU kernel: FlashAttention-2's loop on a CPU core.
//
// For one query tile:   qt ← Q·scale·log2(e)
//   for each key tile in the band:
//                       skip it if attn_mask hides it whole          (mask_cover)
//                       st ← K·qtᵀ                                   (scores_tile)
//                       softcap, ALiBi, attn_mask                   (score_mods.hpp)
//                       mask the tiles an edge of the band crosses  (mask_tile)
//                       m, l, st ← online softmax                   (softmax_update)
//                       ot ← alpha·ot + Vᵀ·st                       (pv_accumulate)
//   with sinks: the sink joins m and l                               (add_sink)
//   out ← otᵀ / l, lse ← ln(2)·(m + log2 l)
// A key tile is Bc×Br floats and stays in L1/L2: the Sq×Sk matrix never exists.
// Key tiles outside the band (causal limit, window) are never visited, so the work grows
// with the visible pairs; only the tiles an edge crosses are masked.
// A work item is query_tiles_per_item consecutive query tiles of one head that take
// each K/V tile in turn, so a K/V tile is read from L3 once for all of them.
// The products (scores_tile, pv_accumulate and the layouts they read) and the softmax step
// are the mainloop's policy: float32 FMAs (FmaMainloop); for bfloat16 with AVX512-BF16,
// bfloat16 dot products (cpu/forward/dot_bf16.hpp); on AMX, tile products with the softmax
// among them (cpu/amx/forward.hpp). Every mainloop takes every variant: the loop applies
// them.
#pragma once

#include <algorithm>

#include "cpu/common/score_mods.hpp"
#include "cpu/common/workspace.hpp"

namespace fattn::cpu {

// The products of the loop, on float32 FMAs: K panels and V rows of the workspace, the
// query tile transposed and pre-scaled (TileOps); the softmax update runs at once, between
// them. The other mainloops: cpu/forward/dot_bf16.hpp's, on bfloat16 dot products, and
// cpu/amx/forward.hpp's, on AMX tiles with the softmax among the products.
template <class S>
struct FmaMainloop {
  using Ops = TileOps<S>;
  using Band = typename Ops::Band;
  using Tile = typename Workspace<S>::Worker;  // qt, ot, m, l, alpha, st
  static constexpr bool kSoftmaxAmongProducts = false, kSoftmaxHidesCausalEdge = false;
  const Workspace<S>& ws;
  float q_factor;  // scale·log2(e)

  struct Head {
    const float* k_panels;
    const float* v;
    std::int64_t v_stride;
  };
  Head head(std::int64_t b, std::int64_t hk) const {
    Head h{ws.k_panels(b, hk), nullptr, 0};
    h.v = ws.v_rows(b, hk, &h.v_stride);
    return h;
  }
  Tile tile(int slot) const { return ws.worker(slot); }
  std::int64_t out_dims() const { return ws.p.head_dim; }  // ot [D][Br]
  void load_q(const detail::Problem& p, const QueryTile& q, const Tile& t) const {
    Ops::load_q_transposed(p.q, p.dtype, q.b, q.h, q.i0, q.rows, p.head_dim, q_factor, t.qt);
  }
  // The products out of line (here and in DotBf16Mainloop): inlined into the loop, the
  // bfloat16 products' accumulators spilled to the stack and the forward ran 15-22 % slower
  // (docs/perf-log.md, "one forward loop"); a call per tile costs nothing measurable.
  [[gnu::noinline]] void scores(const Head& h, std::int64_t j0, std::int64_t nj, const Tile& t,
                                const Band*, const Tile*) const {
    Ops::scores_tile(h.k_panels, j0, nj, t.qt, ws.p.head_dim, t.st);
  }
  void softmax(const Tile& t, std::int64_t nj, const Band*) const {
    Ops::softmax_update(t.st, nj, t.m, t.l, t.alpha);
  }
  [[gnu::noinline]] void pv(const Head& h, std::int64_t j0, std::int64_t nj, const Tile& t,
                            const Band* band, const Tile*) const {
    Ops::pv_accumulate(h.v + j0 * h.v_stride, h.v_stride, nj, t.st, t.alpha, ws.p.head_dim, t.ot, band);
  }
};

// The loop above for one work item: query tile `first` and the next ones of its head, up
// to query_tiles_per_item, against the keys `head` holds; worker: the caller's worker index
// (its tile slots). p: the item's sequence's problem. The products and the softmax step
// come from `mainloop` (FmaMainloop, DotBf16Mainloop, AmxMainloop), which holds the
// prepared workspace. Per key tile, the tiles that see it run their scores and softmax
// first, then their P·V: a mainloop may overlap one tile's softmax with the neighbouring
// tile's products (the AMX one does; `overlapped` names that neighbour).
template <class S, class Mainloop>
void fused_group(const detail::Problem& p, const Mainloop& mainloop, const QueryTile& first,
                 int worker, const typename Mainloop::Head& head) {
  using Ops = TileOps<S>;
  using Mods = ScoreModOps<S>;
  using Band = typename Ops::Band;
  constexpr int kGroup = Ops::T::query_tiles_per_item;
  const auto& ws = mainloop.ws;
  const std::int64_t dims = mainloop.out_dims();
  QueryTile q[kGroup];
  typename Mainloop::Tile tile[kGroup];
  int n = 0;
  std::int64_t first_key = p.kv_len, kv_max = 0;
  // The item's tiles end with its sequence's (ws.q_tiles is the longest sequence's).
  for (; n < kGroup && (first.t + n) * Ops::Br < p.q_len; ++n) {
    q[n] = ws.query_tile(p, first.b, first.h, first.t + n);
    tile[n] = mainloop.tile(worker * kGroup + n);
    first_key = std::min(first_key, q[n].first_key_tile(Ops::Bc));
    kv_max = std::max(kv_max, q[n].kv_end);
    mainloop.load_q(p, q[n], tile[n]);
    Ops::start_rows(tile[n].m, tile[n].l, tile[n].ot, dims);
  }
  // The band's edges are hidden in the scores (−inf, by selection), unless the mainloop's
  // softmax hides the causal one and there is no other (a window's).
  const bool scores_hide_band = !Mainloop::kSoftmaxHidesCausalEdge || p.has_window();
  typename Mods::Tile pairs[kGroup];
  MaskCover cover[kGroup];
  Band band[kGroup];
  const Band* edge[kGroup];  // null where no edge of the band crosses the tile
  for (std::int64_t j0 = first_key; j0 < kv_max; j0 += Ops::Bc) {
    int live[kGroup], n_live = 0;  // the tiles that see some key of this one
    for (int s = 0; s < n; ++s) {
      if (j0 >= q[s].kv_end || j0 + Ops::Bc <= q[s].kv_begin) continue;
      pairs[s] = {q[s].b, q[s].h, q[s].i0, q[s].rows, j0,
                  std::min<std::int64_t>(Ops::Bc, q[s].kv_end - j0)};
      cover[s] = Mods::mask_cover(p, pairs[s]);
      if (cover[s] != MaskCover::hidden) live[n_live++] = s;
    }
    // Scores, the variants and the softmax step of the x-th live tile, then its P·V.
    auto softmax_step = [&](int x) {
      const int s = live[x];
      const std::int64_t nj = pairs[s].nj;
      band[s] = Ops::band_of(p, j0, q[s].i0);
      edge[s] = p.needs_mask(q[s].i0, q[s].i0 + q[s].rows, j0, j0 + nj) ? &band[s] : nullptr;
      mainloop.scores(head, j0, nj, tile[s], edge[s], x > 0 ? &tile[live[x - 1]] : nullptr);
      Mods::finish_scores(p, pairs[s], cover[s], scores_hide_band ? edge[s] : nullptr, tile[s].st);
      mainloop.softmax(tile[s], nj, edge[s]);
    };
    auto pv_step = [&](int x) {
      const int s = live[x];
      mainloop.pv(head, j0, pairs[s].nj, tile[s], edge[s], x + 1 < n_live ? &tile[live[x + 1]] : nullptr);
    };
    // A softmax among the products runs every tile's softmax step before the first P·V
    // (each overlaps a neighbour's products); else each tile's P·V follows its softmax
    // while its scores are in L1 (the other order: float32 2-4 % slower at S = 1024-2048,
    // docs/perf-log.md, "one forward loop").
    if constexpr (Mainloop::kSoftmaxAmongProducts) {
      for (int x = 0; x < n_live; ++x) softmax_step(x);
      for (int x = 0; x < n_live; ++x) pv_step(x);
    } else {
      for (int x = 0; x < n_live; ++x) {
        softmax_step(x);
        pv_step(x);
      }
    }
  }
  for (int s = 0; s < n; ++s) {
    if (p.mods.sinks) {
      Mods::add_sink(p, q[s].h, tile[s].m, tile[s].l, tile[s].alpha);
      Mods::scale_rows(tile[s].ot, dims, tile[s].alpha);
    }
    Ops::store_output(tile[s].ot, tile[s].l, p, q[s].b, q[s].h, q[s].i0, q[s].rows);
    Ops::store_lse(tile[s].m, tile[s].l, p, q[s].b, q[s].h, q[s].i0, q[s].rows);
  }
}

// Every work item of the problem through fused_group, in one parallel section. A ragged
// problem's items span all its sequences but those marked elsewhere
// (cpu/common/ragged_items.hpp); an item reads its sequence's own problem
// (detail::SequenceOf).
template <class S, class Mainloop>
void fused_loop(const detail::Problem& whole, const detail::Exec& exec, const Mainloop& mainloop) {
  constexpr int kGroup = TileOps<S>::T::query_tiles_per_item;
  const auto& ws = mainloop.ws;
  detail::parallel_items(exec, ws.items(kGroup), [&](std::int64_t item, int worker) {
    const QueryTile first = ws.first_tile_of(item, kGroup);
    const detail::SequenceOf seq(whole, first.b);
    fused_group<S>(seq.get(), mainloop, first, worker, mainloop.head(first.b, first.hk));
  });
}

template <class S>
void fused_forward(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  Workspace<S> ws(p, /*is_naive=*/false, exec.workers);
  ws.base = memory;
  ws.prepare_kv(exec);
  fused_loop<S>(p, exec, FmaMainloop<S>{ws, static_cast<float>(p.scale) * TileOps<S>::kLog2e});
}

}  // namespace fattn::cpu
