// fattn-bench — the read bandwidth's buffer: how large, and which part each thread reads.
//
// Pure arithmetic (read_bandwidth.cpp measures with it; test_read_buffer.cpp tests it).
// The buffer is the larger of kMinReadBufferBytes and kLastLevelCacheMultiple × the last
// level cache the threads reach, so that no repetition finds more than an eighth of it
// still cached; bounded by a share of the memory the OS can give (MemAvailable).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cache_info.hpp"

namespace fattn_bench {

// 1 GiB: the size at which a plain read loop on the 2-core Zen 4 VM settled (29-34 GB/s on
// one thread, 36-65 on two); 24-32× its 32 MiB L3.
inline constexpr std::int64_t kMinReadBufferBytes = std::int64_t{1} << 30;
// A repetition then finds at most 1/8 of the buffer in the LLC: within the run-to-run
// spread of DRAM bandwidth on a VM.
inline constexpr std::int64_t kLastLevelCacheMultiple = 8;
// At most half of MemAvailable: the rest stays for whatever else runs beside the bench.
inline constexpr std::int64_t kAvailableMemoryShare = 2;

// The last level cache that `threads` threads reach, all instances together, assuming
// they fill one instance before the next: 0 when no cache is known.
inline std::int64_t last_level_cache_bytes(const std::vector<CacheLevel>& caches, int threads) {
  if (caches.empty()) return 0;
  const CacheLevel& last = caches.back();
  const int sharing = std::max(last.shared_by_cpus, 1);
  const std::int64_t instances = std::max(1, (threads + sharing - 1) / sharing);
  return instances * last.bytes;
}

// Bytes to read: max(kMinReadBufferBytes, kLastLevelCacheMultiple × llc_bytes), at most
// available_bytes / kAvailableMemoryShare (available_bytes 0: unknown, no bound), rounded
// down to a whole number of granules (at least one): a granule is what every thread reads
// in one step of the loop, so each thread's slice is a whole number of steps.
inline std::int64_t read_buffer_bytes(std::int64_t llc_bytes, std::int64_t available_bytes,
                                      std::int64_t granule_bytes) {
  std::int64_t bytes = std::max(kMinReadBufferBytes, kLastLevelCacheMultiple * llc_bytes);
  if (available_bytes > 0) bytes = std::min(bytes, available_bytes / kAvailableMemoryShare);
  return std::max(granule_bytes, bytes - bytes % granule_bytes);
}

// One thread's contiguous part of a buffer of `count` elements split evenly among
// `threads` (count a multiple of threads, as read_buffer_bytes makes it).
struct Slice {
  std::int64_t begin = 0;
  std::int64_t count = 0;
};
inline Slice thread_slice(std::int64_t count, int threads, int thread) {
  const std::int64_t per_thread = count / threads;
  return {per_thread * thread, per_thread};
}

// Decimal GB/s, as STREAM and the triad count them.
inline double gigabytes_per_second(double bytes, double seconds) {
  constexpr double kGiga = 1e9;
  return bytes / seconds / kGiga;
}

}  // namespace fattn_bench
