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
#pragma once

#include <algorithm>

#include "cpu/workspace.hpp"

namespace fattn::cpu {

template <class S>
void fused_forward(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  using Ops = TileOps<S>;
  Workspace<S> ws(p, /*is_naive=*/false, exec.workers);
  ws.base = memory;
  ws.prepare_kv(exec);
  const float q_factor = static_cast<float>(p.scale) * Ops::kLog2e;

  detail::parallel_items(exec, ws.tile_items(), [&](std::int64_t item, int worker) {
    std::int64_t b, h, t;
    ws.tile_of(item, &b, &h, &t);
    const auto tile = ws.worker(worker);
    const std::int64_t i0 = t * Ops::Br;
    const std::int64_t rows = std::min<std::int64_t>(Ops::Br, p.q_len - i0);
    const std::int64_t hk = p.kv_head_of(h);
    std::int64_t v_stride;
    const float* v = ws.v_rows(b, hk, &v_stride);
    const float* k_panels = ws.k_panels(b, hk);

    Ops::load_q_transposed(p.q, b, h, i0, rows, p.head_dim, q_factor, tile.qt);
    Ops::start_rows(tile.m, tile.l, tile.ot, p.head_dim);

    const std::int64_t kv_end = p.kv_end(i0 + rows);
    for (std::int64_t j0 = 0; j0 < kv_end; j0 += Ops::Bc) {
      const std::int64_t nj = std::min<std::int64_t>(Ops::Bc, kv_end - j0);
      const typename Ops::Diagonal diag{j0, i0, p.causal_offset};
      const bool on_diagonal = p.needs_mask(i0, j0 + nj);
      Ops::scores_tile(k_panels, j0, nj, tile.qt, p.head_dim, tile.st);
      if (on_diagonal) Ops::mask_tile(tile.st, nj, diag);
      Ops::softmax_update(tile.st, nj, tile.m, tile.l, tile.alpha);
      Ops::pv_accumulate(v + j0 * v_stride, v_stride, nj, tile.st, tile.alpha, p.head_dim,
                         tile.ot, on_diagonal ? &diag : nullptr);
    }
    Ops::store_output(tile.ot, tile.l, p, b, h, i0, rows);
    Ops::store_lse(tile.m, tile.l, p, b, h, i0, rows);
  });
}

}  // namespace fattn::cpu
