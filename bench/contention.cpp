// fattn-bench — CPU time used by other processes during the run (see contention.hpp).
#include "contention.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>

namespace fattn_bench {
namespace {

double seconds(const timeval& t) {
  constexpr double kSecondsPerMicrosecond = 1e-6;
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * kSecondsPerMicrosecond;
}

}  // namespace

CpuSharing::CpuSharing() : start_(take()) {}

CpuSharing::Snapshot CpuSharing::take() {
  Snapshot s;
  s.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  // First line of /proc/stat: "cpu user nice system idle iowait irq softirq steal ..."
  // in clock ticks, summed over all CPUs.
  std::ifstream stat("/proc/stat");
  std::string label;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  stat >> label >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  s.all_busy_seconds = (user + nice + system + irq + softirq) / tick;
  s.steal_seconds = steal / tick;
  rusage self{};
  getrusage(RUSAGE_SELF, &self);
  s.self_seconds = seconds(self.ru_utime) + seconds(self.ru_stime);
  return s;
}

double CpuSharing::others_cores() const {
  const Snapshot now = take();
  const double wall = now.wall_seconds - start_.wall_seconds;
  if (wall <= 0) return 0;
  const double slack = static_cast<double>(kRoundedFields + sysconf(_SC_NPROCESSORS_ONLN)) /
                       static_cast<double>(sysconf(_SC_CLK_TCK));
  const double others = (now.all_busy_seconds - start_.all_busy_seconds) -
                        (now.self_seconds - start_.self_seconds) - slack;
  return std::max(0.0, others / wall);
}

double CpuSharing::steal_cores() const {
  const Snapshot now = take();
  const double wall = now.wall_seconds - start_.wall_seconds;
  return wall <= 0 ? 0 : (now.steal_seconds - start_.steal_seconds) / wall;
}

}  // namespace fattn_bench
