// fattn-bench — DRAM read bandwidth (see read_bandwidth.hpp).
#include "read_bandwidth.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <new>
#include <sstream>

#include "read_buffer.hpp"
#include "read_loops.hpp"

namespace fattn_bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kRepetitions = 5;          // best of
// Passes are doubled until a run is this long, as the cache levels' runs
// (cache_bandwidth.cpp): 1 GiB at 30 GB/s is one pass of 36 ms.
constexpr double kMinRunSeconds = 0.05;
constexpr std::size_t kAlignment = 64;   // a cache line: every vector load aligned
constexpr float kFillValue = 1.0f;
constexpr std::int64_t kKibibyte = 1024;

volatile float g_read_sink;  // keeps the sums, and so the loads, alive

const ReadLoops& loops_for(fattn::Isa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case fattn::Isa::amx:  // AVX-512 plus AMX tiles: its loads are avx512's
    case fattn::Isa::avx512: return avx512_read_loops;
    case fattn::Isa::avx2: return avx2_read_loops;
#endif
    default: return portable_read_loops;
  }
}

struct FreeAligned {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeAligned>;

// Seconds for each of `threads` threads to read its slice of `count` floats `passes` times.
double run_passes(const ReadLoops& loops, const float* buffer, std::int64_t count, int threads,
                  std::int64_t passes) {
  float checksum = 0.0f;
  const auto start = Clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : checksum)
  {
    const Slice mine = thread_slice(count, threads, omp_get_thread_num());
    for (std::int64_t pass = 0; pass < passes; ++pass)
      checksum += loops.read(buffer + mine.begin, mine.count);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  g_read_sink = checksum;
  return seconds;
}

// Best GB/s of `threads` threads reading `bytes` (a multiple of threads × the loop's step).
double measure_gbs(const ReadLoops& loops, std::int64_t bytes, int threads) {
  Buffer buffer(static_cast<float*>(std::aligned_alloc(kAlignment, static_cast<std::size_t>(bytes))));
  if (!buffer) throw std::bad_alloc();
  float* p = buffer.get();
  const std::int64_t count = bytes / static_cast<std::int64_t>(sizeof(float));
#pragma omp parallel num_threads(threads)
  {
    // First touch by the thread that will read the slice: its pages are placed near it.
    const Slice mine = thread_slice(count, threads, omp_get_thread_num());
    std::fill(p + mine.begin, p + mine.begin + mine.count, kFillValue);
  }
  std::int64_t passes = 1;
  while (run_passes(loops, p, count, threads, passes) < kMinRunSeconds) passes *= 2;
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < kRepetitions; ++rep)
    best = std::min(best, run_passes(loops, p, count, threads, passes));
  return gigabytes_per_second(static_cast<double>(bytes) * static_cast<double>(passes), best);
}

}  // namespace

std::int64_t read_regions_once(fattn::Isa isa, int threads, const std::vector<Region>& regions) {
  const ReadLoops& loops = loops_for(isa);
  const std::int64_t step_bytes = std::int64_t{threads} * loops.floats_per_step *
                                  static_cast<std::int64_t>(sizeof(float));
  std::int64_t bytes_read = 0;
  float checksum = 0.0f;
  for (const Region& region : regions) {
    const auto address = reinterpret_cast<std::uintptr_t>(region.data);
    const std::int64_t skip = static_cast<std::int64_t>((kAlignment - address % kAlignment) % kAlignment);
    const std::int64_t bytes = std::max<std::int64_t>(0, region.bytes - skip) / step_bytes * step_bytes;
    const float* first = reinterpret_cast<const float*>(static_cast<const char*>(region.data) + skip);
    const std::int64_t count = bytes / static_cast<std::int64_t>(sizeof(float));
#pragma omp parallel num_threads(threads) reduction(+ : checksum)
    {
      const Slice mine = thread_slice(count, threads, omp_get_thread_num());
      checksum += loops.read(first + mine.begin, mine.count);
    }
    bytes_read += bytes;
  }
  g_read_sink = checksum;
  return bytes_read;
}

std::int64_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  const std::string key = "MemAvailable:";
  while (std::getline(meminfo, line)) {
    if (line.compare(0, key.size(), key) != 0) continue;
    std::istringstream in(line.substr(key.size()));
    std::int64_t kib = 0;
    return in >> kib ? kib * kKibibyte : 0;  // the kernel writes it in kB (KiB)
  }
  return 0;
}

ReadBandwidth measure_read_bandwidth(fattn::Isa isa, int threads,
                                     const std::vector<CacheLevel>& caches) {
  const ReadLoops& loops = loops_for(isa);
  const std::int64_t granule =
      std::int64_t{threads} * loops.floats_per_step * static_cast<std::int64_t>(sizeof(float));
  ReadBandwidth r;
  r.isa = loops.isa;
  r.buffer_bytes = read_buffer_bytes(last_level_cache_bytes(caches, threads),
                                     available_memory_bytes(), granule);
  // One buffer at a time: each run allocates, touches and frees its own.
  r.one_thread_gbs = measure_gbs(loops, r.buffer_bytes, 1);
  r.all_threads_gbs = threads == 1 ? r.one_thread_gbs : measure_gbs(loops, r.buffer_bytes, threads);
  return r;
}

}  // namespace fattn_bench
