// fattn-bench — whether this machine exposes hardware performance counters.
//
// Opens the CPU-cycles counter of this process through perf_event_open(2), the call
// `perf stat` makes. On the KVM guests we develop on it fails (the hypervisor does
// not virtualise the PMU: `perf stat -e cycles` says "<not supported>"), so the
// roofline's traffic is the model's, not a measurement; the report says so.
#pragma once

#include <string>

namespace fattn_bench {

struct CounterProbe {
  bool available = false;
  std::string detail;  // "cpu-cycles counted" or why not (the errno text)
};

CounterProbe probe_hardware_counters();

}  // namespace fattn_bench
