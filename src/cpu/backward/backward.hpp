// fattn — the CPU backward on FMAs: FlashAttention-2's backward loop (cpu/backward/loop.hpp)
// with float32 products (FmaBackwardMainloop), and the naive baseline that materialises
// P and dS.
//
// Fused: the loop's items take their query tiles in one batch, prepared by the
// workspace's pre-pass (the operands transposed or padded, lse2, Δ); a key tile's dK and
// dV accumulate in the worker's [Bc][Dp] buffers and go out when the tile is done; dQ
// accumulates in the chunk's partial, summed in chunk order at the end (sum_partials).
//
// Naive, four stages, each a parallel loop finishing before the next:
//   1  P = 2^(Q·Kᵀ·scale·log2e − lse2)      B·Hq·Sq·Sk floats
//   2  dS = P ∘ (dO·Vᵀ − Δ)                  B·Hq·Sq·Sk floats
//   3  dV = Pᵀ·dO, dK = dSᵀ·Q·scale         per key tile
//   4  dQ = dS·K·scale                       per query tile
// on the same tile operations as the fused kernel, so fused vs naive measures fusion.
#pragma once

#include <algorithm>

#include "cpu/backward/loop.hpp"
#include "cpu/backward/workspace.hpp"
#include "cpu/common/dropout.hpp"
#include "cpu/forward/naive.hpp"
#include "cpu/common/score_mods.hpp"

namespace fattn::cpu {
namespace backward_detail {

// dK·scale and dV rows [j0, j0 + nj) of one kv head from accumulators [Bc][row_floats].
// (Templates on the unit's Simd type, as every kernel function: the units are built
// with different instruction sets, and the linker keeps one copy of a shared name.)
template <class S>
void store_key_grads(const detail::Problem& p, std::int64_t row_floats, std::int64_t b,
                     std::int64_t hk, std::int64_t j0, std::int64_t nj, const float* dk,
                     const float* dv) {
  const float scale = static_cast<float>(p.scale);
  for (std::int64_t r = 0; r < nj; ++r) {
    store_row(p.dk, p.dtype, b, hk, j0 + r, p.head_dim, dk + r * row_floats, scale);
    store_row(p.dv, p.dtype, b, hk, j0 + r, p.head_dim, dv + r * row_floats);
  }
}

// dQ rows of one query tile: scale · Σ_{c < parts} part(c), each part [D][Br] (dims ×
// queries), transposed back to rows.
template <class S, int Br, class Part>
void store_query_grads(const detail::Problem& p, const QueryTile& x, std::int64_t parts,
                       Part part) {
  const float scale = static_cast<float>(p.scale);
  float dq[detail::kMaxHeadDim];
  for (std::int64_t i = 0; i < x.rows; ++i) {
    for (std::int64_t d = 0; d < p.head_dim; ++d) {
      float sum = 0.0f;
      for (std::int64_t c = 0; c < parts; ++c) sum += part(c)[d * Br + i];
      dq[d] = sum;
    }
    store_row(p.dq, p.dtype, x.b, x.h, x.i0 + i, p.head_dim, dq, scale);
  }
}

// dK·scale and dV rows [j0, j0 + nj) of one kv head from `parts` partials summed in
// order: part(i, which) gives partial i's dK (which 0) or dV (1) rows of the head,
// row_floats apart. dk, dv: scratch of nj·row_floats floats each.
template <class S, class Part>
void store_key_grad_parts(const detail::Problem& p, std::int64_t row_floats, std::int64_t b,
                          std::int64_t hk, std::int64_t j0, std::int64_t nj, std::int64_t parts,
                          Part part, float* dk, float* dv) {
  for (int which = 0; which < 2; ++which) {
    float* acc = which == 0 ? dk : dv;
    std::fill_n(acc, nj * row_floats, 0.0f);
    for (std::int64_t i = 0; i < parts; ++i) {
      const float* rows = part(i, which) + j0 * row_floats;
      for (std::int64_t e = 0; e < nj * row_floats; ++e) acc[e] += rows[e];
    }
  }
  store_key_grads<S>(p, row_floats, b, hk, j0, nj, dk, dv);
}

// A work item's dK and dV of key rows [j0, j0 + nj): to the output, or with several
// subgroups into its subgroup's partials (part(which) gives them for the item's head).
template <class S, class Part>
void put_key_grads(const detail::Problem& p, std::int64_t row_floats, std::int64_t subgroups,
                   std::int64_t b, std::int64_t hk, std::int64_t j0, std::int64_t nj,
                   const float* dk, const float* dv, Part part) {
  if (subgroups == 1) return store_key_grads<S>(p, row_floats, b, hk, j0, nj, dk, dv);
  std::copy_n(dk, nj * row_floats, part(0) + j0 * row_floats);
  std::copy_n(dv, nj * row_floats, part(1) + j0 * row_floats);
}

// The fused backward's last pass, over a workspace W of either ISA: dK·scale and dV from
// the subgroups' partials (when there are several), and dQ·scale from the chunks' partials
// (when the items left dQ there). Its items: the key items first, then the query tiles.
template <class W>
std::int64_t partial_sum_items(const W& ws, bool dq_in_parts) {
  return (ws.subgroups > 1 ? ws.key_items() : 0) + (dq_in_parts ? ws.tiles : 0);
}
template <class S, class W>
void sum_partial(const detail::Problem& p, const W& ws, bool dq_in_parts, std::int64_t index,
                 int worker) {
  const std::int64_t key_items = ws.subgroups > 1 ? ws.key_items() : 0;
  if (index >= key_items)
    return store_query_grads<S, W::Br>(p, ws.query_tile(index - key_items), ws.chunks,
                                       [&](std::int64_t c) { return ws.dq_part(c, index - key_items); });
  const auto [b, hk, key] = ws.key_item(index);
  const auto scratch = ws.worker(worker);
  store_key_grad_parts<S>(
      p, ws.Dp, b, hk, key.j0, key.nj, ws.subgroups,
      [&](std::int64_t sub, int which) { return ws.dkv_part(sub, b, hk, which); }, scratch.dk,
      scratch.dv);
}
template <class S, class W>
void sum_partials(const detail::Problem& p, const detail::Exec& exec, const W& ws,
                  bool dq_in_parts) {
  detail::parallel_items(exec, partial_sum_items(ws, dq_in_parts), [&](std::int64_t index, int worker) {
    sum_partial<S>(p, ws, dq_in_parts, index, worker);
  });
}

// The variants on the naive backward's scores of query tile x against keys [k0, n) (its
// covered keys), [n − k0][Br]; with softcap, cap_grads [n − k0][Br] receives 1 − tanh²
// (0 past the band's end: those keys are hidden by the band).
template <class S>
void naive_score_mods(const detail::Problem& p, const QueryTile& x, std::int64_t k0,
                      std::int64_t n, float* scores, float* cap_grads) {
  constexpr int Br = TileOps<S>::Br;
  const bool capped = p.mods.softcap != 0.0;
  cpu::naive_score_mods<S>(p, x, k0, scores, capped ? cap_grads : nullptr);
  if (capped && n > x.kv_end) std::fill_n(cap_grads + (x.kv_end - k0) * Br, (n - x.kv_end) * Br, 0.0f);
}

// A backward call's workspace in `memory`, with its pre-pass done (the kv heads' panels
// and rows, every query tile's operands, lse2 and Δ, the dQ partials at zero).
template <class S>
BackwardWorkspace<S> prepared_workspace(const detail::Problem& p, bool is_naive,
                                        const detail::Exec& exec, float* memory) {
  BackwardWorkspace<S> ws(p, is_naive, exec.workers);
  ws.place(memory);
  ws.prepare(exec);
  return ws;
}

}  // namespace backward_detail

// The backward loop's products on float32 FMAs: K and V panels, every query tile's
// operands from the pre-pass (BackwardWorkspace), the tile operations of BackwardOps.
template <class S>
struct FmaBackwardMainloop {
  using Ops = TileOps<S>;
  using Bwd = BackwardOps<S>;
  using W = BackwardWorkspace<S>;
  using Visit = BackwardVisit<typename W::KeyTile, typename Ops::Band>;
  static constexpr bool kProbsMaskBand = false;
  const W& ws;
  std::int64_t batch = ws.tiles;  // the pre-pass prepared every query tile
  // dQ goes to the chunks' partials (one chunk: one partial), summed by sum_partials.
  bool dq_in_parts() const { return true; }

  struct ItemState {
    typename W::Item item;
    typename W::Worker tile;  // st, dst, dk, dv, ones, cap
    float *st, *cap;
    const float *k_rows, *k_panels, *v_panels;
    std::int64_t k_stride;
  };
  ItemState item(const typename W::Item& item, int worker) const {
    ItemState t{item, ws.worker(worker), nullptr, nullptr, nullptr,
                ws.k_panels(item.b, item.hk), ws.v_panels(item.b, item.hk), 0};
    t.st = t.tile.st;
    t.cap = t.tile.cap;
    t.k_rows = ws.k_rows(item.b, item.hk, &t.k_stride);
    return t;
  }
  bool begin_item(ItemState& t) const {
    std::fill_n(t.tile.ones, Ops::Br, 1.0f);
    return true;
  }
  template <class SlotTile>
  bool begin_batch(ItemState&, std::int64_t, std::int64_t, const SlotTile&) const {
    return true;
  }
  void begin_key(ItemState& t, const typename W::KeyTile& key) const {
    std::fill_n(t.tile.dk, key.rows_padded * ws.Dp, 0.0f);
    std::fill_n(t.tile.dv, key.rows_padded * ws.Dp, 0.0f);
  }
  // st ← K·qtᵀ
  void scores(ItemState& t, const Visit& v) const {
    Ops::scores_tile(t.k_panels, v.key.j0, v.key.nj, ws.qt(v.x.index), ws.p.head_dim, t.st);
  }
  // st ← P = 2^(st − lse2)
  void probs(ItemState& t, const Visit& v) const {
    Bwd::probs_from_lse(t.st, v.key.rows_padded, ws.lse2(v.x.index));
  }
  // dst ← dP = V·dOᵀ;  dst ← dS = P ∘ (dP − Δ), through the softcap, 0 outside the band
  // With dropout (factors F: 1/(1 − p) where the mask keeps P, else 0), in one pass over
  // the mask: dS = P ∘ (F ∘ V·dOᵀ − Δ), and st ← P ∘ F, the probabilities dV's product
  // takes.
  bool grads(ItemState& t, const Visit& v) const {
    Ops::scores_tile(t.v_panels, v.key.j0, v.key.nj, ws.dot(v.x.index), ws.p.head_dim, t.tile.dst);
    const detail::Dropout& d = ws.p.dropout;
    if (d.on()) {
      using vec = typename S::vec;
      const float* delta = ws.delta(v.x.index);
      DropoutOps<S>::each(d, d.head_stream(v.x.b, v.x.h, ws.p.q_heads), v.x.i0, Ops::Br, v.key.j0,
                          v.key.nj, [&](std::int64_t j, std::int64_t r, vec f) {
                            float* dp = t.tile.dst + j * Ops::Br + r;
                            float* pr = t.st + j * Ops::Br + r;
                            const vec p = S::load(pr);
                            S::store(dp, p * (S::load(dp) * f - S::load(delta + r)));
                            S::store(pr, p * f);
                          });
    } else {
      Bwd::grad_scores(t.st, t.tile.dst, v.key.rows_padded, ws.delta(v.x.index));
    }
    if (t.cap) Bwd::multiply(t.tile.dst, t.cap, v.key.nj);
    if (v.edge) Ops::mask_tile(t.tile.dst, v.key.nj, *v.edge, 0.0f);
    return true;
  }
  // dV += P·dO;  dK += dS·Q;  dQ[chunk] += dS·K
  void accumulate(ItemState& t, const Visit& v) const {
    const auto dout = ws.do_rows(v.x), q = ws.q_rows(v.x);
    Bwd::rows_accumulate(t.tile.dv, v.key.nj, ws.Dp, t.st, dout.data, dout.stride, v.x.rows);
    Bwd::rows_accumulate(t.tile.dk, v.key.nj, ws.Dp, t.tile.dst, q.data, q.stride, v.x.rows);
    Ops::pv_accumulate(t.k_rows + v.key.j0 * t.k_stride, t.k_stride, v.key.nj, t.tile.dst,
                       t.tile.ones, ws.p.head_dim, ws.dq_part(t.item.chunk, v.x.index), v.edge);
  }
  // The key tile's dK·scale, dV → out (one subgroup), else → the subgroup's partials.
  void end_key(ItemState& t, const typename W::KeyTile& key) const {
    backward_detail::put_key_grads<S>(
        ws.p, ws.Dp, ws.subgroups, t.item.b, t.item.hk, key.j0, key.nj, t.tile.dk, t.tile.dv,
        [&](int which) { return ws.dkv_part(t.item.sub, t.item.b, t.item.hk, which); });
  }
  template <class SlotTile>
  void end_batch(ItemState&, std::int64_t, std::int64_t, const SlotTile&) const {}
  void end_item(ItemState&) const {}
};

template <class S>
void fused_backward(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  const auto ws = backward_detail::prepared_workspace<S>(p, /*is_naive=*/false, exec, memory);
  const FmaBackwardMainloop<S> mainloop{ws};
  fused_backward_loop<S>(p, exec, mainloop);
  backward_detail::sum_partials<S>(p, exec, ws, mainloop.dq_in_parts());
}

template <class S>
void naive_backward(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  using Ops = TileOps<S>;
  using Bwd = BackwardOps<S>;
  auto ws = backward_detail::prepared_workspace<S>(p, /*is_naive=*/true, exec, memory);
  const std::int64_t D = p.head_dim, Dp = ws.Dp;

  // Stages 1 and 2 run stage(x, index, k0, n) on each query tile in parallel, over the
  // keys [k0, n) its rows cover (none: the tile is skipped).
  auto each_covered_tile = [&](auto stage) {
    detail::parallel_items(exec, ws.tiles, [&](std::int64_t index, int) {
      const auto x = ws.query_tile(index);
      const std::int64_t k0 = x.first_key_tile(Ops::Bc), n = ws.keys_covered(x);
      if (n > k0) stage(x, index, k0, n);
    });
  };

  // Stage 1: P.
  each_covered_tile([&](const QueryTile& x, std::int64_t index, std::int64_t k0, std::int64_t n) {
    float* probs = ws.probs(index) + k0 * Ops::Br;
    Ops::scores_tile(ws.k_panels(x.b, x.hk), k0, n - k0, ws.qt(index), D, probs);
    if (p.mods.any())
      backward_detail::naive_score_mods<S>(p, x, k0, n, probs, ws.cap_grads(index) + k0 * Ops::Br);
    if (p.needs_mask(x.i0, x.i0 + x.rows, k0, n))
      Ops::mask_tile(probs, n - k0, Ops::band_of(p, k0, x.i0));
    Bwd::probs_from_lse(probs, n - k0, ws.lse2(index));
  });

  // Stage 2: dS.
  each_covered_tile([&](const QueryTile& x, std::int64_t index, std::int64_t k0, std::int64_t n) {
    float* dscores = ws.dscores(index) + k0 * Ops::Br;
    Ops::scores_tile(ws.v_panels(x.b, x.hk), k0, n - k0, ws.dot(index), D, dscores);
    Bwd::grad_scores(ws.probs(index) + k0 * Ops::Br, dscores, n - k0, ws.delta(index));
    if (p.mods.softcap != 0.0) Bwd::multiply(dscores, ws.cap_grads(index) + k0 * Ops::Br, n - k0);
    if (p.needs_mask(x.i0, x.i0 + x.rows, k0, n))
      Ops::mask_tile(dscores, n - k0, Ops::band_of(p, k0, x.i0), 0.0f);
  });

  // Stage 3: dV and dK, one key tile of one kv head per item.
  detail::parallel_items(exec, ws.key_items(), [&](std::int64_t item, int worker) {
    const auto [b, hk, key] = ws.key_item(item);
    const auto tile = ws.worker(worker);
    std::fill_n(tile.dk, key.rows_padded * Dp, 0.0f);
    std::fill_n(tile.dv, key.rows_padded * Dp, 0.0f);
    ws.for_each_query_tile_seeing(b, hk, key, [&](const QueryTile& x) {
      const auto dout = ws.do_rows(x), q = ws.q_rows(x);
      Bwd::rows_accumulate(tile.dv, key.nj, Dp, ws.probs(x.index) + key.j0 * Ops::Br,
                           dout.data, dout.stride, x.rows);
      Bwd::rows_accumulate(tile.dk, key.nj, Dp, ws.dscores(x.index) + key.j0 * Ops::Br,
                           q.data, q.stride, x.rows);
    });
    backward_detail::store_key_grads<S>(p, Dp, b, hk, key.j0, key.nj, tile.dk, tile.dv);
  });

  // Stage 4: dQ, one query tile per item.
  detail::parallel_items(exec, ws.tiles, [&](std::int64_t index, int worker) {
    const auto x = ws.query_tile(index);
    const auto tile = ws.worker(worker);
    for (int i = 0; i < Ops::Br; ++i) tile.ones[i] = 1.0f;
    std::fill_n(tile.dqt, D * Ops::Br, 0.0f);
    std::int64_t k_stride;
    const float* k_rows = ws.k_rows(x.b, x.hk, &k_stride);
    const float* dscores = ws.dscores(index);
    for (std::int64_t j0 = x.first_key_tile(Ops::Bc); j0 < x.kv_end; j0 += Ops::Bc) {
      const std::int64_t nj = std::min<std::int64_t>(Ops::Bc, x.kv_end - j0);
      const typename Ops::Band band = Ops::band_of(p, j0, x.i0);
      const bool on_edge = p.needs_mask(x.i0, x.i0 + x.rows, j0, j0 + nj);
      Ops::pv_accumulate(k_rows + j0 * k_stride, k_stride, nj, dscores + j0 * Ops::Br,
                         tile.ones, D, tile.dqt, on_edge ? &band : nullptr);
    }
    backward_detail::store_query_grads<S, Ops::Br>(p, x, 1, [&](std::int64_t) { return tile.dqt; });
  });
}

}  // namespace fattn::cpu
