// fattn — working memory of the CPU backward, and its pre-pass.
//
// One allocation (every piece 64-byte aligned). Per kv head (O(Sk)):
//   K panels, V panels   keys and values re-laid for broadcast (S = K·Qᵀ, dP = V·dOᵀ)
//   K rows               keys with contiguous dims (dQ += dS·K), only when K's dim stride ≠ 1
// Per query tile of Br rows (O(Sq)):
//   qt, dot  [D][Br]     Q·scale·log2(e) and dO, transposed (operands of S and dP)
//   q, do    [Br][Dp]    Q and dO rows, dims padded to whole vectors (operands of dK, dV);
//                        none when the input's dims are contiguous and fill whole vectors
//                        (D = 64, 128 …): its own rows are read
//   lse2, delta [Br]     logsumexp in log2 units (+inf for a row without keys), Δ
//   dq parts [C][D][Br]  fused: one dQ partial per key chunk, summed in chunk order
//   dK, dV parts         fused with several query-head subgroups: one per subgroup and kv
//                        head [Sk padded][Dp], summed in subgroup order
// Naive only (O(Sq·Sk)):  P and dS of every query tile, [Sk padded][Br]
// Per worker (O(1) in S): st, dst [Bc][Br], dK and dV accumulators [Bc][Dp], dqt, ones.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu/backward/ops.hpp"
#include "cpu/common/workspace.hpp"

namespace fattn::cpu {

// Per query row of one tile of Br rows: lse2, the logsumexp in log2 units (+inf for a
// row without keys and for the padding rows: P = 2^−inf = 0), and
// Δ = rowsum(dO ∘ O) − dlse (0 for the padding rows).
template <class S>
void query_row_stats(const detail::Problem& p, const QueryTile& x, int Br, float* lse2,
                     float* delta) {
  constexpr float kInf = -TileOps<S>::kNegInf;
  for (std::int64_t i = 0; i < Br; ++i) {
    if (i >= x.rows) {
      lse2[i] = kInf;
      delta[i] = 0.0f;
      continue;
    }
    float di[detail::kMaxHeadDim], oi[detail::kMaxHeadDim];
    load_row(p.dout, p.dtype, x.b, x.h, x.i0 + i, p.head_dim, di);
    load_row(p.out, p.dtype, x.b, x.h, x.i0 + i, p.head_dim, oi);
    float rowsum = 0.0f;
    for (std::int64_t d = 0; d < p.head_dim; ++d) rowsum += di[d] * oi[d];
    const float l = *p.lse.row(x.b, x.h, x.i0 + i);
    lse2[i] = l == -kInf ? kInf : l * TileOps<S>::kLog2e;
    delta[i] = rowsum - (p.dlse.data ? *p.dlse.row(x.b, x.h, x.i0 + i) : 0.0f);
  }
}

// How the fused backward's workspace of one sequence of a ragged batch is sized
// (cpu/backward/ragged.hpp): for `target` items, its share of the call's, and without
// worker slots of its own (the batch's sequences share one set, given to place()).
struct SequenceShare {
  std::int64_t target;
};

// Where a backward workspace of either ISA lies: its memory (base), and its workers' slots
// of worker_floats each, in that memory from workers_at or, for a ragged batch's sequence,
// in one set that all the batch's sequences share (cpu/backward/ragged.hpp).
struct BackwardMemory {
  float* base = nullptr;
  std::int64_t worker_floats = 0, workers_at = 0;  // set by the workspace's layout
  float* slot_base = nullptr;
  std::int64_t slot_stride = 0;  // floats from one worker's slot to the next

  // Puts the workspace in `memory` (its total floats), its worker slots there too or in
  // `worker_slots`, `stride` floats apart (≥ worker_floats).
  void place(float* memory, float* worker_slots = nullptr, std::int64_t stride = 0) {
    base = memory;
    slot_base = worker_slots ? worker_slots : memory + workers_at;
    slot_stride = worker_slots ? stride : worker_floats;
  }
  float* slot(int w) const { return slot_base + w * slot_stride; }
};

// The tiles of the backward and which of them meet: query tiles of Br rows, key tiles of
// Bc keys. Shared by the FMA and AMX backward.
//
// The fused kernels' work items: (key chunk, kv head, subgroup of its query heads). An
// item owns its keys' dK/dV for its subgroup and its subgroup's dQ for its keys; with
// several subgroups the dK/dV are partials summed in order afterwards, with several
// chunks the dQ. There are at least kItemsPerWorker items per worker where the problem
// allows: subgroups first (an extra subgroup costs two key-sized partials, an extra chunk
// a query-sized one: group × as much), then chunks. With 2 workers and 16 kv heads: one
// of each (no partials); MQA with 32 query heads on 64 workers: 32 subgroups × 4 chunks,
// partials 4·|Q| + 2·|Q| instead of the 128·|Q| of chunks alone.
template <class S, int KeysPerTile = TileOps<S>::Bc>
struct BackwardTiles {
  static constexpr int Br = TileOps<S>::Br;
  static constexpr int Bc = KeysPerTile;
  static constexpr int MK = TileOps<S>::MK;
  static constexpr int kItemsPerWorker = 2;

  const detail::Problem& p;
  // tiles = B·Hq·ceil(Sq/Br) ≤ the elements of q: no overflow.
  std::int64_t q_tiles, tiles, key_tiles, kv_heads, subgroups, subgroup_heads, chunks;

  // The items a call on `workers` threads aims at (the naive backward has no items).
  static std::int64_t items_target(bool naive, int workers) {
    return naive ? 1 : kItemsPerWorker * std::int64_t{workers};
  }

  // target: the items to split the work into where the problem allows (items_target, or a
  // ragged batch's share of it for one sequence, cpu/backward/ragged.hpp).
  BackwardTiles(const detail::Problem& problem, std::int64_t target)
      : p(problem),
        q_tiles((p.q_len + Br - 1) / Br),
        tiles(p.batch * p.q_heads * q_tiles),
        key_tiles((p.kv_len + Bc - 1) / Bc),
        kv_heads(p.batch * p.kv_heads) {
    const std::int64_t group = p.group_size();
    subgroups = std::clamp<std::int64_t>((target + kv_heads - 1) / kv_heads, 1, group);
    subgroup_heads = (group + subgroups - 1) / subgroups;
    subgroups = (group + subgroup_heads - 1) / subgroup_heads;  // none empty
    const std::int64_t per_chunk = kv_heads * subgroups;
    chunks = std::clamp<std::int64_t>((target + per_chunk - 1) / per_chunk, 1,
                                      std::max<std::int64_t>(key_tiles, 1));
  }
  BackwardTiles(const detail::Problem& problem, bool naive, int workers)
      : BackwardTiles(problem, items_target(naive, workers)) {}

  // Work item i, chunk-major (under a causal mask the first keys are seen by the most
  // queries: the heaviest items come first and the dynamic schedule balances them), then
  // kv head, then subgroup; its query heads [h_begin, h_end).
  struct Item {
    std::int64_t chunk, b, hk, sub, h_begin, h_end;
  };
  std::int64_t items() const { return chunks * kv_heads * subgroups; }
  Item item(std::int64_t i) const {
    const std::int64_t chunk = i / (kv_heads * subgroups), rest = i % (kv_heads * subgroups);
    const std::int64_t head = rest / subgroups, sub = rest % subgroups;
    const std::int64_t b = head / p.kv_heads, hk = head % p.kv_heads;
    const std::int64_t h_begin = hk * p.group_size() + sub * subgroup_heads;
    return {chunk, b, hk, sub, h_begin,
            std::min(h_begin + subgroup_heads, (hk + 1) * p.group_size())};
  }

  QueryTile query_tile(std::int64_t b, std::int64_t h, std::int64_t t) const {
    return query_tile_of(p, Br, q_tiles, b, h, t);
  }
  QueryTile query_tile(std::int64_t index) const {
    const std::int64_t t = index % q_tiles, bh = index / q_tiles;
    return query_tile(bh / p.q_heads, bh % p.q_heads, t);
  }

  // The first query tile with a row that sees key j (the band hides key j from the rows
  // before j − band_hi); q_tiles when none does.
  std::int64_t first_tile_seeing(std::int64_t j) const {
    const std::int64_t first_row = std::max<std::int64_t>(0, j - p.band_hi);
    return std::min(q_tiles, first_row / Br);
  }

  // Key tile kt of a head: its first key, its keys, and those rounded up to whole FMA
  // panels of MK keys (the rows the panel-wise operations touch).
  struct KeyTile {
    std::int64_t j0, nj, rows_padded;
  };
  KeyTile key_tile(std::int64_t kt) const {
    const std::int64_t j0 = kt * Bc;
    const std::int64_t nj = std::min<std::int64_t>(Bc, p.kv_len - j0);
    return {j0, nj, (nj + MK - 1) / MK * MK};
  }
  // Items of one key tile of one kv head (the naive backward's dK/dV stage, the sum of
  // dK/dV partials), key tile major.
  struct KeyItem {
    std::int64_t b, hk;
    KeyTile key;
  };
  std::int64_t key_items() const { return kv_heads * key_tiles; }
  KeyItem key_item(std::int64_t i) const {
    const std::int64_t head = i % kv_heads;
    return {head / p.kv_heads, head % p.kv_heads, key_tile(i / kv_heads)};
  }
  // The key tiles [begin, end) of one chunk.
  std::int64_t chunk_begin(std::int64_t chunk) const { return chunk * key_tiles / chunks; }
  std::int64_t chunk_end(std::int64_t chunk) const { return chunk_begin(chunk + 1); }

  // The dK/dV partials of several subgroups: subgroup sub's dK (which 0) or dV (1) rows of
  // kv head (b, hk), [key_tiles·Bc][row_floats] each; with one subgroup there are none.
  // How many such blocks, and the index of one.
  std::int64_t dkv_blocks() const { return subgroups > 1 ? 2 * subgroups * kv_heads : 0; }
  std::int64_t dkv_block(std::int64_t sub, std::int64_t b, std::int64_t hk, int which) const {
    return (sub * kv_heads + b * p.kv_heads + hk) * 2 + which;
  }

  // Keys the naive backward's P and dS rows of query tile x cover: its visible keys
  // rounded up to whole key tiles (its stage 3 reads whole key tiles), every hidden pair
  // masked.
  std::int64_t keys_covered(const QueryTile& x) const {
    return std::min(p.kv_len, (x.kv_end + Bc - 1) / Bc * Bc);
  }

  // Calls f(query tile) for every query tile of the query heads sharing kv head (b, hk)
  // that has a row seeing a key of the key tile, heads in order, then tiles in order (the
  // naive backward's dK/dV stage).
  template <class F>
  void for_each_query_tile_seeing(std::int64_t b, std::int64_t hk, const KeyTile& key,
                                  F&& f) const {
    for (std::int64_t h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h)
      for (std::int64_t t = first_tile_seeing(key.j0); t < q_tiles; ++t) {
        const QueryTile x = query_tile(b, h, t);
        if (x.kv_begin >= key.j0 + key.nj) break;  // this and later tiles: past the window
        if (x.kv_end > key.j0) f(x);  // else only padding rows of the tile reach j0
      }
  }
};

template <class S>
struct BackwardWorkspace : BackwardTiles<S>, BackwardMemory {
  using Ops = TileOps<S>;
  using Bwd = BackwardOps<S>;
  using Tiles = BackwardTiles<S>;
  using Tiles::Br, Tiles::Bc, Tiles::p, Tiles::q_tiles, Tiles::tiles, Tiles::key_tiles,
      Tiles::chunks, Tiles::subgroups, Tiles::kv_heads, Tiles::query_tile;

  struct Worker {
    float *st, *dst, *dk, *dv, *dqt, *ones;
    float* cap;  // fused, softcap only: 1 − tanh² of the tile's scores [Bc][Br]
  };
  // Query-side rows (Q or dO) of one tile: the first row and the stride between rows.
  struct Rows {
    const float* data;
    std::int64_t stride;
  };
  using QueryTile = cpu::QueryTile;

  bool naive;
  bool q_direct, do_direct;  // Q / dO rows read in place (no padded copy)
  std::int64_t Dp, kv_padded;
  std::int64_t panel_head, k_rows_head, tile_t, tile_rows, tile_vec, full_block;
  std::int64_t k_panels_at, v_panels_at, k_rows_at, qt_at, dot_at, q_rows_at, do_rows_at;
  std::int64_t lse2_at, delta_at, dq_parts_at, dkv_parts_at, kv_part, probs_at, dscores_at,
      cap_grads_at, total;
  std::int64_t st_at, dst_at, dk_at, dv_at, dqt_at, ones_at, cap_at;  // within a worker's slot
  bool has_cap;  // the fused backward with softcap keeps 1 − tanh² per worker

  BackwardWorkspace(const detail::Problem& problem, bool is_naive, int workers)
      : BackwardWorkspace(problem, is_naive, workers, Tiles::items_target(is_naive, workers)) {}
  BackwardWorkspace(const detail::Problem& problem, SequenceShare share)
      : BackwardWorkspace(problem, /*is_naive=*/false, /*slot_workers=*/0, share.target) {}

 private:
  // With `target` items (BackwardTiles) and `slot_workers` worker slots in its own memory.
  BackwardWorkspace(const detail::Problem& problem, bool is_naive, int slot_workers,
                    std::int64_t target)
      : Tiles(problem, target), naive(is_naive) {
    Sizes n;  // every product checked, as in Workspace
    Dp = Bwd::padded_dim(p.head_dim);
    q_direct = rows_in_place(p.q, p.dtype) && Dp == p.head_dim;
    // backward_extra_bytes sees no dout: it assumes one laid out like q.
    do_direct = rows_in_place(p.dout.data ? p.dout : p.q, p.dtype) && Dp == p.head_dim;
    kv_padded = n.mul(n.div_up(p.kv_len, Ops::MK), Ops::MK);
    panel_head = n.align(n.mul(kv_padded, p.head_dim));
    k_rows_head = rows_in_place(p.k, p.dtype) ? 0 : n.align(n.mul(p.kv_len, p.head_dim));
    tile_t = align_floats(p.head_dim * Br);  // head_dim <= 256: no overflow
    tile_rows = Br * Dp;
    tile_vec = align_floats(Br);
    full_block = naive ? n.mul(kv_padded, Br) : 0;
    has_cap = p.mods.softcap != 0.0 && !naive;

    Layout slot;  // Bc, Br and Dp are small: no overflow
    st_at = slot.take(naive ? 0 : Bc * Br);
    dst_at = slot.take(naive ? 0 : Bc * Br);
    dk_at = slot.take(Bc * Dp);
    dv_at = slot.take(Bc * Dp);
    dqt_at = slot.take(tile_t);
    ones_at = slot.take(tile_vec);
    cap_at = slot.take(has_cap ? Bc * Br : 0);
    worker_floats = slot.end;

    Layout all;
    k_panels_at = all.take(n.mul(kv_heads, panel_head));
    v_panels_at = all.take(n.mul(kv_heads, panel_head));
    k_rows_at = all.take(n.mul(kv_heads, k_rows_head));
    qt_at = all.take(n.mul(tiles, tile_t));
    dot_at = all.take(n.mul(tiles, tile_t));
    q_rows_at = all.take(q_direct ? 0 : n.mul(tiles, tile_rows));
    do_rows_at = all.take(do_direct ? 0 : n.mul(tiles, tile_rows));
    lse2_at = all.take(n.mul(tiles, tile_vec));
    delta_at = all.take(n.mul(tiles, tile_vec));
    dq_parts_at = all.take(naive ? 0 : n.mul(chunks, n.mul(tiles, tile_t)));
    kv_part = n.align(n.mul(n.mul(key_tiles, Bc), Dp));  // one kv head's dK (or dV) rows
    dkv_parts_at = all.take(n.mul(this->dkv_blocks(), kv_part));
    probs_at = all.take(n.mul(tiles, full_block));
    dscores_at = all.take(n.mul(tiles, full_block));
    cap_grads_at = all.take(p.mods.softcap != 0.0 ? n.mul(tiles, full_block) : 0);
    workers_at = all.take(n.mul(slot_workers, worker_floats));
    total = n.overflow || all.n.overflow ? -1 : all.end;
  }

 public:

  const float* k_panels(std::int64_t b, std::int64_t hk) const {
    return base + k_panels_at + (b * p.kv_heads + hk) * panel_head;
  }
  const float* v_panels(std::int64_t b, std::int64_t hk) const {
    return base + v_panels_at + (b * p.kv_heads + hk) * panel_head;
  }
  // K rows of one head, dims contiguous, and the stride between rows.
  const float* k_rows(std::int64_t b, std::int64_t hk, std::int64_t* row_stride) const {
    const float* copy =
        k_rows_head == 0 ? nullptr : base + k_rows_at + (b * p.kv_heads + hk) * k_rows_head;
    return head_rows(p.k, b, hk, copy, p.head_dim, row_stride);
  }
  float* qt(std::int64_t tile) const { return base + qt_at + tile * tile_t; }
  float* dot(std::int64_t tile) const { return base + dot_at + tile * tile_t; }
  float* q_copy(std::int64_t tile) const { return base + q_rows_at + tile * tile_rows; }
  float* do_copy(std::int64_t tile) const { return base + do_rows_at + tile * tile_rows; }
  float* lse2(std::int64_t tile) const { return base + lse2_at + tile * tile_vec; }
  float* delta(std::int64_t tile) const { return base + delta_at + tile * tile_vec; }
  float* dq_part(std::int64_t chunk, std::int64_t tile) const {
    return base + dq_parts_at + (chunk * tiles + tile) * tile_t;
  }
  // Subgroup sub's dK (which 0) or dV (1) rows of kv head (b, hk), [Sk padded][Dp].
  float* dkv_part(std::int64_t sub, std::int64_t b, std::int64_t hk, int which) const {
    return base + dkv_parts_at + this->dkv_block(sub, b, hk, which) * kv_part;
  }
  float* probs(std::int64_t tile) const { return base + probs_at + tile * full_block; }
  float* dscores(std::int64_t tile) const { return base + dscores_at + tile * full_block; }
  // The naive backward with softcap: 1 − tanh² of every score of the tile.
  float* cap_grads(std::int64_t tile) const { return base + cap_grads_at + tile * full_block; }
  Worker worker(int w) const {
    float* s = slot(w);
    return {naive ? nullptr : s + st_at, naive ? nullptr : s + dst_at, s + dk_at, s + dv_at,
            s + dqt_at, s + ones_at, has_cap ? s + cap_at : nullptr};
  }

  Rows q_rows(const QueryTile& x) const {
    if (q_direct) return {p.q.row(x.b, x.h, x.i0), p.q.seq};
    return {q_copy(x.index), Dp};
  }
  Rows do_rows(const QueryTile& x) const {
    if (do_direct) return {p.dout.row(x.b, x.h, x.i0), p.dout.seq};
    return {do_copy(x.index), Dp};
  }

  // Pre-pass, one parallel loop: the kv heads' panels and rows, then every query tile's
  // operands, lse2 and Δ; the dQ partials start at zero.
  void prepare(const detail::Exec& exec) const {
    detail::parallel_items(exec, prepare_items(),
                           [&](std::int64_t item, int) { prepare_item(item); });
  }
  // The pre-pass's items: every kv head, then every query tile.
  std::int64_t prepare_items() const { return kv_heads + tiles; }
  void prepare_item(std::int64_t item) const {
    if (item < kv_heads)
      prepare_kv(item / p.kv_heads, item % p.kv_heads);
    else
      prepare_query_tile(query_tile(item - kv_heads));
  }

  void prepare_kv(std::int64_t b, std::int64_t hk) const {
    const std::int64_t head = b * p.kv_heads + hk;
    Ops::pack_k_panels(p.k, p.dtype, b, hk, p.kv_len, p.head_dim,
                       base + k_panels_at + head * panel_head);
    Ops::pack_k_panels(p.v, p.dtype, b, hk, p.kv_len, p.head_dim,
                       base + v_panels_at + head * panel_head);
    if (k_rows_head != 0)
      copy_head_rows(p.k, p.dtype, b, hk, p.kv_len, p.head_dim,
                     base + k_rows_at + head * k_rows_head);
  }

  void prepare_query_tile(const QueryTile& x) const {
    const std::int64_t D = p.head_dim;
    Ops::load_q_transposed(p.q, p.dtype, x.b, x.h, x.i0, x.rows, D,
                           static_cast<float>(p.scale) * Ops::kLog2e, qt(x.index));
    Ops::load_q_transposed(p.dout, p.dtype, x.b, x.h, x.i0, x.rows, D, 1.0f, dot(x.index));
    query_row_stats<S>(p, x, Br, lse2(x.index), delta(x.index));
    float* q = q_direct ? nullptr : q_copy(x.index);
    float* dout = do_direct ? nullptr : do_copy(x.index);
    if (q) std::fill_n(q, Br * Dp, 0.0f);  // padding rows and dims
    if (dout) std::fill_n(dout, Br * Dp, 0.0f);
    for (std::int64_t i = 0; i < x.rows; ++i) {
      if (q) load_row(p.q, p.dtype, x.b, x.h, x.i0 + i, D, q + i * Dp);
      if (dout) load_row(p.dout, p.dtype, x.b, x.h, x.i0 + i, D, dout + i * Dp);
    }
    for (std::int64_t c = 0; !naive && c < chunks; ++c)
      std::fill_n(dq_part(c, x.index), D * Br, 0.0f);
  }
};

}  // namespace fattn::cpu
