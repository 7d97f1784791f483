// fattn — FlashAttention-2's backward loop on a CPU core: one loop, its products from a
// policy (the FMA backward's, cpu/backward/backward.hpp; the AMX backward's,
// cpu/amx/backward.hpp).
//
// A work item is one chunk of key tiles of one kv head and one subgroup of the query
// heads sharing it (BackwardTiles: usually one chunk and one subgroup, the whole head).
// Its query tiles (slots: head by head, tile by tile) are taken a batch at a time
// (the FMA backward: all at once, prepared by its pre-pass; the AMX backward: as many as
// its worker's buffers hold, split to bfloat16 parts when the batch begins). For each
// key tile of the chunk:
//   for each query tile of the batch that sees the key tile (mask_cover: not hidden):
//     st  ← K·qtᵀ                        scores, log2 units         (scores)
//     st  ← the variants, the band       ScoreModOps::finish_scores
//     P   = 2^(st − lse2)                from the saved logsumexp   (probs)
//     dP  = V·dOᵀ;  dS = P ∘ (dP − Δ)    (· (1 − tanh²) with softcap) (grads)
//     dV += P·dO;  dK += dS·Q;  dQ += dS·K                            (accumulate)
// The policy keeps dK and dV per key tile or per chunk and puts them out (to the output,
// or with several subgroups to its subgroup's partials) at the key tile's or the item's
// end; dQ goes to the chunk's partial, or out at the batch's end. Then sum_partials adds
// the partials in order.
// Determinism: an item owns its keys' dK and dV (or their partials) and its chunk's dQ
// partial; the order of every sum is fixed by the loops, not by the thread that runs
// them; the chunk and subgroup counts depend only on the problem and the worker count.
// So a given thread count gives the same bits on every run. No Sq×Sk matrix is stored.
//
// The policy (a …BackwardMainloop) gives:
//   ws              the workspace (BackwardTiles: items, key tiles, query tiles)
//   batch           query tiles per batch
//   kProbsMaskBand  whether its probs pass hides the pairs outside the band itself (else
//                   finish_scores does, with −inf)
//   ItemState       a worker's state for one item, with st (the score tile) and cap (1 − tanh²
//                   of the scores; null without softcap)
//   item(i, worker), then begin_item, begin_batch, begin_key, the visit's four passes on a
//   BackwardVisit, end_key, end_batch, end_item. begin_item, begin_batch and grads return
//   false where an operand does not fit the products (the AMX backward's bfloat16 parts):
//   the loop returns false, and the caller runs another backward.
#pragma once

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "cpu/common/score_mods.hpp"
#include "cpu/common/workspace.hpp"

namespace fattn::cpu {

// One visit of the loop: key tile `key` against query tile x, in batch slot `slot`;
// next_slot is the slot visited after it (the AMX products prefetch its operands); edge
// the band when an edge of it crosses the pair tile, else null.
template <class KeyTile, class Band>
struct BackwardVisit {
  KeyTile key;
  QueryTile x;
  std::int64_t slot, next_slot;
  const Band* edge;
};

// Work item `index` of the policy's workspace on `worker`; false where an operand did not
// fit the products (the caller runs another backward).
template <class S, class Mainloop>
bool backward_item(const detail::Problem& p, const Mainloop& mainloop, std::int64_t index,
                   int worker) {
  using Mods = ScoreModOps<S>;
  using Band = typename TileOps<S>::Band;
  const auto& ws = mainloop.ws;
  const auto item = ws.item(index);
  auto t = mainloop.item(item, worker);
  const std::int64_t slots = (item.h_end - item.h_begin) * ws.q_tiles;
  auto slot_tile = [&](std::int64_t s) {
    return ws.query_tile(item.b, item.h_begin + s / ws.q_tiles, s % ws.q_tiles);
  };

  // Slot s against key tile `key`; s_next: the slot visited after it; first: the batch's.
  auto visit = [&](const auto& key, std::int64_t s, std::int64_t s_next, std::int64_t first) {
    const QueryTile x = slot_tile(s);
    const typename Mods::Tile pairs{x.b, x.h, x.i0, x.rows, key.j0, key.nj};
    const MaskCover cover = Mods::mask_cover(p, pairs);
    if (cover == MaskCover::hidden) return true;  // P = 0, dS = 0 on every pair
    const Band band = TileOps<S>::band_of(p, key.j0, x.i0);
    const bool on_edge = p.needs_mask(x.i0, x.i0 + x.rows, key.j0, key.j0 + key.nj);
    const BackwardVisit<std::decay_t<decltype(key)>, Band> v{key, x, s - first, s_next - first,
                                                             on_edge ? &band : nullptr};
    mainloop.scores(t, v);
    Mods::finish_scores(p, pairs, cover, Mainloop::kProbsMaskBand ? nullptr : v.edge, t.st, t.cap);
    mainloop.probs(t, v);
    const bool ok = mainloop.grads(t, v);
    mainloop.accumulate(t, v);
    return ok;
  };

  bool ok = mainloop.begin_item(t);
  for (std::int64_t first = 0; ok && first < slots; first += mainloop.batch) {
    const std::int64_t last = std::min(slots, first + mainloop.batch);
    ok = mainloop.begin_batch(t, first, last, slot_tile);
    for (std::int64_t kt = ws.chunk_begin(item.chunk); ok && kt < ws.chunk_end(item.chunk); ++kt) {
      const auto key = ws.key_tile(kt);
      const std::int64_t t_seeing = ws.first_tile_seeing(key.j0);
      mainloop.begin_key(t, key);
      // Visits run one slot behind, so that each knows the next; the last one's next
      // is the key tile's first.
      std::int64_t first_seen = -1, pending = -1;
      for (std::int64_t s = first; s < last; ++s) {
        const QueryTile x = slot_tile(s);
        if (x.t < t_seeing || x.kv_end <= key.j0 || x.kv_begin >= key.j0 + key.nj)
          continue;  // no row sees a key of the tile (or only its padding rows would)
        if (pending >= 0)
          ok &= visit(key, pending, s, first);
        else
          first_seen = s;
        pending = s;
      }
      if (pending >= 0)
        ok &= visit(key, pending, first_seen, first);
      mainloop.end_key(t, key);
    }
    if (ok) mainloop.end_batch(t, first, last, slot_tile);
  }
  if (ok) mainloop.end_item(t);
  return ok;
}

// Every work item of the policy's workspace through backward_item, in one parallel section.
template <class S, class Mainloop>
bool fused_backward_loop(const detail::Problem& p, const detail::Exec& exec,
                         const Mainloop& mainloop) {
  std::atomic<bool> completed{true};
  detail::parallel_items(exec, mainloop.ws.items(), [&](std::int64_t index, int worker) {
    if (!backward_item<S>(p, mainloop, index, worker))
      completed.store(false, std::memory_order_relaxed);
  });
  return completed.load();
}

}  // namespace fattn::cpu
