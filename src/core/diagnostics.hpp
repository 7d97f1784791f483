// fattn — the recording side of fattn/diagnostics.hpp.
#pragma once

#include <chrono>

#include "fattn/diagnostics.hpp"

namespace fattn::detail {

// Stores the stage times that last_naive_stage_seconds() returns on this thread.
void record_naive_stage_seconds(const NaiveStageSeconds& seconds);

// Seconds since construction or the previous lap().
class StageClock {
 public:
  double lap() {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    return seconds;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

}  // namespace fattn::detail
