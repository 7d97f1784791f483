// fattn — how a ragged batch's sequences (attention_varlen, a KV cache of per-sequence
// lengths) are scheduled over the workers, in one place:
//   schedule_sequences  which sequences run alone on every worker and which side by side,
//                       one worker each (the api layer, src/api/attention.cpp);
//   RaggedItems         the work items of the sequences a kernel runs together: every
//                       sequence's (query head, group of query tiles) items in one list, so
//                       one parallel section spreads all of them over the cores; sequences
//                       marked Ragged::elsewhere (another wave's, the decode kernel's, or
//                       those run side by side) are left out (the fused forward's workspace,
//                       the ragged backward);
//   sequence_work       the weight that orders sequences heaviest first.
//
// Sequences are listed heaviest first, and within a sequence head by head, each head's
// heaviest group first, as a dense problem's items: the dynamic schedule
// (detail::parallel_items) hands out the lightest items last and ends balanced. Every
// choice depends only on the problem and the worker count, so the bits are the same on
// every run.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "model/problem.hpp"

namespace fattn::detail {

// The work of sequence b, to order sequences heaviest first: its visible (query, key) pairs
// plus one per query row, so a sequence without keys still counts its rows.
inline std::int64_t sequence_work(const Problem& p, std::int64_t b) {
  std::int64_t work = 0;
  for (std::int64_t i = 0; i < p.queries_of(b); ++i)
    work += 1 + std::max<std::int64_t>(0, p.visible_end(b, i) - p.visible_begin(b, i));
  return work;
}

class RaggedItems {
 public:
  RaggedItems() = default;
  RaggedItems(const Problem& p, std::int64_t rows_per_tile, std::int64_t group) {
    std::vector<std::int64_t> weight(static_cast<std::size_t>(p.batch), 0);
    std::vector<std::int64_t> order(weight.size());
    std::iota(order.begin(), order.end(), std::int64_t{0});
    for (std::int64_t b = 0; b < p.batch; ++b)
      if (!p.runs_elsewhere(b)) weight[static_cast<std::size_t>(b)] = sequence_work(p, b);
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t x, std::int64_t y) {
      return weight[static_cast<std::size_t>(x)] > weight[static_cast<std::size_t>(y)];
    });
    for (const std::int64_t b : order) {
      if (p.runs_elsewhere(b)) continue;  // another kernel of the call computes it
      const std::int64_t tiles = (p.queries_of(b) + rows_per_tile - 1) / rows_per_tile;
      const std::int64_t groups = (tiles + group - 1) / group;
      if (groups == 0) continue;  // no query: nothing to compute
      sequences_.push_back({b, count_, groups});
      count_ += p.q_heads * groups;
    }
  }

  std::int64_t count() const { return count_; }

  struct Item {
    std::int64_t b, h, first_tile;
  };
  // The sequence, query head and first query tile of item (< count()); group: tiles per item.
  Item item(std::int64_t index, std::int64_t group) const {
    const auto s = std::upper_bound(sequences_.begin(), sequences_.end(), index,
                                    [](std::int64_t x, const Sequence& q) { return x < q.first_item; }) -
                   1;
    const std::int64_t local = index - s->first_item;
    return {s->b, local / s->groups, (s->groups - 1 - local % s->groups) * group};
  }

 private:
  struct Sequence {
    std::int64_t b, first_item, groups;
  };
  std::vector<Sequence> sequences_;  // heaviest first, with their first item
  std::int64_t count_ = 0;
};

// How the sequences b of a ragged problem with takes(b) run: one with at least 1/workers of
// their work (query rows × keys) alone on every worker (`alone`), the others side by side,
// one worker each, heaviest first (`shared`).
struct SequenceSchedule {
  std::vector<std::int64_t> alone, shared;
};
template <class Takes>
SequenceSchedule schedule_sequences(const Problem& p, int workers, Takes&& takes) {
  auto work = [&](std::int64_t b) {
    return static_cast<double>(p.queries_of(b)) * static_cast<double>(p.keys_of(b));
  };
  double total = 0.0;
  for (std::int64_t b = 0; b < p.batch; ++b)
    if (takes(b)) total += work(b);
  SequenceSchedule schedule;
  for (std::int64_t b = 0; b < p.batch; ++b)
    if (takes(b))
      (workers > 1 && work(b) > 0.0 && work(b) * workers >= total ? schedule.alone : schedule.shared)
          .push_back(b);
  std::stable_sort(schedule.shared.begin(), schedule.shared.end(),
                   [&](std::int64_t x, std::int64_t y) { return work(x) > work(y); });
  return schedule;
}

}  // namespace fattn::detail
