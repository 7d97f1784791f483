// fattn-bench — DRAM read bandwidth: a read-only stream, the roof of the decode kernels.
//
// Decode (a few query rows against a long KV cache) reads its cache once and writes
// almost nothing, so its roof is how fast DRAM streams reads, not the triad's mix of two
// reads and a write. Each thread sums its own contiguous slice of one buffer, far larger
// than the last level cache (read_buffer.hpp), with the vectors of the kernels' ISA
// (read_loops.hpp), after touching its slice first (so its pages are placed where it
// runs). Counted bytes: 4 per float read. Best of several repetitions, on one thread and
// on all of them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cache_info.hpp"
#include "fattn/attention.hpp"

namespace fattn_bench {

struct ReadBandwidth {
  std::string isa;                 // the loads' vectors
  std::int64_t buffer_bytes = 0;   // read by all threads together, and by one thread alone
  double one_thread_gbs = 0;
  double all_threads_gbs = 0;
};

// isa concrete and supported (amx reads with avx512's vectors, as its kernels do).
ReadBandwidth measure_read_bandwidth(fattn::Isa isa, int threads,
                                     const std::vector<CacheLevel>& caches);

// A memory region a kernel reads (a KV cache's K or V).
struct Region {
  const void* data;
  std::int64_t bytes;
};
// One read-only pass over `regions` on `threads` threads (each its slice of each region),
// with the loads of `isa`: the read stream over the very memory a kernel reads, timed
// beside it (decode_sweep.cpp). Each region is read from its first 64-byte boundary, in
// whole steps of the loop; the bytes read are returned.
std::int64_t read_regions_once(fattn::Isa isa, int threads, const std::vector<Region>& regions);

// MemAvailable from /proc/meminfo in bytes; 0 if unknown.
std::int64_t available_memory_bytes();

}  // namespace fattn_bench
