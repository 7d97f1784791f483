// fattn-bench — wall-clock timing of repeated runs (see timing.hpp).
#include "timing.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <vector>

namespace fattn_bench {

Timing time_runs(const std::function<void()>& run, int warmup, int reps) {
  if (reps < 1) throw std::invalid_argument("time_runs: reps must be at least 1");
  for (int i = 0; i < warmup; ++i) run();
  std::vector<double> ms;
  ms.reserve(static_cast<std::size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    const auto stop = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  std::sort(ms.begin(), ms.end());
  const std::size_t mid = ms.size() / 2;
  const double median = ms.size() % 2 ? ms[mid] : 0.5 * (ms[mid - 1] + ms[mid]);
  return {median, ms.front(), ms.back()};
}

}  // namespace fattn_bench
