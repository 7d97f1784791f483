// fattn-bench — triad bandwidth at each cache level, working sets sized from the caches.
//
// Each thread runs a[i] = b[i] + s·c[i] (float, the ISA's vectors: stream_loops.hpp)
// over its own three arrays, allocated and first touched by itself, again and again;
// counted bytes: 12 per element (read b, read c, write a), as the DRAM triad.
// Working set of a level = half of the cache, so that the three arrays, the stack and
// the code fit with room to spare:
//   private cache (L1, L2)   per thread: half of one instance
//   shared cache (L3)        all threads together: half of each instance they share
// A shared level's per-thread share must exceed the level below's, or the figure is
// the level below's (flagged in the JSON: "distinct": false).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cache_info.hpp"
#include "fattn/attention.hpp"

namespace fattn_bench {

struct LevelBandwidth {
  std::string level;                    // "L1", "L2", "L3" ("DRAM" is added by ceilings)
  std::int64_t cache_bytes = 0;         // one instance
  int shared_by_cpus = 1;
  std::int64_t working_set_bytes = 0;   // all threads' arrays together
  double bandwidth_gbs = 0;             // best of several runs, all threads
  bool distinct = true;                 // the working set overflows the level below
};

// Working-set bytes per thread for a cache level (see the top of this file).
std::int64_t working_set_per_thread(const CacheLevel& cache, int threads);

// isa concrete and supported; one entry per cache level detected.
std::vector<LevelBandwidth> measure_cache_bandwidth(fattn::Isa isa, int threads,
                                                    const std::vector<CacheLevel>& caches);

}  // namespace fattn_bench
