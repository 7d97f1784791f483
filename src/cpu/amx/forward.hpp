// fattn — the AMX forward kernels: the fused kernel's loop and the naive baseline with
// Q·Kᵀ and P·V on AMX tiles (cpu/amx/ops.hpp), the softmax on AVX-512 as in the FMA kernel.
//
// For one query tile:   Q parts ← split(Q·scale·log2(e))
//   for each key tile:  st ← K·Qᵀ                 (scores_tile: six bf16 products)
//                       the variants (ScoreModOps::finish_scores, as the FMA kernel)
//                       mask, online softmax, P parts ← split(P), alpha·ot
//                                                 (SoftmaxTask, cpu/amx/softmax.hpp)
//                       ot ← ot + Vᵀ·P             (pv_tile)
//   out ← otᵀ / l, lse                          (the sinks joined first, as fused.hpp)
// K and Vᵀ are split once per call and kv head: in a pass before the queries, or (fused,
// with kv heads enough) by the work item of that head right before it uses them. Inputs
// with a NaN, an Inf or a value above 3e38 do not split exactly: the call then runs the
// AVX-512 FMA kernels, whose NaN/Inf semantics the tests pin down (found while splitting;
// in the per-head mode after other heads' outputs were written, which the rerun replaces).
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BW__)
#include <algorithm>
#include <atomic>

#include "model/stage_clock.hpp"
#include "cpu/amx/ops.hpp"
#include "cpu/amx/softmax.hpp"
#include "cpu/kernels.hpp"
#include "cpu/forward/naive.hpp"
#include "cpu/common/score_mods.hpp"
#include "cpu/common/workspace.hpp"

namespace fattn::cpu {

template <class S>
struct AmxWorkspace
    : QueryTiling<AmxWorkspace<S>, AmxOps<S>::Br, AmxOps<S>::Fma::T::query_tiles_per_item> {
  using Ops = AmxOps<S>;
  static constexpr int Br = Ops::Br, Bc = Ops::Bc;

  struct Slot {
    float *qt, *ot, *m, *l, *alpha, *ones, *st;
    bf16 *q_parts, *p_parts;
  };

  // Head-local split (fused only): with kv heads enough to keep every worker busy, a
  // work item is one kv head with its query heads, and its worker splits that head's K
  // and V into its own buffer (L2-resident up to ~1 MiB a head) right before using them.
  // Otherwise the parts of every head are split first, in a pass of its own that writes
  // them to memory and reads them back: 4-21 % of a call at S = 512-4096. Head-local was
  // 7-27 % faster at S = 512-2048 and 3-14 % at S=2048-4096 with D=128, 4096 with D=64
  // (heads of 3.2 MiB; docs/perf-log.md, "AMX kernels").
  static constexpr int kLocalHeadsPerWorker = 4;  // items per worker for the dynamic schedule

  const detail::Problem& p;
  bool naive, local = false;
  std::int64_t q_tiles, kv_pad, dim_pad, q_parts, p_parts, head_floats, scores_block,
      slot_floats;
  std::int64_t k_at, v_at, scores_at, slots_at, total;
  // Within a worker's slot.
  std::int64_t qt_at, ot_at, m_at, l_at, alpha_at, ones_at, st_at, q_parts_at, p_parts_at;
  float* base = nullptr;

  AmxWorkspace(const detail::Problem& problem, bool is_naive, int workers)
      : p(problem), naive(is_naive) {
    Sizes n;
    q_tiles = n.div_up(p.q_len, Br);
    kv_pad = n.mul(n.div_up(p.kv_len, Bc), Bc);
    dim_pad = Ops::round_up(p.head_dim);  // head_dim <= 256: small products below
    q_parts = Ops::kParts * dim_pad * Br;  // bf16
    p_parts = Ops::kParts * Bc * Br;
    const std::int64_t kv_heads = p.batch * p.kv_heads;
    // K or Vᵀ parts of one head: 3·kv_pad·Dp bf16, two a float (a multiple of 16 floats).
    head_floats = n.mul(n.mul(Ops::kParts, kv_pad), dim_pad) / 2;
    local = !naive && kv_heads >= std::int64_t{kLocalHeadsPerWorker} * workers;
    const std::int64_t held_heads = local ? workers : kv_heads;  // K/V part buffers
    scores_block = n.mul(kv_pad, Br);
    Layout slot;  // dim_pad ≤ 256 and the tiles: no overflow
    qt_at = slot.take(dim_pad * Br);
    ot_at = slot.take(dim_pad * Br);
    m_at = slot.take(Br);
    l_at = slot.take(Br);
    alpha_at = slot.take(Br);
    ones_at = slot.take(Br);
    st_at = slot.take(static_cast<std::int64_t>(Bc) * Br);
    q_parts_at = slot.take(q_parts / 2);  // bf16, two a float
    p_parts_at = slot.take(p_parts / 2);
    slot_floats = slot.end;
    Layout all;
    k_at = all.take(n.mul(held_heads, head_floats));
    v_at = all.take(n.mul(held_heads, head_floats));
    scores_at = all.take(this->naive_scores_floats(n));
    slots_at = all.take(n.mul(this->slots(workers), slot_floats));
    total = n.overflow || all.n.overflow ? -1 : all.end;
  }

  // K and Vᵀ parts: of kv head `held` (b·kv_heads + hk), or in local mode of worker `held`.
  bf16* k_parts(std::int64_t held) const {
    return reinterpret_cast<bf16*>(base + k_at + held * head_floats);
  }
  bf16* v_parts(std::int64_t held) const {
    return reinterpret_cast<bf16*>(base + v_at + held * head_floats);
  }
  const bf16* k_parts(std::int64_t b, std::int64_t hk) const { return k_parts(b * p.kv_heads + hk); }
  const bf16* v_parts(std::int64_t b, std::int64_t hk) const { return v_parts(b * p.kv_heads + hk); }

  // Splits kv head (b, hk) into buffer `held` and checks query head rows [h_begin, h_end)
  // of Q. False: some value does not split exactly (NaN, Inf, |x| > 3e38).
  bool split_head(std::int64_t b, std::int64_t hk, std::int64_t h_begin, std::int64_t h_end,
                  std::int64_t held) const {
    bool ok = Ops::pack_k(p.k, b, hk, p.kv_len, p.head_dim, k_parts(held));
    ok &= Ops::pack_v_transposed(p.v, b, hk, p.kv_len, p.head_dim, v_parts(held));
    for (std::int64_t h = h_begin; ok && h < h_end; ++h)
      ok &= Ops::splittable_rows(p.q, b, h, p.q_len, p.head_dim);
    return ok;
  }
  Slot slot(int w) const {
    float* s = base + slots_at + w * slot_floats;
    return {s + qt_at,    s + ot_at,   s + m_at,
            s + l_at,     s + alpha_at, s + ones_at,
            s + st_at,    reinterpret_cast<bf16*>(s + q_parts_at),
            reinterpret_cast<bf16*>(s + p_parts_at)};
  }

  // Splits every kv head's K and Vᵀ into parts and checks Q. False: some input value
  // does not split exactly (NaN, Inf, |x| > 3e38), and the caller runs the FMA kernel.
  bool prepare(const detail::Exec& exec) const {
    std::atomic<bool> splittable{true};
    detail::parallel_items(exec, p.batch * p.kv_heads, [&](std::int64_t item, int) {
      const std::int64_t b = item / p.kv_heads, hk = item % p.kv_heads;
      if (!split_head(b, hk, hk * p.group_size(), (hk + 1) * p.group_size(), item))
        splittable.store(false, std::memory_order_relaxed);
    });
    return splittable.load();
  }

  // One query tile in: Q rows scaled and transposed (the FMA kernel's loader), then split.
  void load_q(const QueryTile& x, float factor, const Slot& s) const {
    Ops::Fma::load_q_transposed(p.q, p.dtype, x.b, x.h, x.i0, x.rows, p.head_dim, factor, s.qt);
    Ops::split_pairs(s.qt, p.head_dim, dim_pad, s.q_parts);
  }
};

template <class S>
void amx_fused_forward(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  using Ops = AmxOps<S>;
  using Fma = typename Ops::Fma;
  constexpr int kGroup = Fma::T::query_tiles_per_item;
  AmxWorkspace<S> ws(p, /*is_naive=*/false, exec.workers);
  ws.base = memory;
  if (!ws.local && !ws.prepare(exec)) return avx512_kernels.fused(p, exec, memory);
  using Mods = ScoreModOps<S>;
  static_assert(Mods::Br == Ops::Br && Fma::Bc == Ops::Bc, "the AMX score tile is the FMA kernel's");
  const float q_factor = static_cast<float>(p.scale) * Fma::kLog2e;
  const std::int64_t Dp = ws.dim_pad;
  const bool variants = p.mods.any() || p.has_window();

  // The query tiles [first.t, first.t + kGroup) of one head against its K and Vᵀ parts.
  auto run_group = [&](const QueryTile& first, int worker, const bf16* k, const bf16* v) {
    QueryTile q[kGroup];
    typename AmxWorkspace<S>::Slot tile[kGroup];
    int n = 0;
    std::int64_t first_key = p.kv_len, kv_max = 0;
    for (; n < kGroup && first.t + n < ws.q_tiles; ++n) {
      q[n] = ws.query_tile(first.b, first.h, first.t + n);
      tile[n] = ws.slot(worker * kGroup + n);
      first_key = std::min(first_key, q[n].first_key_tile(Ops::Bc));
      kv_max = std::max(kv_max, q[n].kv_end);
      ws.load_q(q[n], q_factor, tile[n]);
      Fma::start_rows(tile[n].m, tile[n].l, tile[n].ot, Dp);
    }
    // Per key tile, the query tiles that see it in a pipeline: the softmax of tile s runs
    // in slices among the score products of tile s+1, and the softmax of tile s+1 among
    // the P·V products of tile s (cpu/amx/softmax.hpp).
    SoftmaxTask<S> softmax[kGroup];
    typename Fma::Band diag[kGroup];
    typename Mods::Tile pairs[kGroup];
    MaskCover cover[kGroup];
    const typename Fma::Band* on_diagonal[kGroup];  // null off the diagonal
    for (std::int64_t j0 = first_key; j0 < kv_max; j0 += Ops::Bc) {
      int live[kGroup], n_live = 0;  // the tiles that see some key of this one
      for (int s = 0; s < n; ++s) {
        if (j0 >= q[s].kv_end || j0 + Ops::Bc <= q[s].kv_begin) continue;
        pairs[s] = {q[s].b, q[s].h, q[s].i0, q[s].rows, j0,
                    std::min<std::int64_t>(Ops::Bc, q[s].kv_end - j0)};
        cover[s] = Mods::mask_cover(p, pairs[s]);
        if (cover[s] != MaskCover::hidden) live[n_live++] = s;
      }
      for (int x = 0; x < n_live; ++x) {
        const int s = live[x];
        const auto& t = tile[s];
        const std::int64_t nj = pairs[s].nj;
        diag[s] = {j0, q[s].i0, p.band_lo, p.band_hi};
        const bool on_edge = p.needs_mask(q[s].i0, q[s].i0 + q[s].rows, j0, j0 + nj);
        on_diagonal[s] = on_edge ? &diag[s] : nullptr;
        Ops::scores_tile(k, Dp, j0, nj, t.q_parts, t.st, on_diagonal[s],
                         x > 0 ? &softmax[live[x - 1]] : nullptr);
        // The products are done with st (the previous tile's softmax ran among them, on
        // its own st): the variants change this one before its softmax starts, as on the
        // FMA kernels' tiles of the same layout, st [Bc][Br] keys × queries, log2 units,
        // padded lanes past the rows. The softmax task hides the band's causal edge only,
        // and the products skip the 32×32 blocks beyond it (their st stale): with variants
        // both edges are hidden here, by selection, over whatever the change made of them.
        if (variants) Mods::finish_scores(p, pairs[s], cover[s], on_diagonal[s], t.st);
        softmax[s].start({t.st, t.m, t.l, t.ot, t.p_parts, nj, Dp, on_diagonal[s]});
      }
      for (int x = 0; x < n_live; ++x) {
        const int s = live[x];
        while (softmax[s].step()) {
        }
        Ops::pv_tile(v, j0, pairs[s].nj, tile[s].p_parts, Dp, tile[s].ot, on_diagonal[s],
                     x + 1 < n_live ? &softmax[live[x + 1]] : nullptr);
      }
    }
    for (int s = 0; s < n; ++s) {
      if (p.mods.sinks) {  // ot [Dp][Br]: Dp rows of the tile's queries
        Mods::add_sink(p, q[s].h, tile[s].m, tile[s].l, tile[s].alpha);
        Mods::scale_rows(tile[s].ot, Dp, tile[s].alpha);
      }
      Fma::store_output(tile[s].ot, tile[s].l, p, q[s].b, q[s].h, q[s].i0, q[s].rows);
      Fma::store_lse(tile[s].m, tile[s].l, p, q[s].b, q[s].h, q[s].i0, q[s].rows);
    }
  };

  if (!ws.local) {
    detail::parallel_items(exec, ws.items(kGroup), [&](std::int64_t item, int worker) {
      const typename Ops::Scope tiles;
      const auto first = ws.first_tile_of(item, kGroup);
      run_group(first, worker, ws.k_parts(first.b, first.hk), ws.v_parts(first.b, first.hk));
    });
    return;
  }
  // Head-local: an item is a kv head and its query heads; a value that does not split
  // stops its item, and the whole call is then computed again by the FMA kernel (every
  // output rewritten).
  std::atomic<bool> splittable{true};
  const std::int64_t groups = ws.items(kGroup) / (p.batch * p.q_heads);
  detail::parallel_items(exec, p.batch * p.kv_heads, [&](std::int64_t item, int worker) {
    const std::int64_t b = item / p.kv_heads, hk = item % p.kv_heads;
    const std::int64_t h_begin = hk * p.group_size(), h_end = h_begin + p.group_size();
    if (!ws.split_head(b, hk, h_begin, h_end, worker)) {
      splittable.store(false, std::memory_order_relaxed);
      return;
    }
    const typename Ops::Scope tiles;
    for (std::int64_t h = h_begin; h < h_end; ++h)
      for (std::int64_t g = 0; g < groups; ++g)
        run_group(ws.first_tile_of((b * p.q_heads + h) * groups + g, kGroup), worker,
                  ws.k_parts(worker), ws.v_parts(worker));
  });
  if (!splittable.load()) avx512_kernels.fused(p, exec, memory);
}

// The naive baseline on the same AMX products: scores to an Sq×Sk buffer, softmax,
// P·V, as three parallel stages (cpu/forward/naive.hpp is the FMA version).
template <class S>
void amx_naive_forward(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  using Ops = AmxOps<S>;
  using Fma = typename Ops::Fma;
  AmxWorkspace<S> ws(p, /*is_naive=*/true, exec.workers);
  ws.base = memory;
  detail::StageClock clock;  // reported through p.naive_stages
  NaiveStageSeconds seconds;
  if (!ws.prepare(exec)) return avx512_kernels.naive(p, exec, memory);
  seconds.prepare = clock.lap();
  const float q_factor = static_cast<float>(p.scale) * Fma::kLog2e;
  const std::int64_t Dp = ws.dim_pad;
  // Stage 1: scores.
  detail::parallel_items(exec, ws.items(1), [&](std::int64_t item, int worker) {
    const typename Ops::Scope tiles;
    const auto x = ws.first_tile_of(item, 1);
    const auto t = ws.slot(worker);
    ws.load_q(x, q_factor, t);
    float* scores = ws.scores(x.b, x.h, x.t);  // [kv_pad][Br] from key 0: TileOps' layout
    Ops::scores_tile(ws.k_parts(x.b, x.hk), Dp, 0, x.kv_end, t.q_parts, scores);
    if (p.mods.any()) naive_score_mods<S>(p, x, 0, scores);
  });
  seconds.scores = clock.lap();

  // Stage 2: softmax of each query row, in place; logsumexp (the FMA naive path's).
  naive_softmax_stage<Fma>(p, exec, ws, [&](int worker) { return ws.slot(worker); });
  seconds.softmax = clock.lap();

  // Stage 3: O = P·V, key tile by key tile.
  detail::parallel_items(exec, ws.items(1), [&](std::int64_t item, int worker) {
    const typename Ops::Scope tiles;
    const auto x = ws.first_tile_of(item, 1);
    const auto t = ws.slot(worker);
    const float* probs = ws.scores(x.b, x.h, x.t);
    Fma::start_rows(t.m, t.l, t.ot, Dp);
    for (int i = 0; i < Ops::Br; ++i) t.ones[i] = 1.0f;
    // From the key tile of the first key the rows see: stage 2 left the tiles before it
    // as scores (a window's left edge).
    for (std::int64_t j0 = x.first_key_tile(Ops::Bc); j0 < x.kv_end; j0 += Ops::Bc) {
      const std::int64_t nj = std::min<std::int64_t>(Ops::Bc, x.kv_end - j0);
      Ops::split_pairs(probs + j0 * Ops::Br, nj, Ops::round_up(nj), t.p_parts);
      Ops::pv_tile(ws.v_parts(x.b, x.hk), j0, nj, t.p_parts, Dp, t.ot);
    }
    Fma::store_output(t.ot, t.ones, p, x.b, x.h, x.i0, x.rows);
  });
  seconds.output = clock.lap();
  if (p.naive_stages) *p.naive_stages = seconds;
}

}  // namespace fattn::cpu
#endif
