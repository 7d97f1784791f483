// fattn — the fused kernel for bfloat16 inputs on bfloat16 dot products (AVX512-BF16):
// cpu/forward/fused.hpp's loop with DotBf16Mainloop, the products of cpu/dot_bf16_ops.hpp.
//
// Working memory (one allocation, every piece 64-byte aligned; a pair is 4 bytes):
//   K pairs  B·Hkv · ceil(Sk/key_rows)·key_rows · ceil(D/2)   key panels   (O(S))
//   V pairs  B·Hkv · ceil(Sk/2) · D                           value pairs  (O(S))
//   per slot: qp [D/2][Br], ot [D][Br], m, l, alpha [Br], st [Bc][Br], pp [Bc/2][Br]
// When a value is infinite or NaN the float32 kernel runs instead, in the same memory
// (a hidden pair's p = 0 times an infinite value would be NaN in a dot product, where the
// float32 loop skips hidden pairs); the kernel table sizes the memory for both.
#pragma once

#include "cpu/common/isa_target.hpp"

#if defined(FATTN_AVX512_BF16)
#include <algorithm>
#include <atomic>
#include <cstdint>

#include "model/parallel.hpp"
#include "cpu/forward/dot_bf16_ops.hpp"
#include "cpu/forward/fused.hpp"
#include "cpu/common/workspace.hpp"

namespace fattn::cpu {

template <class S>
struct DotBf16Workspace
    : QueryTiling<DotBf16Workspace<S>, TileOps<S>::Br, TileOps<S>::T::query_tiles_per_item> {
  using Ops = TileOps<S>;
  using Dot = DotBf16Ops<S>;
  using Pair = typename Dot::Pair;
  static constexpr int Br = Ops::Br;

  struct Worker {
    Pair* qp;
    float *ot, *m, *l, *alpha, *st;
    Pair* pp;
  };

  static constexpr bool naive = false;  // the fused loop only
  const detail::Problem& p;
  std::int64_t q_tiles, worker_floats;
  std::int64_t k_pairs_at, v_pairs_at, workers_at, total;
  std::int64_t qp_at, ot_at, m_at, l_at, alpha_at, st_at, pp_at;  // within a worker's slot
  float* base = nullptr;
  Sizes n;  // every product checked, as Workspace's
  HeadRoom k_room, v_room;  // K pairs, V pairs

  DotBf16Workspace(const detail::Problem& problem, int workers)
      : p(problem),
        k_room(p, n, [&](std::int64_t keys) {
          return n.align(n.mul(n.mul(n.div_up(keys, Ops::MK), Ops::MK), Dot::pairs_of(p.head_dim)));
        }),
        v_room(p, n, [&](std::int64_t keys) { return n.align(n.mul(Dot::pairs_of(keys), p.head_dim)); }) {
    static_assert(sizeof(Pair) == sizeof(float), "the memory is counted in floats");
    const std::int64_t D = p.head_dim, D2 = Dot::pairs_of(D);
    q_tiles = n.div_up(p.q_len, Br);
    this->plan_ragged_items();
    Layout slot;  // head_dim <= 256: no overflow
    qp_at = slot.take(D2 * Br);
    ot_at = slot.take(D * Br);
    m_at = slot.take(Br);
    l_at = slot.take(Br);
    alpha_at = slot.take(Br);
    st_at = slot.take(Ops::Bc * Br);
    pp_at = slot.take(Ops::Bc / 2 * Br);
    worker_floats = slot.end;
    Layout all;
    k_pairs_at = all.take(k_room.total());
    v_pairs_at = all.take(v_room.total());
    workers_at = all.take(n.mul(this->slots(workers), worker_floats));
    total = n.overflow || all.n.overflow ? -1 : all.end;
  }

  Pair* k_pairs(std::int64_t b, std::int64_t hk) const {
    return reinterpret_cast<Pair*>(base + k_pairs_at + k_room.at(b, hk));
  }
  Pair* v_pairs(std::int64_t b, std::int64_t hk) const {
    return reinterpret_cast<Pair*>(base + v_pairs_at + v_room.at(b, hk));
  }
  Worker worker(int slot) const {
    float* s = base + workers_at + slot * worker_floats;
    return {reinterpret_cast<Pair*>(s + qp_at), s + ot_at, s + m_at, s + l_at, s + alpha_at,
            s + st_at, reinterpret_cast<Pair*>(s + pp_at)};
  }

  // Pre-pass: every kv head's keys and values into pairs. False if a value is not finite.
  bool prepare_kv(const detail::Exec& exec) const {
    std::atomic<bool> finite{true};
    for_each_kv_head(p, exec, [&](const detail::Problem& s, std::int64_t b, std::int64_t hk) {
      Dot::pack_k_pairs(s, b, hk, s.kv_len, k_pairs(b, hk));
      if (!Dot::pack_v_pairs(s, b, hk, s.kv_len, v_pairs(b, hk)))
        finite.store(false, std::memory_order_relaxed);
    });
    return finite.load();
  }
};

// The products of fused_loop on bfloat16 dot products.
template <class S>
struct DotBf16Mainloop {
  using Ops = TileOps<S>;
  using Dot = DotBf16Ops<S>;
  using Pair = typename Dot::Pair;
  using Band = typename Ops::Band;
  using Tile = typename DotBf16Workspace<S>::Worker;
  static constexpr bool kSoftmaxAmongProducts = false, kSoftmaxHidesCausalEdge = false;
  const DotBf16Workspace<S>& ws;
  float q_factor;  // scale·log2(e), applied to the sums

  struct Head {
    const Pair *k_pairs, *v_pairs;
  };
  Head head(std::int64_t b, std::int64_t hk) const { return {ws.k_pairs(b, hk), ws.v_pairs(b, hk)}; }
  Tile tile(int slot) const { return ws.worker(slot); }
  std::int64_t out_dims() const { return ws.p.head_dim; }
  void load_q(const detail::Problem& p, const QueryTile& q, const Tile& t) const {
    Dot::load_q_pairs(p, q.b, q.h, q.i0, q.rows, t.qp);
  }
  [[gnu::noinline]] void scores(const Head& h, std::int64_t j0, std::int64_t nj, const Tile& t,
                                const Band*, const Tile*) const {
    Dot::scores_tile(h.k_pairs, j0, nj, t.qp, ws.p.head_dim, q_factor, t.st);
  }
  void softmax(const Tile& t, std::int64_t nj, const Band*) const {
    Ops::softmax_update(t.st, nj, t.m, t.l, t.alpha);
  }
  // Hidden pairs (band) have p = 0 and finite values here: added, they add nothing.
  [[gnu::noinline]] void pv(const Head& h, std::int64_t j0, std::int64_t nj, const Tile& t,
                            const Band*, const Tile*) const {
    Dot::round_p_pairs(t.st, nj, t.pp);
    Dot::pv_accumulate(h.v_pairs + j0 / 2 * ws.p.head_dim, nj, t.pp, t.alpha, ws.p.head_dim, t.ot);
  }
};

// Floats of working memory for dot_bf16_forward: room for its own layout or the float32
// kernel's (-1: a size overflowed).
template <class S>
std::int64_t dot_bf16_workspace_floats(const detail::Problem& p, int workers) {
  const std::int64_t own = DotBf16Workspace<S>(p, workers).total;
  const std::int64_t fma = Workspace<S>(p, /*is_naive=*/false, workers).total;
  return own < 0 || fma < 0 ? -1 : std::max(own, fma);
}

template <class S>
void dot_bf16_forward(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  DotBf16Workspace<S> ws(p, exec.workers);
  ws.base = memory;
  if (!ws.prepare_kv(exec)) return fused_forward<S>(p, exec, memory);
  fused_loop<S>(p, exec, DotBf16Mainloop<S>{ws, static_cast<float>(p.scale) * TileOps<S>::kLog2e});
}

}  // namespace fattn::cpu
#endif
