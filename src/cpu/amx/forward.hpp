// fattn — the AMX forward kernels: the fused kernel's loop (cpu/forward/fused.hpp) and the
// naive baseline with Q·Kᵀ and P·V on AMX tiles (cpu/amx/ops.hpp), the softmax on AVX-512
// as in the FMA kernel.
//
// For one query tile:   Q parts ← split(Q·scale·log2(e))
//   for each key tile:  st ← K·Qᵀ                 (scores_tile: six bf16 products)
//                       the variants (the loop's ScoreModOps::finish_scores)
//                       mask, online softmax, P parts ← split(P), alpha·ot
//                                                 (SoftmaxTask, cpu/amx/softmax.hpp)
//                       ot ← ot + Vᵀ·P             (pv_tile)
//   out ← otᵀ / l, lse                          (the sinks joined first)
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
#include "cpu/forward/fused.hpp"
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
  // A ragged batch (attention_varlen) splits every head first, each (sequence, kv head) at
  // its own length (HeadRoom): its items span the sequences (QueryTiling), not its heads.
  static constexpr int kLocalHeadsPerWorker = 4;  // items per worker for the dynamic schedule

  const detail::Problem& p;
  bool naive, local = false;
  std::int64_t q_tiles, kv_pad, dim_pad, q_parts, p_parts, head_floats, scores_block,
      slot_floats;
  std::int64_t k_at, v_at, scores_at, slots_at, total;
  // Within a worker's slot.
  std::int64_t qt_at, ot_at, m_at, l_at, alpha_at, ones_at, st_at, q_parts_at, p_parts_at;
  HeadRoom room;  // split first (not local): where each (sequence, kv head)'s parts lie
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
    local = !naive && !p.is_ragged() && kv_heads >= std::int64_t{kLocalHeadsPerWorker} * workers;
    if (!local)
      room = HeadRoom(p, n, [&](std::int64_t keys) {
        return n.align(n.mul(n.mul(Ops::kParts, n.mul(n.div_up(keys, Bc), Bc)), dim_pad) / 2);
      });
    this->plan_ragged_items();
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
    k_at = all.take(local ? n.mul(workers, head_floats) : room.total());
    v_at = all.take(local ? n.mul(workers, head_floats) : room.total());
    scores_at = all.take(this->naive_scores_floats(n));
    slots_at = all.take(n.mul(this->slots(workers), slot_floats));
    total = n.overflow || all.n.overflow ? -1 : all.end;
  }

  // K and Vᵀ parts: in local mode of worker w, else of kv head (b, hk).
  struct Parts {
    bf16 *k, *v;
  };
  Parts worker_parts(int w) const {
    return {reinterpret_cast<bf16*>(base + k_at + w * head_floats),
            reinterpret_cast<bf16*>(base + v_at + w * head_floats)};
  }
  Parts head_parts(std::int64_t b, std::int64_t hk) const {
    return {reinterpret_cast<bf16*>(base + k_at + room.at(b, hk)),
            reinterpret_cast<bf16*>(base + v_at + room.at(b, hk))};
  }

  // Splits kv head (b, hk) of sequence problem s (detail::SequenceOf) into `parts` and
  // checks query head rows [h_begin, h_end) of its Q. False: some value does not split
  // exactly (NaN, Inf, |x| > 3e38).
  bool split_head(const detail::Problem& s, std::int64_t b, std::int64_t hk, std::int64_t h_begin,
                  std::int64_t h_end, const Parts& parts) const {
    bool ok = Ops::pack_k(s.k, b, hk, s.kv_len, s.head_dim, parts.k);
    ok &= Ops::pack_v_transposed(s.v, b, hk, s.kv_len, s.head_dim, parts.v);
    for (std::int64_t h = h_begin; ok && h < h_end; ++h)
      ok &= Ops::splittable_rows(s.q, b, h, s.q_len, s.head_dim);
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
    for_each_kv_head(p, exec, [&](const detail::Problem& s, std::int64_t b, std::int64_t hk) {
      if (!split_head(s, b, hk, hk * p.group_size(), (hk + 1) * p.group_size(), head_parts(b, hk)))
        splittable.store(false, std::memory_order_relaxed);
    });
    return splittable.load();
  }

  // One query tile of sequence problem s in: Q rows scaled and transposed (the FMA
  // kernel's loader), then split.
  void load_q(const detail::Problem& s, const QueryTile& x, float factor, const Slot& t) const {
    Ops::Fma::load_q_transposed(s.q, s.dtype, x.b, x.h, x.i0, x.rows, s.head_dim, factor, t.qt);
    Ops::split_pairs(t.qt, s.head_dim, dim_pad, t.q_parts);
  }
};

// The fused loop's products on AMX tiles (cpu/forward/fused.hpp: fused_group): K and Vᵀ
// parts of the workspace, the query tile split into parts. Each tile's softmax is a task
// (cpu/amx/softmax.hpp) that runs in slices among the products of the neighbouring tile
// of the item: the softmax of tile s among the score products of tile s+1, the softmax of
// tile s+1 among the P·V products of tile s. The task hides the band's causal edge itself
// (by selection) and the products skip the 32×32 blocks beyond it, whose st is stale.
template <class S>
struct AmxMainloop {
  using Ops = AmxOps<S>;
  using Band = typename Ops::Fma::Band;
  static constexpr bool kSoftmaxAmongProducts = true, kSoftmaxHidesCausalEdge = true;
  static_assert(ScoreModOps<S>::Br == Ops::Br && Ops::Fma::Bc == Ops::Bc,
                "the AMX score tile is the FMA kernel's: the loop's variants apply to it");
  const AmxWorkspace<S>& ws;
  float q_factor;  // scale·log2(e)

  struct Head {
    const bf16 *k, *v;  // K parts, Vᵀ parts
  };
  struct Tile : AmxWorkspace<S>::Slot {
    SoftmaxTask<S> softmax;
  };
  Head head(std::int64_t b, std::int64_t hk) const {
    const auto parts = ws.head_parts(b, hk);
    return {parts.k, parts.v};
  }
  Tile tile(int slot) const { return {ws.slot(slot), {}}; }
  std::int64_t out_dims() const { return ws.dim_pad; }  // ot [Dp][Br]
  void load_q(const detail::Problem& p, const QueryTile& q, const Tile& t) const {
    ws.load_q(p, q, q_factor, t);
  }
  void scores(const Head& h, std::int64_t j0, std::int64_t nj, Tile& t, const Band* edge,
              Tile* overlapped) const {
    Ops::scores_tile(h.k, ws.dim_pad, j0, nj, t.q_parts, t.st, edge,
                     overlapped ? &overlapped->softmax : nullptr);
  }
  void softmax(Tile& t, std::int64_t nj, const Band* edge) const {
    t.softmax.start({t.st, t.m, t.l, t.ot, t.p_parts, nj, ws.dim_pad, edge});
  }
  void pv(const Head& h, std::int64_t j0, std::int64_t nj, Tile& t, const Band* edge,
          Tile* overlapped) const {
    while (t.softmax.step()) {
    }
    Ops::pv_tile(h.v, j0, nj, t.p_parts, ws.dim_pad, t.ot, edge,
                 overlapped ? &overlapped->softmax : nullptr);
  }
};

// False where an input does not split into bfloat16 parts (kernels.hpp's KernelFn): the
// caller runs the AVX-512 kernel, which rewrites every output.
template <class S>
bool amx_fused_forward(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  using Ops = AmxOps<S>;
  constexpr int kGroup = Ops::Fma::T::query_tiles_per_item;
  AmxWorkspace<S> ws(p, /*is_naive=*/false, exec.workers);
  ws.base = memory;
  if (!ws.local && !ws.prepare(exec)) return false;
  const AmxMainloop<S> mainloop{ws, static_cast<float>(p.scale) * Ops::Fma::kLog2e};

  if (!ws.local) {
    detail::parallel_items(exec, ws.items(kGroup), [&](std::int64_t item, int worker) {
      const typename Ops::Scope tiles;
      const auto first = ws.first_tile_of(item, kGroup);
      const detail::SequenceOf seq(p, first.b);  // a ragged problem's sequence
      fused_group<S>(seq.get(), mainloop, first, worker, mainloop.head(first.b, first.hk));
    });
    return true;
  }
  // Head-local: an item is a kv head and its query heads; a value that does not split
  // stops its item, and the whole call is then computed again by the FMA kernel (every
  // output rewritten).
  std::atomic<bool> splittable{true};
  const std::int64_t groups = ws.items(kGroup) / (p.batch * p.q_heads);
  detail::parallel_items(exec, p.batch * p.kv_heads, [&](std::int64_t item, int worker) {
    const std::int64_t b = item / p.kv_heads, hk = item % p.kv_heads;
    const std::int64_t h_begin = hk * p.group_size(), h_end = h_begin + p.group_size();
    const auto held = ws.worker_parts(worker);
    if (!ws.split_head(p, b, hk, h_begin, h_end, held)) {
      splittable.store(false, std::memory_order_relaxed);
      return;
    }
    const typename Ops::Scope tiles;
    const typename AmxMainloop<S>::Head parts{held.k, held.v};
    for (std::int64_t h = h_begin; h < h_end; ++h)
      for (std::int64_t g = 0; g < groups; ++g)
        fused_group<S>(p, mainloop, ws.first_tile_of((b * p.q_heads + h) * groups + g, kGroup),
                       worker, parts);
  });
  return splittable.load();
}

// The naive baseline on the same AMX products: scores to an Sq×Sk buffer, softmax,
// P·V, as three parallel stages (cpu/forward/naive.hpp is the FMA version).
template <class S>
bool amx_naive_forward(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  using Ops = AmxOps<S>;
  using Fma = typename Ops::Fma;
  AmxWorkspace<S> ws(p, /*is_naive=*/true, exec.workers);
  ws.base = memory;
  detail::StageClock clock;  // reported through p.naive_stages
  NaiveStageSeconds seconds;
  if (!ws.prepare(exec)) return false;  // the caller runs the AVX-512 kernel
  seconds.prepare = clock.lap();
  const float q_factor = static_cast<float>(p.scale) * Fma::kLog2e;
  const std::int64_t Dp = ws.dim_pad;
  // Stage 1: scores.
  detail::parallel_items(exec, ws.items(1), [&](std::int64_t item, int worker) {
    const typename Ops::Scope tiles;
    const auto x = ws.first_tile_of(item, 1);
    const auto t = ws.slot(worker);
    ws.load_q(p, x, q_factor, t);
    float* scores = ws.scores(x.b, x.h, x.t);  // [kv_pad][Br] from key 0: TileOps' layout
    Ops::scores_tile(ws.head_parts(x.b, x.hk).k, Dp, 0, x.kv_end, t.q_parts, scores);
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
      Ops::pv_tile(ws.head_parts(x.b, x.hk).v, j0, nj, t.p_parts, Dp, t.ot);
    }
    Fma::store_output(t.ot, t.ones, p, x.b, x.h, x.i0, x.rows);
  });
  seconds.output = clock.lap();
  if (p.naive_stages) *p.naive_stages = seconds;
  return true;
}

}  // namespace fattn::cpu
#endif
