// fattn-bench — wall-clock timing of repeated runs (std::chrono::steady_clock).
#pragma once

#include <functional>

namespace fattn_bench {

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
};

// Runs `run` `warmup` times untimed, then `reps` times timed one by one.
Timing time_runs(const std::function<void()>& run, int warmup, int reps);

}  // namespace fattn_bench
