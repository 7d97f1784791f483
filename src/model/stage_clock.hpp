// fattn — timing the stages of a kernel. The kernels time themselves with it and report
// the result through Problem::naive_stages; the entry points record it
// (fattn/diagnostics.hpp), so no kernel includes the api layer.
#pragma once

#include <chrono>

namespace fattn::detail {

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
