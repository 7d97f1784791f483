// fattn-bench — this machine's data caches, as the OS reports them.
//
// Read from /sys/devices/system/cpu/cpu0/cache/index*/ (level, type, size,
// shared_cpu_list) first: it describes the caches cpu0 sees. sysconf
// (_SC_LEVEL1_DCACHE_SIZE, ...) is the fallback; on the KVM guests we run on it
// reports the L3 of the whole host socket (320 MiB where cpu0's slice is 32 MiB).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fattn_bench {

struct CacheLevel {
  int level = 0;                // 1, 2, 3
  std::int64_t bytes = 0;       // size of one instance
  int shared_by_cpus = 1;       // CPUs sharing one instance
  std::string source;           // "sysfs" or "sysconf"
};

// Level 1 (data), 2 and 3 (unified), those the OS reports, in order of level.
std::vector<CacheLevel> detect_data_caches();

// "0-3,8" → 5. Empty or malformed text → 1.
int count_cpu_list(const std::string& list);

}  // namespace fattn_bench
