// fattn-bench — how busy the rest of the machine was while we measured.
//
// A benchmark on a shared or virtual machine is only as good as its quiet: another
// process on the same cores, or a hypervisor stealing time, inflates every figure.
// CpuSharing compares the CPU time all processes used (/proc/stat) with the CPU time
// this process used (getrusage) over the same interval. /proc/stat is in units of
// 1/USER_HZ s (10 ms), each field rounded on its own and the time sampled at the
// scheduler tick, so its error is deducted as slack: the figure is a lower bound, and
// blind to disturbances shorter than a few tens of ms.
#pragma once

#include <cstdint>

namespace fattn_bench {

// Other processes' CPU use above this (a tenth of a core: more than the background
// noise of daemons and a shell on an idle machine) distorts the figures.
inline constexpr double kBusyCores = 0.1;

class CpuSharing {
 public:
  CpuSharing();  // starts the interval

  // Over the interval, in cores' worth (0 = idle machine, 1 = one core busy):
  double others_cores() const;  // CPU time of other processes / wall time
  double steal_cores() const;   // time the hypervisor gave to other guests / wall time

 private:
  struct Snapshot {
    double wall_seconds = 0, all_busy_seconds = 0, steal_seconds = 0, self_seconds = 0;
  };
  // Error of a /proc/stat difference, in units of 1/USER_HZ: one per summed field
  // (user, nice, system, irq, softirq: each rounded) and one tick in flight per CPU.
  static constexpr int kRoundedFields = 5;
  static Snapshot take();
  Snapshot start_;
};

}  // namespace fattn_bench
