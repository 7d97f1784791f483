// fattn — the naive backward on AMX: the FMA naive backward's four stages (cpu/backward/backward.hpp)
// with the fused AMX backward's products, so that fused against naive on `Isa::amx`
// measures fusion, not two instruction sets.
//
//   prepare  every kv head's K, V, Kᵀ parts and every query tile's operands, lse2, Δ
//   1  P  = 2^(Q·Kᵀ·scale·log2e − lse2)     B·Hq·Sq·Sk floats
//   2  dS = P ∘ (dO·Vᵀ − Δ)                  B·Hq·Sq·Sk floats
//   3  dV = Pᵀ·dO, dK = dSᵀ·Q·scale          per key tile; P and dS split from memory
//   4  dQ = dS·K·scale                       per query tile
// each a parallel loop finishing before the next. P and dS are kept as float32 matrices,
// as a framework would keep them. A value that does not split (inputs; dS in stage 4)
// sends the call to the avx512 naive backward.
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#include <algorithm>
#include <atomic>

#include "cpu/amx/backward_ops.hpp"
#include "cpu/backward/backward.hpp"
#include "cpu/kernels.hpp"

namespace fattn::cpu {

template <class S>
struct AmxNaiveBackwardWorkspace : BackwardTiles<S> {
  using Tiles = BackwardTiles<S>;
  using Tiles::Br, Tiles::Bc, Tiles::p, Tiles::q_tiles, Tiles::tiles, Tiles::key_tiles,
      Tiles::query_tile;
  using Ops = AmxOps<S>;
  using Bwd = AmxBackwardOps<S>;

  struct Worker {
    float *dk, *dv, *dqt, *scratch;
    bf16 *p_rows, *ds_rows, *ds_pairs;
  };

  std::int64_t Dp, kv_pad, head_floats, operand_floats, tile_vec, full_block, rows_floats;
  std::int64_t worker_floats, keys_at, operands_at, stats_at, probs_at, dscores_at,
      cap_grads_at, workers_at, total;
  float* base = nullptr;

  AmxNaiveBackwardWorkspace(const detail::Problem& problem, int workers)
      : Tiles(problem, /*naive=*/true, workers) {
    Sizes n;
    Dp = Ops::round_up(p.head_dim);
    kv_pad = n.mul(key_tiles, Bc);
    head_floats = n.mul(n.mul(Ops::kParts, kv_pad), Dp) / 2;  // K, V or Kᵀ parts of a head
    operand_floats = Bwd::query_operand_floats(Dp);
    tile_vec = align_floats(Br);
    full_block = n.mul(kv_pad, Br);  // P or dS of one query tile
    rows_floats = align_floats(Ops::kParts * Bc * Br / 2);
    worker_floats = 2 * Bc * Dp + 2 * Dp * Br + 3 * rows_floats;
    std::int64_t at = 0;
    auto take = [&](std::int64_t floats) {
      const std::int64_t start = at;
      at = n.add(at, floats);
      return start;
    };
    keys_at = take(n.mul(3 * p.batch * p.kv_heads, head_floats));
    operands_at = take(n.mul(tiles, 4 * operand_floats));
    stats_at = take(n.mul(tiles, 2 * tile_vec));
    probs_at = take(n.mul(tiles, full_block));
    dscores_at = take(n.mul(tiles, full_block));
    cap_grads_at = take(p.mods.softcap != 0.0 ? n.mul(tiles, full_block) : 0);
    workers_at = take(n.mul(workers, worker_floats));
    total = n.overflow ? -1 : at;
  }

  bf16* parts(std::int64_t at) const { return reinterpret_cast<bf16*>(base + at); }
  // which: 0 K, 1 V, 2 Kᵀ
  bf16* keys(std::int64_t b, std::int64_t hk, int which) const {
    return parts(keys_at + ((b * p.kv_heads + hk) * 3 + which) * head_floats);
  }
  typename Bwd::QueryOperands operands(std::int64_t tile) const {
    const std::int64_t at = operands_at + tile * 4 * operand_floats;
    float* stats = base + stats_at + tile * 2 * tile_vec;
    return {parts(at), parts(at + operand_floats), parts(at + 2 * operand_floats),
            parts(at + 3 * operand_floats), stats, stats + tile_vec};
  }
  float* probs(std::int64_t tile) const { return base + probs_at + tile * full_block; }
  float* dscores(std::int64_t tile) const { return base + dscores_at + tile * full_block; }
  // With softcap: 1 − tanh² of every score of the tile.
  float* cap_grads(std::int64_t tile) const { return base + cap_grads_at + tile * full_block; }
  Worker worker(int w) const {
    float* s = base + workers_at + w * worker_floats;
    float* rows = s + 2 * Bc * Dp + 2 * Dp * Br;
    return {s, s + Bc * Dp, s + 2 * Bc * Dp, s + 2 * Bc * Dp + Dp * Br, parts(rows - base),
            parts(rows + rows_floats - base), parts(rows + 2 * rows_floats - base)};
  }

  // Every kv head's parts and every query tile's operands. False: some input does not split.
  bool prepare(const detail::Exec& exec) const {
    const std::int64_t kv_items = p.batch * p.kv_heads;
    std::atomic<bool> splittable{true};
    detail::parallel_items(exec, kv_items + tiles, [&](std::int64_t item, int w) {
      bool ok;
      if (item < kv_items) {
        const std::int64_t b = item / p.kv_heads, hk = item % p.kv_heads;
        ok = Bwd::split_keys(p, b, hk, 0, p.kv_len, keys(b, hk, 0), keys(b, hk, 1), keys(b, hk, 2));
      } else {
        const std::int64_t tile = item - kv_items;
        ok = Bwd::split_query_tile(p, query_tile(tile), worker(w).scratch, operands(tile));
      }
      if (!ok) splittable.store(false, std::memory_order_relaxed);
    });
    return splittable.load();
  }
};

// False where a value does not split into bfloat16 parts (kernels.hpp's KernelFn): the caller
// runs the AVX-512 naive backward, which rewrites every gradient.
template <class S>
bool amx_naive_backward(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  using Ops = AmxOps<S>;
  using Fma = typename Ops::Fma;
  using Bwd = AmxBackwardOps<S>;
  using W = AmxNaiveBackwardWorkspace<S>;
  W ws(p, exec.workers);
  ws.base = memory;
  if (!ws.prepare(exec)) return false;
  const std::int64_t Dp = ws.Dp;
  const bool capped = p.mods.softcap != 0.0;
  // Stages 1 and 2: a parallel loop over the query tiles, each with its covered keys n and
  // its diagonal (null when no pair of its n keys is hidden).
  auto each_query_tile = [&](auto stage) {
    detail::parallel_items(exec, ws.tiles, [&](std::int64_t index, int) {
      const typename Ops::Scope tiles;
      const auto x = ws.query_tile(index);
      const std::int64_t n = ws.keys_covered(x);
      const typename Fma::Band diag{0, x.i0, p.band_lo, p.band_hi};
      const bool on_edge = p.needs_mask(x.i0, x.i0 + x.rows, 0, n);
      stage(index, x, ws.operands(index), n, on_edge ? &diag : nullptr);
    });
  };

  // Stage 1: P.
  each_query_tile([&](std::int64_t index, const QueryTile& x, const auto& in, std::int64_t n,
                      const typename Fma::Band* diag) {
    Ops::scores_tile(ws.keys(x.b, x.hk, 0), Dp, 0, n, in.q_dims, ws.probs(index), diag);
    if (p.mods.any()) backward_detail::naive_score_mods<S>(p, x, 0, n, ws.probs(index), ws.cap_grads(index));
    if (diag) Fma::mask_tile(ws.probs(index), n, *diag);
    BackwardOps<S>::probs_from_lse(ws.probs(index), n, in.lse2);
  });

  // Stage 2: dS.
  each_query_tile([&](std::int64_t index, const QueryTile& x, const auto& in, std::int64_t n,
                      const typename Fma::Band* diag) {
    Ops::scores_tile(ws.keys(x.b, x.hk, 1), Dp, 0, n, in.do_dims, ws.dscores(index), diag);
    BackwardOps<S>::grad_scores(ws.probs(index), ws.dscores(index), n, in.delta);
    if (capped) BackwardOps<S>::multiply(ws.dscores(index), ws.cap_grads(index), n);
    if (diag) Fma::mask_tile(ws.dscores(index), n, *diag, 0.0f);
  });

  // Stage 3: dV and dK, one key tile of one kv head per item.
  detail::parallel_items(exec, ws.key_items(), [&](std::int64_t item, int worker) {
    const typename Ops::Scope tiles;
    const auto [b, hk, key] = ws.key_item(item);
    const auto w = ws.worker(worker);
    std::fill_n(w.dk, W::Bc * Dp, 0.0f);
    std::fill_n(w.dv, W::Bc * Dp, 0.0f);
    ws.for_each_query_tile_seeing(b, hk, key, [&](const QueryTile& x) {
      const auto in = ws.operands(x.index);
      Bwd::split_rows(ws.probs(x.index) + key.j0 * W::Br, key.nj, w.p_rows);
      Bwd::split_rows(ws.dscores(x.index) + key.j0 * W::Br, key.nj, w.ds_rows);
      Ops::rows_tile(w.p_rows, key.nj, in.do_rows, Dp, w.dv);
      Ops::rows_tile(w.ds_rows, key.nj, in.q_rows, Dp, w.dk);
    });
    backward_detail::store_key_grads<S>(p, Dp, b, hk, key.j0, key.nj, w.dk, w.dv);
  });

  // Stage 4: dQ, one query tile per item.
  std::atomic<bool> splittable{true};
  detail::parallel_items(exec, ws.tiles, [&](std::int64_t index, int worker) {
    const typename Ops::Scope tiles;
    const auto x = ws.query_tile(index);
    const auto w = ws.worker(worker);
    std::fill_n(w.dqt, Dp * W::Br, 0.0f);
    bool ok = true;
    for (std::int64_t j0 = 0; j0 < x.kv_end; j0 += W::Bc) {
      const std::int64_t nj = std::min<std::int64_t>(W::Bc, x.kv_end - j0);
      ok &= Ops::split_pairs(ws.dscores(index) + j0 * W::Br, nj, Ops::round_up(nj), w.ds_pairs);
      Ops::pv_tile(ws.keys(x.b, x.hk, 2), j0, nj, w.ds_pairs, Dp, w.dqt);
    }
    if (!ok) splittable.store(false, std::memory_order_relaxed);
    backward_detail::store_query_grads<S, W::Br>(p, x, 1, [&](std::int64_t) { return w.dqt; });
  });
  return splittable.load();
}

}  // namespace fattn::cpu
#endif
