// fattn — working memory of the CPU kernels, and the key/value pre-pass.
//
// One allocation, carved up here (every piece 64-byte aligned):
//   K panels  B·Hkv·ceil(Sk/key_rows)·key_rows·D   keys re-laid for broadcast (O(S))
//   V rows    B·Hkv·Sk·D, only when V is 16-bit or its head-dim stride is not 1 (O(S))
//   scores    B·Hq·ceil(Sq/Br)·Sk_padded·Br, naive only                (O(Sq·Sk))
//   per worker: qt, ot [D][Br], m, l, alpha, ones [Br], st [Bc][Br]    (O(1) in S)
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/checked.hpp"
#include "model/parallel.hpp"
#include "model/problem.hpp"
#include "cpu/common/elements.hpp"
#include "model/ragged_schedule.hpp"
#include "cpu/common/tile_ops.hpp"

namespace fattn::cpu {

inline std::int64_t align_floats(std::int64_t n) { return (n + 15) / 16 * 16; }

// Size arithmetic that remembers whether anything overflowed 64 bits.
struct Sizes {
  bool overflow = false;
  std::int64_t mul(std::int64_t a, std::int64_t b) {
    std::int64_t r = 0;
    overflow |= !detail::checked_mul(a, b, &r);
    return r;
  }
  std::int64_t add(std::int64_t a, std::int64_t b) {
    std::int64_t r = 0;
    overflow |= !detail::checked_add(a, b, &r);
    return r;
  }
  std::int64_t div_up(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0); }
  std::int64_t align(std::int64_t a) { return mul(div_up(a, 16), 16); }
};

// Pieces of working memory laid one after another, each 64-byte aligned: a piece's size is
// stated once, where it is taken, and its offset kept, so no accessor adds sizes again.
struct Layout {
  Sizes n;
  std::int64_t end = 0;
  std::int64_t take(std::int64_t floats) {
    const std::int64_t at = end;
    end = n.add(end, n.align(floats));
    return at;
  }
};

// Where the packed keys (or values) of each (sequence, kv head) lie in one piece of working
// memory: a dense problem gives every head the room of Sk keys, a ragged one each sequence
// the room of its own keys (padding every sequence to the longest would waste memory and
// the pre-pass's time on a long-tailed mix of lengths).
class HeadRoom {
 public:
  HeadRoom() = default;  // no heads
  // floats_of(keys): the floats one head of that many keys takes (aligned through n).
  template <class FloatsOf>
  HeadRoom(const detail::Problem& p, Sizes& n, FloatsOf floats_of) : kv_heads_(p.kv_heads) {
    if (!p.is_ragged()) {
      per_head_ = floats_of(p.kv_len);
      total_ = n.mul(n.mul(p.batch, p.kv_heads), per_head_);
      return;
    }
    sequence_at_.reserve(static_cast<std::size_t>(p.batch));
    head_of_.reserve(static_cast<std::size_t>(p.batch));
    for (std::int64_t b = 0; b < p.batch; ++b) {
      head_of_.push_back(floats_of(p.runs_elsewhere(b) ? 0 : p.keys_of(b)));
      sequence_at_.push_back(total_);
      total_ = n.add(total_, n.mul(p.kv_heads, head_of_.back()));
    }
  }
  std::int64_t total() const { return total_; }
  std::int64_t at(std::int64_t b, std::int64_t hk) const {
    if (sequence_at_.empty()) return (b * kv_heads_ + hk) * per_head_;
    const auto s = static_cast<std::size_t>(b);
    return sequence_at_[s] + hk * head_of_[s];
  }
  bool empty() const { return total_ == 0; }

 private:
  std::int64_t kv_heads_ = 0, per_head_ = 0, total_ = 0;
  std::vector<std::int64_t> sequence_at_, head_of_;  // ragged: per sequence
};

// f(s, b, hk) for every kv head hk of every sequence b that the kernel computes (a ragged
// problem's not marked Ragged::elsewhere; every one of a dense problem), in one parallel
// section: the key/value pre-passes. s: sequence b's own problem (detail::SequenceOf).
template <class F>
void for_each_kv_head(const detail::Problem& p, const detail::Exec& exec, F&& f) {
  detail::parallel_items(exec, p.batch * p.kv_heads, [&](std::int64_t item, int) {
    const std::int64_t b = item / p.kv_heads, hk = item % p.kv_heads;
    if (p.runs_elsewhere(b)) return;
    const detail::SequenceOf seq(p, b);
    f(seq.get(), b, hk);
  });
}

// One query tile of one head: the rows it holds and the keys they may see. index
// numbers the tiles over (batch, query head, tile), for per-tile buffers.
struct QueryTile {
  std::int64_t b, h, hk, t, index, i0, rows, kv_begin, kv_end;
  // The first key of the key tile (grid of key_tile keys from key 0, the K panels' grid)
  // that holds the first key the rows see: where the tile's visit of the keys starts.
  std::int64_t first_key_tile(std::int64_t key_tile) const { return kv_begin / key_tile * key_tile; }
};
inline QueryTile query_tile_of(const detail::Problem& p, int rows_per_tile, std::int64_t q_tiles,
                               std::int64_t b, std::int64_t h, std::int64_t t) {
  const std::int64_t i0 = t * rows_per_tile;
  const std::int64_t rows = std::min<std::int64_t>(rows_per_tile, p.q_len - i0);
  return {b, h, p.kv_head_of(h), t, (b * p.q_heads + h) * q_tiles + t, i0, rows,
          p.kv_begin(i0), p.kv_end(i0 + rows)};
}

// Work items of `group` consecutive query tiles of one head: how many, and the first
// tile of each. Items run head by head, so a worker's consecutive items read the same
// K/V rows (kept in L2 when a head's K and V fit there); within a head the heaviest
// group comes first under causal masks (later tiles see more keys), so the lightest
// items are the last ones handed out and the dynamic schedule ends balanced.
inline std::int64_t work_items(const detail::Problem& p, std::int64_t q_tiles, int group) {
  return p.batch * p.q_heads * ((q_tiles + group - 1) / group);
}
inline QueryTile first_tile_of_item(const detail::Problem& p, int rows_per_tile,
                                    std::int64_t q_tiles, std::int64_t item, int group) {
  const std::int64_t groups = (q_tiles + group - 1) / group;
  const std::int64_t head = item / groups;
  return query_tile_of(p, rows_per_tile, q_tiles, head / p.q_heads, head % p.q_heads,
                       (groups - 1 - item % groups) * group);
}

// The query tiles of a fused kernel's workspace W (members p, naive, q_tiles, base,
// scores_at, scores_block; tiles of Br rows, TilesPerItem of them per fused work item), as
// fused_loop walks them, and the slots and naive scores that follow from them: one base
// for every workspace instead of a copy in each.
// A ragged problem's items come from ragged_items (listed by the workspace's constructor,
// plan_ragged_items), and its tiles from the sequence's own problem (detail::SequenceOf).
template <class W, int Br, int TilesPerItem>
struct QueryTiling {
  QueryTile query_tile(std::int64_t b, std::int64_t h, std::int64_t t) const {
    return query_tile_of(self().p, Br, self().q_tiles, b, h, t);
  }
  // Tile t of head h of sequence b, whose problem is `seq` (SequenceOf(p, b)).
  QueryTile query_tile(const detail::Problem& seq, std::int64_t b, std::int64_t h,
                       std::int64_t t) const {
    return query_tile_of(seq, Br, self().q_tiles, b, h, t);
  }
  std::int64_t items(int group) const {
    if (self().p.is_ragged()) return ragged_items.count();
    return work_items(self().p, self().q_tiles, group);
  }
  QueryTile first_tile_of(std::int64_t item, int group) const {
    if (!self().p.is_ragged()) return first_tile_of_item(self().p, Br, self().q_tiles, item, group);
    const detail::RaggedItems::Item x = ragged_items.item(item, group);
    return query_tile(detail::SequenceOf(self().p, x.b).get(), x.b, x.h, x.first_tile);
  }
  // The items of a ragged problem, for work items of TilesPerItem tiles (the fused loop's).
  void plan_ragged_items() {
    if (self().p.is_ragged()) ragged_items = detail::RaggedItems(self().p, Br, TilesPerItem);
  }
  detail::RaggedItems ragged_items;
  // Query-tile slots the workers hold: one per query tile of a fused work item (fused_loop's
  // worker·TilesPerItem + n), one per worker for the naive kernel.
  std::int64_t slots(int workers) const {
    return self().naive ? workers : std::int64_t{workers} * TilesPerItem;
  }
  // The naive kernel's scores, a block of scores_block floats per (sequence, query head,
  // query tile): their floats (none for the fused kernel) and where one lies.
  std::int64_t naive_scores_floats(Sizes& n) const {
    const detail::Problem& p = self().p;
    return self().naive ? n.mul(n.mul(p.batch * p.q_heads, self().q_tiles), self().scores_block) : 0;
  }
  float* scores(std::int64_t b, std::int64_t h, std::int64_t t) const {
    const W& w = self();
    return w.base + w.scores_at + ((b * w.p.q_heads + h) * w.q_tiles + t) * w.scores_block;
  }

 private:
  const W& self() const { return static_cast<const W&>(*this); }
};

// Rows of one head with contiguous dims, for the operands read a row at a time (V in
// P·V, K in the backward's dS·K): the tensor's own rows when its dims are contiguous
// (copy == nullptr), else the copy that copy_head_rows made.
inline const float* head_rows(const detail::Strided<const float>& t, std::int64_t b,
                              std::int64_t h, const float* copy, std::int64_t D,
                              std::int64_t* row_stride) {
  if (copy == nullptr) {
    *row_stride = t.seq;
    return t.row(b, h, 0);
  }
  *row_stride = D;
  return copy;
}

template <class S>
struct Workspace : QueryTiling<Workspace<S>, TileOps<S>::Br, TileOps<S>::T::query_tiles_per_item> {
  using Ops = TileOps<S>;
  static constexpr int Br = Ops::Br;

  struct Worker {
    float *qt, *ot, *m, *l, *alpha, *ones;
    float* st;  // one key tile of scores, Bc×Br (fused only)
  };

  const detail::Problem& p;
  bool naive;
  std::int64_t q_tiles, kv_padded, scores_block, worker_floats;
  std::int64_t k_panels_at, v_rows_at, scores_at, workers_at, total;
  std::int64_t qt_at, ot_at, m_at, l_at, alpha_at, ones_at, st_at;  // within a worker's slot
  float* base = nullptr;
  Sizes n;  // every product is checked: broadcast (zero-stride) K and V views make huge
            // sequence lengths valid arguments, and the panels below would wrap 64 bits
  HeadRoom k_room, v_room;  // K panels, V rows (empty: V is read in place)

  Workspace(const detail::Problem& problem, bool is_naive, int workers)
      : p(problem),
        naive(is_naive),
        k_room(p, n, [&](std::int64_t keys) {
          return n.align(n.mul(n.mul(n.div_up(keys, Ops::MK), Ops::MK), p.head_dim));
        }),
        v_room(p, n, [&](std::int64_t keys) {
          return rows_in_place(p.v, p.kv_dtype()) ? 0 : n.align(n.mul(keys, p.head_dim));
        }) {
    q_tiles = n.div_up(p.q_len, Br);
    kv_padded = n.mul(n.div_up(p.kv_len, Ops::MK), Ops::MK);
    scores_block = n.mul(kv_padded, Br);
    this->plan_ragged_items();
    Layout slot;  // head_dim <= 256: no overflow
    qt_at = slot.take(p.head_dim * Br);
    ot_at = slot.take(p.head_dim * Br);
    m_at = slot.take(Br);
    l_at = slot.take(Br);
    alpha_at = slot.take(Br);
    ones_at = slot.take(Br);
    st_at = slot.take(naive ? 0 : Ops::Bc * Br);  // one key tile of scores (fused only)
    worker_floats = slot.end;
    Layout all;
    k_panels_at = all.take(k_room.total());
    v_rows_at = all.take(v_room.total());
    scores_at = all.take(this->naive_scores_floats(n));
    workers_at = all.take(n.mul(this->slots(workers), worker_floats));
    total = n.overflow || all.n.overflow ? -1 : all.end;
  }

  const float* k_panels(std::int64_t b, std::int64_t hk) const {
    return base + k_panels_at + k_room.at(b, hk);
  }
  // V rows of one head, dims contiguous, and the stride between rows.
  const float* v_rows(std::int64_t b, std::int64_t hk, std::int64_t* row_stride) const {
    const float* copy = v_room.empty() ? nullptr : base + v_rows_at + v_room.at(b, hk);
    const auto v = p.is_ragged() ? p.keys_of_sequence(p.v, b) : p.v;
    return head_rows(v, b, hk, copy, p.head_dim, row_stride);
  }
  // Scratch slot w: [0, workers) for naive, [0, workers·query_tiles_per_item) for fused.
  Worker worker(int w) const {
    float* s = base + workers_at + w * worker_floats;
    return {s + qt_at, s + ot_at, s + m_at, s + l_at, s + alpha_at, s + ones_at,
            naive ? nullptr : s + st_at};
  }

  // Pre-pass: every kv head's keys into panels (and V into contiguous rows if needed).
  void prepare_kv(const detail::Exec& exec) const {
    for_each_kv_head(p, exec, [&](const detail::Problem& s, std::int64_t b, std::int64_t hk) {
      Ops::pack_k_panels(s.k, p.kv_dtype(), b, hk, s.kv_len, p.head_dim,
                         base + k_panels_at + k_room.at(b, hk));
      if (!v_room.empty())
        copy_head_rows(s.v, p.kv_dtype(), b, hk, s.kv_len, p.head_dim,
                       base + v_rows_at + v_room.at(b, hk));
    });
  }

  using QueryTile = cpu::QueryTile;
};

}  // namespace fattn::cpu
