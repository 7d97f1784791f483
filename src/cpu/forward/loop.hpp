// fattn — the CPU forward loop, once for every forward kernel: FlashAttention-2's loop
// over key tiles with an online softmax.
//
//   for each key tile [j0, j0 + Bc) of the pass's keys:
//     the units that see some key of it          (visit: visibility, a mask hiding it whole)
//     for each of them:
//       scores, the variants and the band, online softmax        (softmax_step)
//       o ← alpha·o + P·V                                         (pv_step)
//
// A unit is one running softmax state (m, l, o) over a block of query rows. What a unit
// is, where the keys come from and which products compute the steps is the pass's:
//   FusedPass (cpu/forward/fused.hpp)   a unit is one query tile of one head; the keys
//       the workspace's K panels and V rows; the products a Mainloop policy's (FMA,
//       bfloat16 dot products, AMX tiles); the variants on ScoreModOps' tiles.
//   DecodePass (cpu/decode/worker.hpp)  a unit is one kv head's query rows (its group's
//       heads × the queries); the keys the cache's rows where they lie (paged or not) or
//       float32 copies; the lanes along keys or along the query rows (DecodeOps,
//       DecodeQueryLanes, on FMAs or bfloat16 dot products).
//
// The pass gives:
//   kKeyTile                 keys per tile (Bc)
//   kSoftmaxAmongProducts    every unit's softmax step before the first P·V: a pass whose
//                            softmax runs among the neighbouring unit's products (AMX);
//                            with it, kMaxUnits (units at most)
//   visit(j0)                how many units see keys [j0, j0 + kKeyTile) (the live
//                            units; the pass keeps which)
//   softmax_step(j0, x, n)   scores, variants, band and softmax of the x-th of the n live
//                            units; false where the variants hid every key from it (no P·V).
//                            A pass with kSoftmaxAmongProducts returns true (its visit left
//                            out the hidden units): its P·V steps overlap the neighbours'
//                            softmax, which must have run
//   pv_step(j0, x, n)        its P·V
// The steps have n, so a step can reach its neighbours (x − 1, x + 1).
#pragma once

#include <cstdint>

namespace fattn::cpu {

// Keys [first_key, end_key) through the pass, kKeyTile at a time.
template <class Pass>
void forward_loop(Pass& pass, std::int64_t first_key, std::int64_t end_key) {
  for (std::int64_t j0 = first_key; j0 < end_key; j0 += Pass::kKeyTile) {
    const int n = pass.visit(j0);
    // A softmax among the products runs every unit's softmax step before the first P·V
    // (each overlaps a neighbour's products); else each unit's P·V follows its softmax
    // while its scores are in L1 (the other order: float32 2-4 % slower at S = 1024-2048,
    // docs/perf-log.md, "one forward loop").
    if constexpr (Pass::kSoftmaxAmongProducts) {
      bool seen[Pass::kMaxUnits];
      for (int x = 0; x < n; ++x) seen[x] = pass.softmax_step(j0, x, n);
      for (int x = 0; x < n; ++x)
        if (seen[x]) pass.pv_step(j0, x, n);
    } else {
      for (int x = 0; x < n; ++x)
        if (pass.softmax_step(j0, x, n)) pass.pv_step(j0, x, n);
    }
  }
}

}  // namespace fattn::cpu
