// fattn-bench — wall-clock timing of repeated runs (see timing.hpp).
#include "timing.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <vector>

namespace fattn_bench {

double milliseconds(const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> values) {
  if (values.empty()) throw std::invalid_argument("median: no values");
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

Timing time_runs(const std::function<void()>& run, int warmup, int reps) {
  if (reps < 1) throw std::invalid_argument("time_runs: reps must be at least 1");
  for (int i = 0; i < warmup; ++i) run();
  std::vector<double> ms;
  ms.reserve(static_cast<std::size_t>(reps));
  for (int i = 0; i < reps; ++i) ms.push_back(milliseconds(run));
  const auto [least, most] = std::minmax_element(ms.begin(), ms.end());
  return {median(ms), *least, *most};
}

}  // namespace fattn_bench
