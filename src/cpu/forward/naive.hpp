// fattn — the naive CPU baseline: three stages, the score matrix in memory.
//
//   stage 1  scores = Q·Kᵀ·scale      written to a B·Hq·Sq·Sk buffer
//   stage 2  P = softmax(scores)       in place: max pass, exp/sum pass, normalise pass
//   stage 3  O = P·V
// Each stage is a separate parallel loop over (batch, head, query tile) that finishes
// before the next starts — the CPU picture of three kernel launches. The stages use
// the fused kernel's own tile operations (same register-blocked FMA micro-kernels,
// same exp2), and skip the same key tiles outside the band, so fused vs naive measures
// the effect of fusion alone. The variants change the scores in stage 1 and the sinks
// join the softmax in stage 2.
#pragma once

#include <algorithm>

#include "model/stage_clock.hpp"
#include "cpu/common/score_mods.hpp"
#include "cpu/common/workspace.hpp"

namespace fattn::cpu {

// Stage 2: softmax of each query row of the score buffer, in place, and the logsumexp.
// Shared by the FMA and AMX naive paths: ws gives the items and the score buffer,
// scratch(worker) the per-worker m, l, alpha, ot.
template <class Ops, class Ws, class Scratch>
void naive_softmax_stage(const detail::Problem& p, const detail::Exec& exec, const Ws& ws,
                         Scratch scratch) {
  using Mods = ScoreModOps<typename Ops::Simd>;
  detail::parallel_items(exec, ws.items(1), [&](std::int64_t item, int worker) {
    const auto x = ws.first_tile_of(item, 1);
    const auto tile = scratch(worker);
    const std::int64_t k0 = x.first_key_tile(Ops::Bc);
    const std::int64_t n = std::max<std::int64_t>(x.kv_end - k0, 0);
    float* scores = ws.scores(x.b, x.h, x.t) + k0 * Ops::Br;
    if (p.needs_mask(x.i0, x.i0 + x.rows, k0, k0 + n))
      Ops::mask_tile(scores, n, Ops::band_of(p, k0, x.i0));
    Ops::start_rows(tile.m, tile.l, tile.ot, 0);
    Ops::softmax_update(scores, n, tile.m, tile.l, tile.alpha);
    if (p.mods.sinks) {
      Mods::add_sink(p, x.h, tile.m, tile.l, tile.alpha);
      Mods::scale_rows(scores, n, tile.alpha);
    }
    Ops::normalize_rows(scores, n, tile.l);
    Ops::store_lse(tile.m, tile.l, p, x.b, x.h, x.i0, x.rows);
  });
}

// The naive paths' variants on one query tile's scores of keys [k0, kv_end) (scores and
// cap_grads hold key k0 first), key tile by key tile: a tile the mask hides whole becomes
// −inf without reading the rest of it. cap_grads (the backward with a softcap, else null)
// receives 1 − tanh², 0 on hidden tiles.
template <class S>
void naive_score_mods(const detail::Problem& p, const QueryTile& x, std::int64_t k0,
                      float* scores, float* cap_grads = nullptr) {
  using Ops = TileOps<S>;
  using Mods = ScoreModOps<S>;
  for (std::int64_t j0 = k0; j0 < x.kv_end; j0 += Ops::Bc) {
    const typename Mods::Tile pairs{x.b, x.h, x.i0, x.rows, j0,
                                    std::min<std::int64_t>(Ops::Bc, x.kv_end - j0)};
    float* st = scores + (j0 - k0) * Ops::Br;
    float* cap = cap_grads ? cap_grads + (j0 - k0) * Ops::Br : nullptr;
    const MaskCover cover = Mods::mask_cover(p, pairs);
    if (cover == MaskCover::hidden) {
      std::fill_n(st, pairs.nj * Ops::Br, Ops::kNegInf);
      if (cap) std::fill_n(cap, pairs.nj * Ops::Br, 0.0f);
    } else {
      Mods::apply(p, pairs, cover, st, cap);
    }
  }
}

template <class S>
void naive_forward(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  using Ops = TileOps<S>;
  detail::StageClock clock;  // reported through p.naive_stages
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
    const std::int64_t k0 = x.first_key_tile(Ops::Bc);
    if (x.kv_end <= k0) return;
    float* scores = ws.scores(x.b, x.h, x.t) + k0 * Ops::Br;
    Ops::load_q_transposed(p.q, p.dtype, x.b, x.h, x.i0, x.rows, p.head_dim, q_factor, tile.qt);
    Ops::scores_tile(ws.k_panels(x.b, x.hk), k0, x.kv_end - k0, tile.qt, p.head_dim, scores);
    if (p.mods.any()) naive_score_mods<S>(p, x, k0, scores);
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
    for (std::int64_t j0 = x.first_key_tile(Ops::Bc); j0 < x.kv_end; j0 += Ops::Bc) {
      const std::int64_t nj = std::min<std::int64_t>(Ops::Bc, x.kv_end - j0);
      const typename Ops::Band band = Ops::band_of(p, j0, x.i0);
      const bool on_edge = p.needs_mask(x.i0, x.i0 + x.rows, j0, j0 + nj);
      Ops::pv_accumulate(v + j0 * v_stride, v_stride, nj, probs + j0 * Ops::Br, tile.ones,
                         p.head_dim, tile.ot, on_edge ? &band : nullptr);
    }
    Ops::store_output(tile.ot, tile.ones, p, x.b, x.h, x.i0, x.rows);
  });
  seconds.output = clock.lap();
  if (p.naive_stages) *p.naive_stages = seconds;
}

}  // namespace fattn::cpu
