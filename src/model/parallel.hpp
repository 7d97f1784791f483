// fattn — spreading work items over threads.
#pragma once

#include <atomic>
#include <cstdint>

#include "fattn/attention.hpp"

namespace fattn::detail {

struct Exec {
  int workers = 1;
  const ParallelRunner* runner = nullptr;  // nullptr: OpenMP
};

// Resolves Options::num_threads (0: all cores) and the runner.
Exec make_exec(const Options& options);

// Calls worker(arg, w) once for each w in [0, exec.workers), through the runner.
void run_workers(const Exec& exec, void (*worker)(void* arg, int worker_index), void* arg);

// Dynamic schedule: each worker takes the next item index from a shared counter
// until none is left, so items listed heaviest-first balance well (causal rows).
template <class Body>
void parallel_items(const Exec& exec, std::int64_t items, Body&& body) {
  struct Shared {
    Body* body;
    std::int64_t items;
    std::atomic<std::int64_t> next{0};
  } shared{&body, items};
  run_workers(
      exec,
      [](void* arg, int worker) {
        auto& s = *static_cast<Shared*>(arg);
        for (std::int64_t item = s.next.fetch_add(1, std::memory_order_relaxed); item < s.items;
             item = s.next.fetch_add(1, std::memory_order_relaxed))
          (*s.body)(item, worker);
      },
      &shared);
}

}  // namespace fattn::detail
