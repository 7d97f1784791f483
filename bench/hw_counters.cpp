// fattn-bench — the hardware-counter probe (see hw_counters.hpp).
#include "hw_counters.hpp"

#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace fattn_bench {

CounterProbe probe_hardware_counters() {
  perf_event_attr attr{};
  attr.type = PERF_TYPE_HARDWARE;
  attr.size = sizeof attr;
  attr.config = PERF_COUNT_HW_CPU_CYCLES;
  attr.disabled = 1;
  attr.exclude_kernel = 1;
  attr.exclude_hv = 1;
  const long fd = syscall(SYS_perf_event_open, &attr, 0 /* this process */, -1 /* any CPU */,
                          -1 /* no group */, 0);
  if (fd < 0) return {false, std::string("perf_event_open(cpu-cycles): ") + std::strerror(errno)};
  const int descriptor = static_cast<int>(fd);
  ioctl(descriptor, PERF_EVENT_IOC_ENABLE, 0);
  volatile std::uint64_t spin = 0;
  for (int i = 0; i < 1000000; ++i) spin = spin + 1;
  ioctl(descriptor, PERF_EVENT_IOC_DISABLE, 0);
  std::uint64_t cycles = 0;
  const bool read_ok = read(descriptor, &cycles, sizeof cycles) == sizeof cycles;
  close(descriptor);
  if (!read_ok || cycles == 0) return {false, "perf_event_open(cpu-cycles) opened but counted 0"};
  return {true, "cpu-cycles counted"};
}

}  // namespace fattn_bench
