// fattn-bench — wall-clock timing of repeated runs (std::chrono::steady_clock).
#pragma once

#include <functional>
#include <vector>

namespace fattn_bench {

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
};

// Runs `run` `warmup` times untimed, then `reps` times timed one by one.
Timing time_runs(const std::function<void()>& run, int warmup, int reps);

// The wall-clock milliseconds of one run, and the median of some (the sweeps that alternate
// or rotate their contenders time each run with these).
double milliseconds(const std::function<void()>& run);
double median(std::vector<double> values);

}  // namespace fattn_bench
