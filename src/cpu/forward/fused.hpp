// fattn — the fused CPU kernel: the forward loop (cpu/forward/loop.hpp) with a query tile
// of one head as its unit, on K and V packed by the workspace.
//
// For one query tile:   qt ← Q·scale·log2(e)
//   for each key tile in the band:
//                       skip it if attn_mask hides it whole          (mask_cover)
//                       st ← K·qtᵀ                                   (scores_tile)
//                       softcap, ALiBi, attn_mask                   (score_mods.hpp)
//                       mask the tiles an edge of the band crosses  (mask_tile)
//                       m, l, st ← online softmax                   (softmax_update)
//                       st ← st ∘ dropout mask / (1 − p)            (DropoutOps)
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
// among them (cpu/amx/forward.hpp). Every mainloop takes every variant: the pass applies
// them (FusedPass).
#pragma once

#include <algorithm>

#include "cpu/common/dropout.hpp"
#include "cpu/common/score_mods.hpp"
#include "cpu/common/workspace.hpp"
#include "cpu/forward/loop.hpp"

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

// The forward loop's pass (cpu/forward/loop.hpp) for one work item: query tile `first`
// and the next ones of its head, up to query_tiles_per_item, each a unit, against the
// keys `head` holds; worker: the caller's worker index (its tile slots). p: the item's
// sequence's problem. The products and the softmax step come from `mainloop`
// (FmaMainloop, DotBf16Mainloop, AmxMainloop), which holds the prepared workspace; a
// mainloop may overlap one tile's softmax with the neighbouring tile's products (the AMX
// one does; `overlapped` names that neighbour).
template <class S, class Mainloop>
struct FusedPass {
  using Ops = TileOps<S>;
  using Mods = ScoreModOps<S>;
  using Band = typename Ops::Band;
  static constexpr int kMaxUnits = Ops::T::query_tiles_per_item, kKeyTile = Ops::Bc;
  static constexpr bool kSoftmaxAmongProducts = Mainloop::kSoftmaxAmongProducts;

  const detail::Problem& p;
  const Mainloop& mainloop;
  const typename Mainloop::Head& head;
  // The band's edges are hidden in the scores (−inf, by selection), unless the mainloop's
  // softmax hides the causal one and there is no other (a window's).
  const bool scores_hide_band;
  int n = 0;  // the item's tiles
  int live[kMaxUnits];  // the tiles that see the key tile in the loop
  std::int64_t first_key, kv_max = 0;  // the keys some tile of the item sees
  QueryTile q[kMaxUnits];
  typename Mainloop::Tile tile[kMaxUnits];
  typename Mods::Tile pairs[kMaxUnits];
  MaskCover cover[kMaxUnits];
  Band band[kMaxUnits];
  const Band* edge[kMaxUnits];  // null where no edge of the band crosses the tile

  // The item's tiles in: Q loaded, the running states started. The item's tiles end with
  // its sequence's (the workspace's q_tiles is the longest sequence's).
  FusedPass(const detail::Problem& problem, const Mainloop& m, const QueryTile& first, int worker,
            const typename Mainloop::Head& h)
      : p(problem), mainloop(m), head(h),
        scores_hide_band(!Mainloop::kSoftmaxHidesCausalEdge || problem.has_window()),
        first_key(problem.kv_len) {
    for (; n < kMaxUnits && (first.t + n) * Ops::Br < p.q_len; ++n) {
      q[n] = mainloop.ws.query_tile(p, first.b, first.h, first.t + n);
      tile[n] = mainloop.tile(worker * kMaxUnits + n);
      first_key = std::min(first_key, q[n].first_key_tile(Ops::Bc));
      kv_max = std::max(kv_max, q[n].kv_end);
      mainloop.load_q(p, q[n], tile[n]);
      Ops::start_rows(tile[n].m, tile[n].l, tile[n].ot, mainloop.out_dims());
    }
  }

  // The tiles that see some key of [j0, j0 + Bc) and that attn_mask does not hide whole.
  int visit(std::int64_t j0) {
    int n_live = 0;
    for (int s = 0; s < n; ++s) {
      if (j0 >= q[s].kv_end || j0 + Ops::Bc <= q[s].kv_begin) continue;
      pairs[s] = {q[s].b, q[s].h, q[s].i0, q[s].rows, j0,
                  std::min<std::int64_t>(Ops::Bc, q[s].kv_end - j0)};
      cover[s] = Mods::mask_cover(p, pairs[s]);
      if (cover[s] != MaskCover::hidden) live[n_live++] = s;
    }
    return n_live;
  }
  bool softmax_step(std::int64_t j0, int x, int) {
    const int s = live[x], before = x > 0 ? live[x - 1] : -1;
    const std::int64_t nj = pairs[s].nj;
    band[s] = Ops::band_of(p, j0, q[s].i0);
    edge[s] = p.needs_mask(q[s].i0, q[s].i0 + q[s].rows, j0, j0 + nj) ? &band[s] : nullptr;
    mainloop.scores(head, j0, nj, tile[s], edge[s], before >= 0 ? &tile[before] : nullptr);
    Mods::finish_scores(p, pairs[s], cover[s], scores_hide_band ? edge[s] : nullptr, tile[s].st);
    mainloop.softmax(tile[s], nj, edge[s]);
    // Dropout on the probabilities P·V takes (m and l keep the undropped sums); the AMX
    // mainloop, whose softmax runs among its products, is not asked (cpu_kernels).
    if constexpr (!kSoftmaxAmongProducts)
      if (p.dropout.on())
        DropoutOps<S>::apply(p.dropout, p.dropout.head_stream(q[s].b, q[s].h, p.q_heads),
                             q[s].i0, Ops::Br, j0, nj, Ops::Br, tile[s].st);
    return true;
  }
  void pv_step(std::int64_t j0, int x, int n_live) {
    const int s = live[x], after = x + 1 < n_live ? live[x + 1] : -1;
    mainloop.pv(head, j0, pairs[s].nj, tile[s], edge[s], after >= 0 ? &tile[after] : nullptr);
  }

  // The sinks joined, out ← ot / l, lse.
  void finish() {
    for (int s = 0; s < n; ++s) {
      if (p.mods.sinks) {
        Mods::add_sink(p, q[s].h, tile[s].m, tile[s].l, tile[s].alpha);
        Mods::scale_rows(tile[s].ot, mainloop.out_dims(), tile[s].alpha);
      }
      Ops::store_output(tile[s].ot, tile[s].l, p, q[s].b, q[s].h, q[s].i0, q[s].rows);
      Ops::store_lse(tile[s].m, tile[s].l, p, q[s].b, q[s].h, q[s].i0, q[s].rows);
    }
  }
};

// One work item through the forward loop: its tiles in, their visible key tiles, out.
template <class S, class Mainloop>
void fused_group(const detail::Problem& p, const Mainloop& mainloop, const QueryTile& first,
                 int worker, const typename Mainloop::Head& head) {
  FusedPass<S, Mainloop> pass(p, mainloop, first, worker, head);
  forward_loop(pass, pass.first_key, pass.kv_max);
  pass.finish();
}

// Every work item of the problem through fused_group, in one parallel section. A ragged
// problem's items span all its sequences but those marked elsewhere
// (model/ragged_schedule.hpp); an item reads its sequence's own problem
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
