// fattn — the AMX backward: FlashAttention-2's backward loop (cpu/backward/backward.hpp) with its
// five products on AMX tiles, each from three bfloat16 parts per operand (cpu/amx/ops.hpp),
// so float32-accurate like the forward.
//
// A work item is one chunk of key tiles of one kv head and one subgroup of its query
// heads (BackwardTiles; the whole head when there are kv heads enough for every worker).
// It splits what it reads into its worker's buffers right before use: its keys' K, V and
// Kᵀ parts first, then the operands of its query heads' tiles, a batch of tiles at a time
// (one batch for most shapes; see kQueryBytesPerWorker). For each batch, for each key tile:
//   for each query tile of the batch that sees it:
//     st  ← K·Qᵀ                        scores_tile (Q pre-scaled, log2 units)
//     P = 2^(st − lse2), split          split_probs (cpu/amx/backward_ops.hpp)
//     dst ← V·dOᵀ                       scores_tile
//     dS = P ∘ (dst − Δ), split twice   split_grads
//     dV  += P·dO,  dK += dS·Q          rows_tile
//     dQᵀ += Kᵀ·dSᵀ                     pv_tile, into the item's dQ accumulators
// then the batch's dQ·scale → out (one chunk), or its dQ partial → memory, summed over
// the chunks in order by a last pass; at the item's end dK·scale, dV → out, or → its
// subgroup's partials, summed in order by a last pass. Determinism as the FMA backward:
// an item owns its keys' dK, dV (or their partial) and its chunk's dQ partial, every
// sum runs in loop order, and the tile products are deterministic.
//
// Why the split per item: split for the whole call first, the operands (7 layouts of 3
// bfloat16 parts: 42 MiB at B=2 H=8 S=1024 D=64) went to memory and came back, and that
// pass alone took a fifth of the call; split per item they are used while in cache
// (docs/perf-log.md, "AMX backward"). With several items per kv head each splits again
// the keys or query tiles it shares with the others: the price of keeping every worker
// busy.
//
// Layouts:
//   K, V parts by rows [keys][3][Dp] (A of the score products); Kᵀ parts
//   [keys/96][Dp][3][96] (A of dQ; the forward's pack_v_transposed)
//   per query tile: Q·scale·log2(e), dO with the dims paired [Dp/2][3][Br][2] (B of the
//   score products); Q, dO with the queries paired [Br/2][3][Dp][2] (B of dK, dV);
//   lse2, Δ [Br]; dQᵀ accumulator [Dp][Br]
// An input that does not split (NaN, Inf, |x| > 3e38), or a P or dS that does not, sends
// the call to the AVX-512 FMA backward, which rewrites every gradient.
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#include <algorithm>
#include <atomic>

#include "cpu/amx/backward_ops.hpp"
#include "cpu/amx/ops.hpp"
#include "cpu/backward/backward.hpp"
#include "cpu/kernels.hpp"

namespace fattn::cpu {

// Keys per key tile: two of the forward's. Each visit of a query tile reads its four
// operands (96 KiB at D=64) from beyond L1; the larger tile halves those reads per
// product: S=2048 D=128 9 % faster, S=1024 D=64 the same (docs/perf-log.md, "AMX backward").
template <class S>
inline constexpr int kAmxBackwardKeyTile = 2 * AmxOps<S>::Bc;

template <class S>
struct AmxBackwardWorkspace : BackwardTiles<S, kAmxBackwardKeyTile<S>> {
  using Ops = AmxOps<S>;
  using Tiles = BackwardTiles<S, kAmxBackwardKeyTile<S>>;
  using Tiles::Br, Tiles::Bc, Tiles::p, Tiles::q_tiles, Tiles::tiles, Tiles::key_tiles,
      Tiles::chunks, Tiles::subgroups, Tiles::subgroup_heads, Tiles::kv_heads, Tiles::query_tile;
  static constexpr int kParts = Ops::kParts;

  // The four bf16 operands of a query tile, side by side in this order.
  enum Operand { q_dims, do_dims, q_rows, do_rows, kOperands };

  // A worker holds the query tiles of its item's heads a batch at a time: at most this
  // many bytes of their operands (4 splits, lse2, Δ, the dQ accumulator: ~113 KiB a tile
  // at D=64, ~225 KiB at D=128), so that its memory stays bounded however many heads and
  // tiles the item has (× every worker). One batch at B=2 H=8 up to S=4096 D=128 (the
  // measured shapes); more batches re-read the item's K/V parts.
  static constexpr std::int64_t kQueryBytesPerWorker = std::int64_t{16} << 20;

  // One worker's buffers. A query tile of the item's heads has slot
  // (h − the item's first head)·q_tiles + t; a batch holds `batch` consecutive slots.
  struct Worker {
    bf16 *k, *v, *kt;  // the item's keys
    bf16* operands;    // [batch][kOperands][operand_floats·2]
    float *lse2, *delta, *dq;
    float *dk, *dv;    // [chunk_keys][Dp]: the item's keys
    float *st, *dst, *scratch;
    bf16 *p_rows, *ds_rows, *ds_pairs;
  };

  std::int64_t Dp, chunk_keys, slots, batch, key_floats, operand_floats, tile_t, tile_vec,
      rows_floats;
  std::int64_t worker_floats, dq_parts_at, kv_part, dkv_parts_at, workers_at, total;
  // Within a worker's slot (Worker's pieces, in its order).
  std::int64_t k_at, v_at, kt_at, operands_at, lse2_at, delta_at, dq_at, dk_at, dv_at, st_at,
      dst_at, scratch_at, p_rows_at, ds_rows_at, ds_pairs_at;
  float* base = nullptr;

  AmxBackwardWorkspace(const detail::Problem& problem, int workers)
      : Tiles(problem, /*naive=*/false, workers) {
    Sizes n;
    Dp = Ops::round_up(p.head_dim);
    chunk_keys = n.mul(n.div_up(key_tiles, chunks), Bc);  // the longest chunk, padded
    slots = n.mul(subgroup_heads, q_tiles);  // of an item (the last subgroup may have fewer)
    key_floats = n.mul(n.mul(kParts, chunk_keys), Dp) / 2;  // bf16, two a float
    operand_floats = AmxBackwardOps<S>::query_operand_floats(Dp);  // Dp <= 256: small
    tile_t = Dp * Br;
    tile_vec = align_floats(Br);
    rows_floats = align_floats(kParts * Bc * Br / 2);
    const std::int64_t per_slot = kOperands * operand_floats + 2 * tile_vec + tile_t;
    batch = std::clamp<std::int64_t>(kQueryBytesPerWorker / (per_slot * 4), 1, slots);
    Layout slot;
    k_at = slot.take(key_floats);  // K, V and Kᵀ parts of the item's keys (bf16)
    v_at = slot.take(key_floats);
    kt_at = slot.take(key_floats);
    operands_at = slot.take(n.mul(batch, kOperands * operand_floats));
    lse2_at = slot.take(n.mul(batch, tile_vec));
    delta_at = slot.take(n.mul(batch, tile_vec));
    dq_at = slot.take(n.mul(batch, tile_t));
    dk_at = slot.take(n.mul(chunk_keys, Dp));
    dv_at = slot.take(n.mul(chunk_keys, Dp));
    st_at = slot.take(Bc * Br);
    dst_at = slot.take(Bc * Br);
    scratch_at = slot.take(tile_t);
    p_rows_at = slot.take(rows_floats);
    ds_rows_at = slot.take(rows_floats);
    ds_pairs_at = slot.take(rows_floats);
    worker_floats = slot.end;
    kv_part = n.align(n.mul(n.mul(key_tiles, Bc), Dp));  // one kv head's dK (or dV) rows
    Layout all;
    dq_parts_at = all.take(chunks > 1 ? n.mul(chunks, n.mul(tiles, tile_t)) : 0);
    dkv_parts_at = all.take(n.mul(this->dkv_blocks(), kv_part));
    workers_at = all.take(n.mul(workers, worker_floats));
    total = n.overflow || slot.n.overflow || all.n.overflow ? -1 : all.end;
  }

  static bf16* as_parts(float* at) { return reinterpret_cast<bf16*>(at); }
  Worker worker(int w) const {
    float* s = base + workers_at + w * worker_floats;
    Worker r;
    r.k = as_parts(s + k_at);
    r.v = as_parts(s + v_at);
    r.kt = as_parts(s + kt_at);
    r.operands = as_parts(s + operands_at);
    r.lse2 = s + lse2_at;
    r.delta = s + delta_at;
    r.dq = s + dq_at;
    r.dk = s + dk_at;
    r.dv = s + dv_at;
    r.st = s + st_at;
    r.dst = s + dst_at;
    r.scratch = s + scratch_at;
    r.p_rows = as_parts(s + p_rows_at);
    r.ds_rows = as_parts(s + ds_rows_at);
    r.ds_pairs = as_parts(s + ds_pairs_at);
    return r;
  }
  // The query tile of slot s of an item whose first query head is (b, h_begin).
  QueryTile slot_tile(std::int64_t b, std::int64_t h_begin, std::int64_t s) const {
    return query_tile(b, h_begin + s / q_tiles, s % q_tiles);
  }
  bf16* operand(const Worker& w, std::int64_t slot, Operand which) const {
    return w.operands + (slot * kOperands + which) * operand_floats * 2;
  }
  float* lse2(const Worker& w, std::int64_t slot) const { return w.lse2 + slot * tile_vec; }
  float* delta(const Worker& w, std::int64_t slot) const { return w.delta + slot * tile_vec; }
  float* dq(const Worker& w, std::int64_t slot) const { return w.dq + slot * tile_t; }
  float* dq_part(std::int64_t chunk, std::int64_t tile) const {
    return base + dq_parts_at + (chunk * tiles + tile) * tile_t;
  }
  // Subgroup sub's dK (which 0) or dV (1) rows of kv head (b, hk), [Sk padded][Dp].
  float* dkv_part(std::int64_t sub, std::int64_t b, std::int64_t hk, int which) const {
    return base + dkv_parts_at + this->dkv_block(sub, b, hk, which) * kv_part;
  }

  // The keys [first, first + n) of one kv head into the worker's K, V and Kᵀ parts.
  bool split_keys(std::int64_t b, std::int64_t hk, std::int64_t first, std::int64_t n,
                  const Worker& w) const {
    return AmxBackwardOps<S>::split_keys(p, b, hk, first, n, w.k, w.v, w.kt);
  }

  // One query tile's operands, lse2 and Δ into its batch slot s; its dQ accumulator to zero.
  bool split_query_tile(const QueryTile& x, std::int64_t s, const Worker& w) const {
    std::fill_n(dq(w, s), tile_t, 0.0f);
    return AmxBackwardOps<S>::split_query_tile(
        p, x, w.scratch,
        {operand(w, s, q_dims), operand(w, s, do_dims), operand(w, s, q_rows),
         operand(w, s, do_rows), lse2(w, s), delta(w, s)});
  }
};

template <class S>
void amx_fused_backward(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  using Ops = AmxOps<S>;
  using Fma = typename Ops::Fma;
  using W = AmxBackwardWorkspace<S>;
  W ws(p, exec.workers);
  ws.base = memory;
  const std::int64_t Dp = ws.Dp;

  // Chunk-major item order, as the FMA backward: the heaviest causal items first.
  std::atomic<bool> splittable{true};
  detail::parallel_items(exec, ws.items(), [&](std::int64_t index, int worker) {
    const auto item = ws.item(index);
    const std::int64_t chunk = item.chunk, b = item.b, hk = item.hk;
    const std::int64_t slots = (item.h_end - item.h_begin) * ws.q_tiles;
    const auto w = ws.worker(worker);
    const std::int64_t keys0 = ws.chunk_begin(chunk) * W::Bc;  // the chunk's first key
    const std::int64_t keys = std::min(p.kv_len, ws.chunk_end(chunk) * W::Bc) - keys0;
    const std::int64_t t_first = ws.first_tile_seeing(keys0);  // no earlier tile sees a key

    if (!ws.split_keys(b, hk, keys0, keys, w)) {
      splittable.store(false, std::memory_order_relaxed);
      return;
    }
    std::fill_n(w.dk, keys * Dp, 0.0f);
    std::fill_n(w.dv, keys * Dp, 0.0f);

    const typename Ops::Scope tiles;
    using Bwd = AmxBackwardOps<S>;
    bool grads_split = true;
    PrefetchTask prefetch;
    // Query tile x (batch slot s) against key tile `key` (j: its first key in the item's
    // parts); s_next: the slot visited after it, whose operands the products prefetch.
    auto visit = [&](const auto& key, std::int64_t j, const QueryTile& x, std::int64_t s,
                     std::int64_t s_next) {
      prefetch.start();
      prefetch.add(ws.operand(w, s_next, W::q_dims), W::kOperands * ws.operand_floats * 4);
      prefetch.add(ws.dq(w, s_next), ws.tile_t * 4);
      prefetch.add(ws.lse2(w, s_next), W::Br * 4);
      prefetch.add(ws.delta(w, s_next), W::Br * 4);
      float* dk = w.dk + j * Dp;
      float* dv = w.dv + j * Dp;
      const typename Fma::Band diag{key.j0, x.i0, p.band_lo, p.band_hi};
      const bool on_edge = p.needs_mask(x.i0, x.i0 + x.rows, key.j0, key.j0 + key.nj);
      const auto* on_diagonal = on_edge ? &diag : nullptr;
      Ops::scores_tile(w.k, Dp, j, key.nj, ws.operand(w, s, W::q_dims), w.st, on_diagonal,
                       &prefetch);
      Bwd::split_probs(w.st, ws.lse2(w, s), key.nj, on_diagonal, w.p_rows);
      Ops::scores_tile(w.v, Dp, j, key.nj, ws.operand(w, s, W::do_dims), w.dst, on_diagonal,
                       &prefetch);
      grads_split &= Bwd::split_grads(w.st, w.dst, ws.delta(w, s), key.nj, on_diagonal,
                                      w.ds_rows, w.ds_pairs);
      Ops::rows_tile(w.p_rows, key.nj, ws.operand(w, s, W::do_rows), Dp, dv, on_diagonal,
                     &prefetch);
      Ops::rows_tile(w.ds_rows, key.nj, ws.operand(w, s, W::q_rows), Dp, dk, on_diagonal,
                     &prefetch);
      // Kᵀ parts are laid out per forward key tile (pack_v_transposed): two halves.
      for (std::int64_t h0 = 0; h0 < key.nj; h0 += Ops::Bc) {
        const typename Fma::Band half{key.j0 + h0, x.i0, p.band_lo, p.band_hi};
        const std::int64_t nh = std::min<std::int64_t>(Ops::Bc, key.nj - h0);
        const bool half_on_edge = p.needs_mask(x.i0, x.i0 + x.rows, key.j0 + h0, key.j0 + h0 + nh);
        Ops::pv_tile(w.kt, j + h0, nh, w.ds_pairs + h0 / 2 * Ops::kPairRows, Dp, ws.dq(w, s),
                     half_on_edge ? &half : nullptr, &prefetch);
      }
    };

    // The heads' query tiles a batch at a time: split the batch, run every key tile of
    // the chunk against it, then its dQ out (zero for the tiles that see none of the
    // chunk's keys) — to the output, or this chunk's partial.
    for (std::int64_t first = 0; first < slots; first += ws.batch) {
      const std::int64_t last = std::min(slots, first + ws.batch);
      bool ok = true;
      for (std::int64_t s = first; ok && s < last; ++s) {
        const QueryTile x = ws.slot_tile(b, item.h_begin, s);
        if (x.t >= t_first) ok = ws.split_query_tile(x, s - first, w);
      }
      if (!ok) {
        splittable.store(false, std::memory_order_relaxed);
        return;
      }
      for (std::int64_t kt = ws.chunk_begin(chunk); kt < ws.chunk_end(chunk); ++kt) {
        const auto key = ws.key_tile(kt);
        const std::int64_t j = key.j0 - keys0, t_seeing = ws.first_tile_seeing(key.j0);
        // Visits run one tile behind the loop, so that each knows the next; the last
        // one's next is the key tile's first.
        std::int64_t first_seen = -1, pending = -1;
        for (std::int64_t s = first; s < last; ++s) {
          const QueryTile x = ws.slot_tile(b, item.h_begin, s);
          if (x.t < t_seeing || x.kv_end <= key.j0) continue;  // sees none of its keys
          if (pending >= 0)
            visit(key, j, ws.slot_tile(b, item.h_begin, pending), pending - first, s - first);
          else
            first_seen = s;
          pending = s;
        }
        if (pending >= 0)
          visit(key, j, ws.slot_tile(b, item.h_begin, pending), pending - first, first_seen - first);
      }
      for (std::int64_t s = first; s < last; ++s) {
        const QueryTile x = ws.slot_tile(b, item.h_begin, s);
        const float* acc = x.t >= t_first ? ws.dq(w, s - first) : nullptr;
        if (ws.chunks == 1)
          backward_detail::store_query_grads<S, W::Br>(p, x, acc ? 1 : 0,
                                                       [&](std::int64_t) { return acc; });
        else if (acc)
          std::copy_n(acc, ws.tile_t, ws.dq_part(chunk, x.index));
        else
          std::fill_n(ws.dq_part(chunk, x.index), ws.tile_t, 0.0f);
      }
    }
    backward_detail::put_key_grads<S>(p, Dp, ws.subgroups, b, hk, keys0, keys, w.dk, w.dv,
                                      [&](int which) { return ws.dkv_part(item.sub, b, hk, which); });
    if (!grads_split) splittable.store(false, std::memory_order_relaxed);
  });
  if (!splittable.load()) return avx512_kernels.fused_backward(p, exec, memory);

  backward_detail::sum_partials<S>(p, exec, ws, /*dq_in_parts=*/ws.chunks > 1);
}

}  // namespace fattn::cpu
#endif
