// fattn — the fused CPU kernel: FlashAttention-2's loop on a CPU core.
//
// For one query tile:   qt ← Q·scale·log2(e)
//   for each key tile:  st ← K·qtᵀ               (scores_tile)
//                       mask the diagonal tile   (mask_tile, causal only)
//                       m, l, st ← online softmax (softmax_update)
//                       ot ← alpha·ot + Vᵀ·st     (pv_accumulate)
//   out ← otᵀ / l, lse ← ln(2)·(m + log2 l)
// A key tile is Bc×Br floats and stays in L1/L2: the Sq×Sk matrix never exists.
// Key tiles past the causal limit are skipped; only diagonal tiles are masked.
// A work item is query_tiles_per_item consecutive query tiles of one head that take
// each K/V tile in turn, so a K/V tile is read from L3 once for all of them.
#pragma once

#include <algorithm>

#include "cpu/workspace.hpp"

namespace fattn::cpu {

template <class S>
void fused_forward(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  using Ops = TileOps<S>;
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
    std::int64_t kv_max = 0;
    for (; n < kGroup && first.t + n < ws.q_tiles; ++n) {
      q[n] = ws.query_tile(first.b, first.h, first.t + n);
      tile[n] = ws.worker(worker * kGroup + n);
      kv_max = std::max(kv_max, q[n].kv_end);
      Ops::load_q_transposed(p.q, p.dtype, q[n].b, q[n].h, q[n].i0, q[n].rows, p.head_dim, q_factor,
                             tile[n].qt);
      Ops::start_rows(tile[n].m, tile[n].l, tile[n].ot, p.head_dim);
    }
    for (std::int64_t j0 = 0; j0 < kv_max; j0 += Ops::Bc) {
      for (int s = 0; s < n; ++s) {
        if (j0 >= q[s].kv_end) continue;
        const std::int64_t nj = std::min<std::int64_t>(Ops::Bc, q[s].kv_end - j0);
        const typename Ops::Diagonal diag{j0, q[s].i0, p.causal_offset};
        const bool on_diagonal = p.needs_mask(q[s].i0, j0 + nj);
        Ops::scores_tile(k_panels, j0, nj, tile[s].qt, p.head_dim, tile[s].st);
        if (on_diagonal) Ops::mask_tile(tile[s].st, nj, diag);
        Ops::softmax_update(tile[s].st, nj, tile[s].m, tile[s].l, tile[s].alpha);
        Ops::pv_accumulate(v + j0 * v_stride, v_stride, nj, tile[s].st, tile[s].alpha,
                           p.head_dim, tile[s].ot, on_diagonal ? &diag : nullptr);
      }
    }
    for (int s = 0; s < n; ++s) {
      Ops::store_output(tile[s].ot, tile[s].l, p, q[s].b, q[s].h, q[s].i0, q[s].rows);
      Ops::store_lse(tile[s].m, tile[s].l, p, q[s].b, q[s].h, q[s].i0, q[s].rows);
    }
  });
}

}  // namespace fattn::cpu
