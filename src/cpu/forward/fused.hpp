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
// The products (scores_tile, pv_accumulate and the layouts they read) are the mainloop's
// policy: float32 FMAs (FmaMainloop) or, for bfloat16 with AVX512-BF16, bfloat16 dot
// products (cpu/forward/dot_bf16.hpp).
#pragma once

#include <algorithm>

#include "cpu/common/score_mods.hpp"
#include "cpu/common/workspace.hpp"

namespace fattn::cpu {

// The products of the loop, on float32 FMAs: K panels and V rows of the workspace, the
// query tile transposed and pre-scaled (TileOps). The other mainloop is
// cpu/forward/dot_bf16.hpp's, on bfloat16 dot products.
template <class S>
struct FmaMainloop {
  using Ops = TileOps<S>;
  using Tile = typename Workspace<S>::Worker;  // qt, ot, m, l, alpha, st
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
  void load_q(const detail::Problem& p, const QueryTile& q, const Tile& t) const {
    Ops::load_q_transposed(p.q, p.dtype, q.b, q.h, q.i0, q.rows, p.head_dim, q_factor, t.qt);
  }
  void scores(const Head& h, std::int64_t j0, std::int64_t nj, const Tile& t) const {
    Ops::scores_tile(h.k_panels, j0, nj, t.qt, ws.p.head_dim, t.st);
  }
  void pv(const Head& h, std::int64_t j0, std::int64_t nj, const Tile& t,
          const typename Ops::Band* band) const {
    Ops::pv_accumulate(h.v + j0 * h.v_stride, h.v_stride, nj, t.st, t.alpha, ws.p.head_dim, t.ot, band);
  }
};

// The loop above, its products from `mainloop` (FmaMainloop, DotBf16Mainloop), which holds
// the prepared workspace. A ragged problem's items span all its sequences (cpu/common/ragged_items.hpp);
// an item reads its sequence's own problem (detail::SequenceOf).
template <class S, class Mainloop>
void fused_loop(const detail::Problem& whole, const detail::Exec& exec, const Mainloop& mainloop) {
  using Ops = TileOps<S>;
  using Mods = ScoreModOps<S>;
  constexpr int kGroup = Ops::T::query_tiles_per_item;
  const auto& ws = mainloop.ws;

  detail::parallel_items(exec, ws.items(kGroup), [&](std::int64_t item, int worker) {
    const QueryTile first = ws.first_tile_of(item, kGroup);
    const detail::SequenceOf seq(whole, first.b);
    const detail::Problem& p = seq.get();
    const auto head = mainloop.head(first.b, first.hk);
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
      Ops::start_rows(tile[n].m, tile[n].l, tile[n].ot, p.head_dim);
    }
    for (std::int64_t j0 = first_key; j0 < kv_max; j0 += Ops::Bc) {
      for (int s = 0; s < n; ++s) {
        if (j0 >= q[s].kv_end || j0 + Ops::Bc <= q[s].kv_begin) continue;
        const typename Mods::Tile pairs{q[s].b, q[s].h, q[s].i0, q[s].rows, j0,
                                        std::min<std::int64_t>(Ops::Bc, q[s].kv_end - j0)};
        const MaskCover cover = Mods::mask_cover(p, pairs);
        if (cover == MaskCover::hidden) continue;
        const typename Ops::Band band = Ops::band_of(p, j0, q[s].i0);
        const bool on_edge = p.needs_mask(q[s].i0, q[s].i0 + q[s].rows, j0, j0 + pairs.nj);
        mainloop.scores(head, j0, pairs.nj, tile[s]);
        Mods::finish_scores(p, pairs, cover, on_edge ? &band : nullptr, tile[s].st);
        Ops::softmax_update(tile[s].st, pairs.nj, tile[s].m, tile[s].l, tile[s].alpha);
        mainloop.pv(head, j0, pairs.nj, tile[s], on_edge ? &band : nullptr);
      }
    }
    for (int s = 0; s < n; ++s) {
      if (p.mods.sinks) {
        Mods::add_sink(p, q[s].h, tile[s].m, tile[s].l, tile[s].alpha);
        Mods::scale_rows(tile[s].ot, p.head_dim, tile[s].alpha);
      }
      Ops::store_output(tile[s].ot, tile[s].l, p, q[s].b, q[s].h, q[s].i0, q[s].rows);
      Ops::store_lse(tile[s].m, tile[s].l, p, q[s].b, q[s].h, q[s].i0, q[s].rows);
    }
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
