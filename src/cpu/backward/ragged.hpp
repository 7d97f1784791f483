// fattn — the fused backward of a ragged batch (attention_varlen_backward): every
// sequence's work items in one parallel section, as the ragged forward's.
//
// For either policy of the backward loop (FmaBackwardMainloop, AmxBackwardMainloop), each
// sequence the kernel runs gets the dense backward's workspace of its own problem
// (Problem::sequence: batch 1, its lengths and band; SequenceShare), one after another in
// one allocation; their workers' slots are one set that all of them use. The call then
// runs the dense backward's parallel sections, each over all those sequences at once:
//   pre-pass       every sequence's kv heads and query tiles (the FMA workspace's
//                  prepare_item; the AMX items split their own operands)
//   items          every sequence's (key chunk, kv head, subgroup) items (backward_item),
//                  heaviest sequence first, so the dynamic schedule ends on the lightest
//   partial sums   every sequence's dQ partials where the policy leaves dQ there, and its
//                  dK/dV partials where it has several subgroups (sum_partial)
// A sequence's chunks and subgroups (BackwardTiles) come from its share, by its work, of
// the call's target of kItemsPerWorker items a worker: a sequence whose share is at most
// its kv heads takes one item per kv head (no partials beyond one dQ partial); a heavier
// one splits its keys and query heads as a call of its own would, so that it does not end
// the section alone on a few threads. Both depend only on the problem and the worker
// count, so the bits are the same on every run.
//
// Sequences without queries or keys, and those marked Ragged::elsewhere, are not this
// kernel's: the caller computes them (zero gradients; another wave; side by side).
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <deque>
#include <vector>

#include "cpu/backward/backward.hpp"
#include "model/ragged_schedule.hpp"

namespace fattn::cpu {

template <class S, class Mainloop>
class RaggedBackward {
 public:
  using W = typename Mainloop::W;

  RaggedBackward(const detail::Problem& p, int workers) {
    std::vector<std::int64_t> order, work(static_cast<std::size_t>(p.batch), 0);
    double total_work = 0.0;
    for (std::int64_t b = 0; b < p.batch; ++b) {
      if (p.runs_elsewhere(b) || p.queries_of(b) == 0 || p.keys_of(b) == 0) continue;
      order.push_back(b);
      work[static_cast<std::size_t>(b)] = detail::sequence_work(p, b);
      total_work += static_cast<double>(work[static_cast<std::size_t>(b)]);
    }
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t x, std::int64_t y) {
      return work[static_cast<std::size_t>(x)] > work[static_cast<std::size_t>(y)];
    });
    const std::int64_t target = W::Tiles::items_target(/*naive=*/false, workers);
    Sizes n;
    for (const std::int64_t b : order) {
      const double share = static_cast<double>(work[static_cast<std::size_t>(b)]) / total_work;
      const std::int64_t own_target =
          std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(share * static_cast<double>(target))));
      const Sequence& s = sequences_.emplace_back(p, b, own_target, total_);
      if (s.ws.total < 0) n.overflow = true;
      total_ = n.add(total_, s.ws.total);
      worker_floats_ = std::max(worker_floats_, s.ws.worker_floats);
    }
    slots_at_ = total_;
    total_ = n.add(total_, n.mul(workers, worker_floats_));
    if (n.overflow) total_ = -1;
  }
  RaggedBackward(const RaggedBackward&) = delete;
  RaggedBackward& operator=(const RaggedBackward&) = delete;

  // Floats of working memory (−1: the sizes overflow 64 bits).
  std::int64_t total() const { return total_; }

  // The sections in `memory` (total() floats). False where an operand did not fit the
  // policy's products (the AMX backward's bfloat16 parts): the partial sums are skipped,
  // and the caller runs another backward, which rewrites every gradient.
  bool run(const detail::Exec& exec, float* memory) {
    for (Sequence& s : sequences_) s.ws.place(memory + s.at, memory + slots_at_, worker_floats_);
    each_item(
        exec, [](const Sequence& s) { return s.ws.prepare_items(); },
        [](const Sequence& s, std::int64_t i, int) { s.ws.prepare_item(i); });
    std::atomic<bool> completed{true};
    each_item(
        exec, [](const Sequence& s) { return s.ws.items(); },
        [&](const Sequence& s, std::int64_t i, int worker) {
          if (!backward_item<S>(s.problem, Mainloop{s.ws}, i, worker))
            completed.store(false, std::memory_order_relaxed);
        });
    if (!completed.load()) return false;
    each_item(
        exec,
        [](const Sequence& s) {
          return backward_detail::partial_sum_items(s.ws, Mainloop{s.ws}.dq_in_parts());
        },
        [](const Sequence& s, std::int64_t i, int worker) {
          backward_detail::sum_partial<S>(s.problem, s.ws, Mainloop{s.ws}.dq_in_parts(), i, worker);
        });
    return true;
  }

 private:
  // One sequence's problem and workspace (which holds a reference to the problem: a
  // Sequence stays where it is built, in a deque), at float `at` of the memory.
  struct Sequence {
    Sequence(const detail::Problem& whole, std::int64_t b, std::int64_t target, std::int64_t offset)
        : problem(whole.sequence(b)), ws(problem, SequenceShare{target}),
          at(offset) {}
    detail::Problem problem;
    W ws;
    std::int64_t at;
  };

  // f(sequence, i, worker) for every i < count(sequence) of every sequence, in one
  // parallel section (none without items), the sequences' items in their order.
  template <class Count, class F>
  void each_item(const detail::Exec& exec, Count count, F f) const {
    std::vector<std::int64_t> first(sequences_.size() + 1, 0);
    for (std::size_t s = 0; s < sequences_.size(); ++s) first[s + 1] = first[s] + count(sequences_[s]);
    if (first.back() == 0) return;  // no section (the AMX backward has no pre-pass)
    detail::parallel_items(exec, first.back(), [&](std::int64_t i, int worker) {
      const auto s = static_cast<std::size_t>(std::upper_bound(first.begin(), first.end(), i) -
                                              first.begin() - 1);
      f(sequences_[s], i - first[s], worker);
    });
  }

  std::deque<Sequence> sequences_;  // heaviest first
  std::int64_t total_ = 0, slots_at_ = 0, worker_floats_ = 0;
};

template <class S>
std::int64_t ragged_backward_workspace_floats(const detail::Problem& p, int workers) {
  return RaggedBackward<S, FmaBackwardMainloop<S>>(p, workers).total();
}

template <class S>
void ragged_fused_backward(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  RaggedBackward<S, FmaBackwardMainloop<S>>(p, exec.workers).run(exec, memory);
}

}  // namespace fattn::cpu
