// fattn — the decode kernel: short queries against long keys (decode, speculative
// decoding, chunked prefill), K and V read in place (a KV cache, paged or not).
//
// A work item is (sequence b, a few kv heads, a tile of each group's query rows, a chunk
// of the keys: cpu/decode/workspace.hpp). For its rows (every query head of a group at
// once, cpu/decode/ops.hpp), in the tile layout chosen for the item (cpu/decode/worker.hpp):
//   for each key tile, for each kv head:
//        next ← its share of the next key tile (every head's K rows, then V rows, in the
//               order they lie in memory), asked of memory during its scores
//               (cpu/decode/prefetch.hpp)
//        st ← qs·Kᵀ                 (tile_scores: from the key rows for ≤ 8 rows, else
//                                    through the transposed tile; items of 48 rows or
//                                    more: the query rows along the lanes instead,
//                                    cpu/decode/query_lanes.hpp; a bfloat16 cache on
//                                    vdpbf16ps, cpu/decode/bf16.hpp and
//                                    cpu/decode/query_lanes_bf16.hpp)
//        m, l, st ← online softmax  (softmax_update; the visibility object says which
//                                    keys each row sees)
//        os ← alpha·os + st·V       (pv_accumulate)
//   out ← os / l, lse ← ln(2)·(m + log2 l)            (or a partial, with split keys)
// K and V are read where they lie when each row holds D contiguous elements, D a whole
// number of vectors (16-bit and q8_0 elements widened to float32 as they are loaded, so a
// 16-bit cache moves half the bytes, a q8_0 one 17/64; a bfloat16 cache on AVX512-BF16 is
// multiplied as it lies, on vdpbf16ps); otherwise (strided dims, odd head dims, a q8_0
// cache under the query-lane tiles) each key tile is first staged as float32 in address
// order, zero-padded.
// Split-KV (flash-decoding): when sequences × kv heads × row tiles cannot keep every
// worker busy, each sequence's keys are cut into `splits` chunks computed in parallel;
// each chunk leaves (os, m, l), and the worker that finishes a row tile's last chunk
// merges them in chunk order, so the result has the same bits on every run with the same
// thread count.
// Working memory: per worker O(D·(rows + Bk)), plus the split partials; none grows with Sk.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "model/parallel.hpp"
#include "model/problem.hpp"
#include "cpu/decode/plan.hpp"
#include "cpu/decode/worker.hpp"
#include "cpu/decode/workspace.hpp"

namespace fattn::cpu {

template <class S>
void decode_forward(const detail::Problem& p, const detail::Exec& exec, float* memory,
                    const DecodeRequest& request) {
  using Ops = DecodeOps<S>;
  using Workspace = DecodeWorkspace<S>;
  const Workspace ws(p, exec.workers, request);
  const float q_factor = static_cast<float>(p.scale) * Ops::kLog2e;
  auto worker_of = [&](int worker) {
    return DecodeWorker<S>{{p, ws, memory + worker * ws.worker_floats, q_factor}};
  };
  // With split keys, the chunks of one (sequence, head group, row tile) count themselves
  // done here; the worker whose chunk comes last merges the partials. One parallel
  // section, not a second one for the merge: each section's start and end costs a wake-up
  // of every worker, on a busy machine a scheduler tick (docs/perf-log.md, 2026-11-27).
  // (make_unique value-initializes: every counter starts at 0.)
  std::unique_ptr<std::atomic<std::int64_t>[]> chunks_done;
  if (ws.splits > 1)
    chunks_done = std::make_unique<std::atomic<std::int64_t>[]>(
        static_cast<std::size_t>(ws.items / ws.splits));
  // The last chunk of a row tile: its partials, merged in chunk order whichever worker
  // finishes last, so the result has the same bits on every run.
  auto merge = [&](const typename Workspace::Item& it, const DecodeWorker<S>& run) {
    const HeadState h = run.state(0);
    for (std::int64_t hk = it.hk_begin; hk < it.hk_end; ++hk) {
      merge_partials<S>(ws, it.rows, memory + ws.partial_at(p, it.b, hk, it.row_tile, 0), h.os,
                        h.m, h.l);
      store_group_rows<S>(p, it.b, hk, it.r0, it.rows, h.os, h.m, h.l);
    }
  };

  // tiles_of(worker): where its key tiles come from, TilesInCache (the cache's elements
  // read where they lie) or its StagedTiles (float32 copies in its own buffers).
  auto run_items = [&](auto tiles_of) {
    detail::parallel_items(exec, ws.items, [&](std::int64_t index, int worker) {
      const DecodeWorker<S> run = worker_of(worker);
      const auto tiles = tiles_of(run);
      const auto it = ws.item(p, index);
      std::int64_t kv_begin, kv_end;
      ws.key_range(p, it, &kv_begin, &kv_end);
      run.run(it, kv_begin, kv_end, tiles, memory);
      // acq_rel: this chunk's partial is published to, and the others' seen by, the merger.
      if (ws.splits > 1 &&
          chunks_done[index / ws.splits].fetch_add(1, std::memory_order_acq_rel) == ws.splits - 1)
        merge(it, run);
    });
  };
  if (!ws.in_place) {
    run_items([](const DecodeWorker<S>& run) { return run.staged_tiles(); });
  } else {
    with_kv_element_type(p.k, p.kv_dtype(), [&](const auto& k) {
      using E = std::remove_const_t<std::remove_reference_t<decltype(*k.data)>>;
      const TilesInCache<S, E> cache{p, k, detail::retype<const E>(p.v)};
      run_items([&](const DecodeWorker<S>&) { return cache; });
    });
  }
}

}  // namespace fattn::cpu
