// fattn — the AMX backward: FlashAttention-2's backward loop (cpu/backward/loop.hpp) with
// its five products on AMX tiles (AmxBackwardMainloop), each from three bfloat16 parts per
// operand (cpu/amx/ops.hpp), so float32-accurate like the forward.
//
// A work item (BackwardTiles: one chunk of key tiles of one kv head and one subgroup of
// its query heads) splits what it reads into its worker's buffers right before use: its
// keys' K, V and Kᵀ parts when it begins, then the operands of its query heads' tiles, a
// batch of tiles at a time (one batch for most shapes; see kQueryBytesPerWorker). Each
// visit of a key tile × query tile runs:
//     st  ← K·Qᵀ                        scores_tile (Q pre-scaled, log2 units)
//     the variants                      the loop (ScoreModOps::finish_scores)
//     P = 2^(st − lse2), split          split_probs (cpu/amx/backward_ops.hpp)
//     dst ← V·dOᵀ                       scores_tile
//     dS = P ∘ (dst − Δ), split twice   split_grads (· 1 − tanh² with softcap)
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
#include "cpu/backward/ragged.hpp"
#include "cpu/kernels.hpp"

namespace fattn::cpu {

// Keys per key tile: two of the forward's. Each visit of a query tile reads its four
// operands (96 KiB at D=64) from beyond L1; the larger tile halves those reads per
// product: S=2048 D=128 9 % faster, S=1024 D=64 the same (docs/perf-log.md, "AMX backward").
template <class S>
inline constexpr int kAmxBackwardKeyTile = 2 * AmxOps<S>::Bc;

template <class S>
struct AmxBackwardWorkspace : BackwardTiles<S, kAmxBackwardKeyTile<S>>, BackwardMemory {
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
    float* cap;  // softcap only: 1 − tanh² of the tile's scores [Bc][Br]
    bf16 *p_rows, *ds_rows, *ds_pairs;
  };

  std::int64_t Dp, chunk_keys, slots, batch, key_floats, operand_floats, tile_t, tile_vec,
      rows_floats;
  std::int64_t dq_parts_at, kv_part, dkv_parts_at, total;
  // Within a worker's slot (Worker's pieces, in its order).
  std::int64_t k_at, v_at, kt_at, operands_at, lse2_at, delta_at, dq_at, dk_at, dv_at, st_at,
      dst_at, scratch_at, cap_at, p_rows_at, ds_rows_at, ds_pairs_at;

  AmxBackwardWorkspace(const detail::Problem& problem, int workers)
      : AmxBackwardWorkspace(problem, workers, Tiles::items_target(/*naive=*/false, workers)) {}
  AmxBackwardWorkspace(const detail::Problem& problem, SequenceShare share)
      : AmxBackwardWorkspace(problem, /*slot_workers=*/0, share.target) {}
  // No pre-pass: the items split what they read (RaggedBackward asks).
  std::int64_t prepare_items() const { return 0; }
  void prepare_item(std::int64_t) const {}

 private:
  // With `target` items (BackwardTiles) and `slot_workers` worker slots in its own memory.
  AmxBackwardWorkspace(const detail::Problem& problem, int slot_workers, std::int64_t target)
      : Tiles(problem, target) {
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
    cap_at = slot.take(p.mods.softcap != 0.0 ? Bc * Br : 0);
    p_rows_at = slot.take(rows_floats);
    ds_rows_at = slot.take(rows_floats);
    ds_pairs_at = slot.take(rows_floats);
    worker_floats = slot.end;
    kv_part = n.align(n.mul(n.mul(key_tiles, Bc), Dp));  // one kv head's dK (or dV) rows
    Layout all;
    dq_parts_at = all.take(chunks > 1 ? n.mul(chunks, n.mul(tiles, tile_t)) : 0);
    dkv_parts_at = all.take(n.mul(this->dkv_blocks(), kv_part));
    workers_at = all.take(n.mul(slot_workers, worker_floats));
    total = n.overflow || slot.n.overflow || all.n.overflow ? -1 : all.end;
  }

 public:

  static bf16* as_parts(float* at) { return reinterpret_cast<bf16*>(at); }
  Worker worker(int w) const {
    float* s = slot(w);
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
    r.cap = p.mods.softcap != 0.0 ? s + cap_at : nullptr;
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

// The backward loop's products on AMX tiles: the item's keys split to bfloat16 parts
// when it begins, its query tiles a batch at a time when the batch begins
// (AmxBackwardWorkspace), the vector passes of AmxBackwardOps between the products.
template <class S>
struct AmxBackwardMainloop {
  using Ops = AmxOps<S>;
  using Bwd = AmxBackwardOps<S>;
  using W = AmxBackwardWorkspace<S>;
  using Visit = BackwardVisit<typename W::KeyTile, typename Ops::Fma::Band>;
  static constexpr bool kProbsMaskBand = true;  // split_probs, split_grads: 0 outside the band
  const W& ws;
  std::int64_t batch = ws.batch;
  // Whether dQ goes to the chunks' partials (several chunks), else out at each batch's end.
  bool dq_in_parts() const { return ws.chunks > 1; }

  struct ItemState {
    typename W::Item item;
    typename W::Worker w;
    float *st, *cap;
    std::int64_t keys0, keys;  // the chunk's first key, its keys
    std::int64_t t_first;      // no earlier query tile sees a key of the chunk
    PrefetchTask prefetch;
    typename Ops::Scope tiles;  // the tile configuration, for the item
  };
  ItemState item(const typename W::Item& item, int worker) const {
    const std::int64_t keys0 = ws.chunk_begin(item.chunk) * W::Bc;
    const auto w = ws.worker(worker);
    return {item, w, w.st, w.cap, keys0,
            std::min(ws.p.kv_len, ws.chunk_end(item.chunk) * W::Bc) - keys0,
            ws.first_tile_seeing(keys0), {}, {}};
  }
  // The chunk's K, V and Kᵀ parts; its dK, dV accumulators at zero.
  bool begin_item(ItemState& t) const {
    if (!ws.split_keys(t.item.b, t.item.hk, t.keys0, t.keys, t.w)) return false;
    std::fill_n(t.w.dk, t.keys * ws.Dp, 0.0f);
    std::fill_n(t.w.dv, t.keys * ws.Dp, 0.0f);
    return true;
  }
  // Whether a row of query tile x may see a key of the item's chunk: the band puts the
  // chunk's first key after the tile's causal limit, or its last before a window's edge.
  static bool sees_chunk(const ItemState& t, const QueryTile& x) {
    return x.t >= t.t_first && x.kv_begin < t.keys0 + t.keys && x.kv_end > t.keys0;
  }
  // The batch's query tiles that see a key of the chunk, split into their slots.
  template <class SlotTile>
  bool begin_batch(ItemState& t, std::int64_t first, std::int64_t last,
                   const SlotTile& slot_tile) const {
    for (std::int64_t s = first; s < last; ++s) {
      const QueryTile x = slot_tile(s);
      if (sees_chunk(t, x) && !ws.split_query_tile(x, s - first, t.w)) return false;
    }
    return true;
  }
  void begin_key(ItemState&, const typename W::KeyTile&) const {}

  // st ← K·Qᵀ; the products prefetch the next visit's operands.
  void scores(ItemState& t, const Visit& v) const {
    t.prefetch.start();
    t.prefetch.add(ws.operand(t.w, v.next_slot, W::q_dims), W::kOperands * ws.operand_floats * 4);
    t.prefetch.add(ws.dq(t.w, v.next_slot), ws.tile_t * 4);
    t.prefetch.add(ws.lse2(t.w, v.next_slot), W::Br * 4);
    t.prefetch.add(ws.delta(t.w, v.next_slot), W::Br * 4);
    Ops::scores_tile(t.w.k, ws.Dp, v.key.j0 - t.keys0, v.key.nj, ws.operand(t.w, v.slot, W::q_dims),
                     t.st, v.edge, &t.prefetch);
  }
  // P = 2^(st − lse2), split by rows
  void probs(ItemState& t, const Visit& v) const {
    Bwd::split_probs(t.st, ws.lse2(t.w, v.slot), v.key.nj, v.edge, t.w.p_rows);
  }
  // dP = V·dOᵀ;  dS = P ∘ (dP − Δ) through the softcap, split by rows and by key pairs
  bool grads(ItemState& t, const Visit& v) const {
    Ops::scores_tile(t.w.v, ws.Dp, v.key.j0 - t.keys0, v.key.nj, ws.operand(t.w, v.slot, W::do_dims),
                     t.w.dst, v.edge, &t.prefetch);
    return Bwd::split_grads(t.st, t.w.dst, ws.delta(t.w, v.slot), t.cap, v.key.nj, v.edge,
                            t.w.ds_rows, t.w.ds_pairs);
  }
  // dV += P·dO;  dK += dS·Q;  dQᵀ += Kᵀ·dSᵀ
  void accumulate(ItemState& t, const Visit& v) const {
    const std::int64_t j = v.key.j0 - t.keys0, Dp = ws.Dp;
    Ops::rows_tile(t.w.p_rows, v.key.nj, ws.operand(t.w, v.slot, W::do_rows), Dp, t.w.dv + j * Dp,
                   v.edge, &t.prefetch);
    Ops::rows_tile(t.w.ds_rows, v.key.nj, ws.operand(t.w, v.slot, W::q_rows), Dp, t.w.dk + j * Dp,
                   v.edge, &t.prefetch);
    // Kᵀ parts are laid out per forward key tile (pack_v_transposed): two halves.
    for (std::int64_t h0 = 0; h0 < v.key.nj; h0 += Ops::Bc) {
      const auto half = Ops::Fma::band_of(ws.p, v.key.j0 + h0, v.x.i0);
      const std::int64_t nh = std::min<std::int64_t>(Ops::Bc, v.key.nj - h0);
      const bool on_edge =
          ws.p.needs_mask(v.x.i0, v.x.i0 + v.x.rows, v.key.j0 + h0, v.key.j0 + h0 + nh);
      Ops::pv_tile(t.w.kt, j + h0, nh, t.w.ds_pairs + h0 / 2 * Ops::kPairRows, Dp,
                   ws.dq(t.w, v.slot), on_edge ? &half : nullptr, &t.prefetch);
    }
  }
  void end_key(ItemState&, const typename W::KeyTile&) const {}
  // The batch's dQ (zero for the tiles that see none of the chunk's keys): ·scale → out
  // with one chunk, else → this chunk's partial.
  template <class SlotTile>
  void end_batch(ItemState& t, std::int64_t first, std::int64_t last,
                 const SlotTile& slot_tile) const {
    for (std::int64_t s = first; s < last; ++s) {
      const QueryTile x = slot_tile(s);
      const float* acc = sees_chunk(t, x) ? ws.dq(t.w, s - first) : nullptr;
      if (ws.chunks == 1)
        backward_detail::store_query_grads<S, W::Br>(ws.p, x, acc ? 1 : 0,
                                                     [&](std::int64_t) { return acc; });
      else if (acc)
        std::copy_n(acc, ws.tile_t, ws.dq_part(t.item.chunk, x.index));
      else
        std::fill_n(ws.dq_part(t.item.chunk, x.index), ws.tile_t, 0.0f);
    }
  }
  // The chunk's dK·scale, dV → out (one subgroup), else → the subgroup's partials.
  void end_item(ItemState& t) const {
    backward_detail::put_key_grads<S>(
        ws.p, ws.Dp, ws.subgroups, t.item.b, t.item.hk, t.keys0, t.keys, t.w.dk, t.w.dv,
        [&](int which) { return ws.dkv_part(t.item.sub, t.item.b, t.item.hk, which); });
  }
};

// False where an operand does not split into bfloat16 parts (kernels.hpp's KernelFn): the
// caller runs the AVX-512 FMA backward, which rewrites every gradient, in the same memory.
template <class S>
bool amx_fused_backward(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  if (p.is_ragged()) return RaggedBackward<S, AmxBackwardMainloop<S>>(p, exec.workers).run(exec, memory);
  AmxBackwardWorkspace<S> ws(p, exec.workers);
  ws.place(memory);
  const AmxBackwardMainloop<S> mainloop{ws};
  if (!fused_backward_loop<S>(p, exec, mainloop)) return false;
  backward_detail::sum_partials<S>(p, exec, ws, mainloop.dq_in_parts());
  return true;
}

}  // namespace fattn::cpu
#endif
