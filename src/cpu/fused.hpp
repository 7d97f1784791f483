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
#pragma once

#include <algorithm>

#include "cpu/score_mods.hpp"
#include "cpu/workspace.hpp"

namespace fattn::cpu {

template <class S>
void fused_forward(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  using Ops = TileOps<S>;
  using Mods = ScoreModOps<S>;
  constexpr int kGroup = Ops::T::query_tiles_per_item;
  Workspace<S> ws(p, /*is_naive=*/false, exec.workers);
  ws.base = memory;
  ws.prepare_kv(exec);
  const float q_factor = static_cast<float>(p.scale) * Ops::kLog2e;

  detail::parallel_items(exec, ws.items(kGroup), [&](std::int64_t item, int worker) {
    const auto first = ws.first_tile_of(item, kGroup);
    std::int64_t v_stride;
    const float* v = ws.v_rows(first.b, first.hk, &v_stride);
    const float* k_panels = ws.k_panels(first.b, first.hk);
    typename Workspace<S>::QueryTile q[kGroup];
    typename Workspace<S>::Worker tile[kGroup];
    int n = 0;
    std::int64_t first_key = p.kv_len, kv_max = 0;
    for (; n < kGroup && first.t + n < ws.q_tiles; ++n) {
      q[n] = ws.query_tile(first.b, first.h, first.t + n);
      tile[n] = ws.worker(worker * kGroup + n);
      first_key = std::min(first_key, q[n].first_key_tile(Ops::Bc));
      kv_max = std::max(kv_max, q[n].kv_end);
      Ops::load_q_transposed(p.q, p.dtype, q[n].b, q[n].h, q[n].i0, q[n].rows, p.head_dim, q_factor,
                             tile[n].qt);
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
        Ops::scores_tile(k_panels, j0, pairs.nj, tile[s].qt, p.head_dim, tile[s].st);
        if (p.mods.any()) Mods::apply(p, pairs, cover, tile[s].st);
        if (on_edge) Ops::mask_tile(tile[s].st, pairs.nj, band);
        Ops::softmax_update(tile[s].st, pairs.nj, tile[s].m, tile[s].l, tile[s].alpha);
        Ops::pv_accumulate(v + j0 * v_stride, v_stride, pairs.nj, tile[s].st, tile[s].alpha,
                           p.head_dim, tile[s].ot, on_edge ? &band : nullptr);
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

}  // namespace fattn::cpu
