// fattn — the naive CPU baseline: three stages, the score matrix in memory.
//
//   stage 1  scores = Q·Kᵀ·scale      written to a B·Hq·Sq·Sk buffer
//   stage 2  P = softmax(scores)       in place: max pass, exp/sum pass, normalise pass
//   stage 3  O = P·V
// Each stage is a separate parallel loop over (batch, head, query tile) that finishes
// before the next starts — the CPU picture of three kernel launches. The stages use
// the fused kernel's own tile operations (same register-blocked FMA micro-kernels,
// same exp2), and skip the same fully masked key tiles, so fused vs naive measures
// the effect of fusion alone.
#pragma once

#include <algorithm>

#include "core/diagnostics.hpp"
#include "cpu/workspace.hpp"

namespace fattn::cpu {

// Stage 2: softmax of each query row of the score buffer, in place, and the logsumexp.
// Shared by the FMA and AMX naive paths: ws gives the items and the score buffer,
// scratch(worker) the per-worker m, l, alpha, ot.
template <class Ops, class Ws, class Scratch>
void naive_softmax_stage(const detail::Problem& p, const detail::Exec& exec, const Ws& ws,
                         Scratch scratch) {
  detail::parallel_items(exec, ws.items(1), [&](std::int64_t item, int worker) {
    const auto x = ws.first_tile_of(item, 1);
    const auto tile = scratch(worker);
    float* scores = ws.scores(x.b, x.h, x.t);
    if (p.needs_mask(x.i0, x.kv_end))
      Ops::mask_tile(scores, x.kv_end, typename Ops::Diagonal{0, x.i0, p.causal_offset});
    Ops::start_rows(tile.m, tile.l, tile.ot, 0);
    Ops::softmax_update(scores, x.kv_end, tile.m, tile.l, tile.alpha);
    Ops::normalize_rows(scores, x.kv_end, tile.l);
    Ops::store_lse(tile.m, tile.l, p, x.b, x.h, x.i0, x.rows);
  });
}

template <class S>
void naive_forward(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  using Ops = TileOps<S>;
  detail::StageClock clock;  // fattn::last_naive_stage_seconds()
  NaiveStageSeconds seconds;
  Workspace<S> ws(p, /*is_naive=*/true, exec.workers);
  ws.base = memory;
  ws.prepare_kv(exec);
  seconds.prepare = clock.lap();
  const float q_factor = static_cast<float>(p.scale) * Ops::kLog2e;
  // Stage 1: scores.
  detail::parallel_items(exec, ws.items(1), [&](std::int64_t item, int worker) {
    const auto x = ws.first_tile_of(item, 1);
    const auto tile = ws.worker(worker);
    Ops::load_q_transposed(p.q, p.dtype, x.b, x.h, x.i0, x.rows, p.head_dim, q_factor, tile.qt);
    Ops::scores_tile(ws.k_panels(x.b, x.hk), 0, x.kv_end, tile.qt, p.head_dim,
                     ws.scores(x.b, x.h, x.t));
  });
  seconds.scores = clock.lap();

  // Stage 2: softmax of each query row, in place; logsumexp.
  naive_softmax_stage<Ops>(p, exec, ws, [&](int worker) { return ws.worker(worker); });
  seconds.softmax = clock.lap();

  // Stage 3: O = P·V, key tile by key tile as in the fused kernel.
  detail::parallel_items(exec, ws.items(1), [&](std::int64_t item, int worker) {
    const auto x = ws.first_tile_of(item, 1);
    const auto tile = ws.worker(worker);
    const float* probs = ws.scores(x.b, x.h, x.t);
    std::int64_t v_stride;
    const float* v = ws.v_rows(x.b, x.hk, &v_stride);
    Ops::start_rows(tile.m, tile.l, tile.ot, p.head_dim);
    for (int i = 0; i < Ops::Br; ++i) tile.ones[i] = 1.0f;
    for (std::int64_t j0 = 0; j0 < x.kv_end; j0 += Ops::Bc) {
      const std::int64_t nj = std::min<std::int64_t>(Ops::Bc, x.kv_end - j0);
      const typename Ops::Diagonal diag{j0, x.i0, p.causal_offset};
      Ops::pv_accumulate(v + j0 * v_stride, v_stride, nj, probs + j0 * Ops::Br, tile.ones,
                         p.head_dim, tile.ot, p.needs_mask(x.i0, j0 + nj) ? &diag : nullptr);
    }
    Ops::store_output(tile.ot, tile.ones, p, x.b, x.h, x.i0, x.rows);
  });
  seconds.output = clock.lap();
  detail::record_naive_stage_seconds(seconds);
}

}  // namespace fattn::cpu
