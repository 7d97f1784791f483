// fattn-bench — triad bandwidth per cache level (see cache_bandwidth.hpp).
#include "cache_bandwidth.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>

#include "stream_loops.hpp"

namespace fattn_bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kRepetitions = 5;             // best of
constexpr double kMinRunSeconds = 0.05;     // passes are doubled until a run is this long
constexpr std::int64_t kArrays = 3;         // a, b, c
constexpr std::int64_t kCountedBytesPerElement = kArrays * sizeof(float);
constexpr std::size_t kAlignment = 64;
constexpr double kGiga = 1e9;

const StreamLoops& loops_for(fattn::Isa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case fattn::Isa::amx:  // AVX-512 plus AMX tiles: its vector units are avx512's
    case fattn::Isa::avx512: return avx512_stream_loops;
    case fattn::Isa::avx2: return avx2_stream_loops;
#endif
    default: return portable_stream_loops;
  }
}

struct FreeAligned {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeAligned>;

// One thread's arrays: a, b, c of n floats each, in one allocation.
struct ThreadArrays {
  Buffer memory;
  std::int64_t n = 0;
  float* a() const { return memory.get(); }
  const float* b() const { return memory.get() + n; }
  const float* c() const { return memory.get() + 2 * n; }
};

// Seconds for every thread to run `passes` triads over its own arrays.
double run_passes(const StreamLoops& loops, std::vector<ThreadArrays>& arrays,
                  std::int64_t passes) {
  const int threads = static_cast<int>(arrays.size());
  const auto start = Clock::now();
#pragma omp parallel num_threads(threads)
  {
    const ThreadArrays& mine = arrays[static_cast<std::size_t>(omp_get_thread_num())];
    for (std::int64_t pass = 0; pass < passes; ++pass)
      loops.triad(mine.a(), mine.b(), mine.c(), mine.n, static_cast<float>(pass & 7));
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double measure_gbs(const StreamLoops& loops, int threads, std::int64_t n) {
  std::vector<ThreadArrays> arrays(static_cast<std::size_t>(threads));
#pragma omp parallel num_threads(threads)
  {
    ThreadArrays& mine = arrays[static_cast<std::size_t>(omp_get_thread_num())];
    // aligned_alloc wants a multiple of the alignment.
    const std::size_t bytes =
        (static_cast<std::size_t>(kArrays * n) * sizeof(float) + kAlignment - 1) / kAlignment *
        kAlignment;
    mine.memory.reset(static_cast<float*>(std::aligned_alloc(kAlignment, bytes)));
    mine.n = n;
    if (mine.memory)
      for (std::int64_t i = 0; i < kArrays * n; ++i) mine.memory[i] = 1.0f;  // first touch
  }
  for (const ThreadArrays& t : arrays)
    if (!t.memory) throw std::bad_alloc();
  std::int64_t passes = 1;
  while (run_passes(loops, arrays, passes) < kMinRunSeconds) passes *= 2;
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < kRepetitions; ++rep)
    best = std::min(best, run_passes(loops, arrays, passes));
  const double bytes = static_cast<double>(kCountedBytesPerElement) * static_cast<double>(n) *
                       static_cast<double>(passes) * threads;
  return bytes / best / kGiga;
}

}  // namespace

std::int64_t working_set_per_thread(const CacheLevel& cache, int threads) {
  if (cache.shared_by_cpus <= 1) return cache.bytes / 2;
  const std::int64_t instances = (threads + cache.shared_by_cpus - 1) / cache.shared_by_cpus;
  return instances * cache.bytes / 2 / threads;
}

std::vector<LevelBandwidth> measure_cache_bandwidth(fattn::Isa isa, int threads,
                                                    const std::vector<CacheLevel>& caches) {
  const StreamLoops& loops = loops_for(isa);
  std::vector<LevelBandwidth> levels;
  std::int64_t below_per_thread = 0;  // the previous level's cache, per thread
  for (const CacheLevel& cache : caches) {
    const std::int64_t per_thread = working_set_per_thread(cache, threads);
    std::int64_t n = per_thread / kCountedBytesPerElement;
    n -= n % loops.floats_per_step;
    if (n <= 0) continue;
    LevelBandwidth l;
    l.level = "L" + std::to_string(cache.level);
    l.cache_bytes = cache.bytes;
    l.shared_by_cpus = cache.shared_by_cpus;
    l.working_set_bytes = kCountedBytesPerElement * n * threads;
    l.distinct = per_thread > below_per_thread;
    l.bandwidth_gbs = measure_gbs(loops, threads, n);
    levels.push_back(l);
    below_per_thread = cache.shared_by_cpus <= 1 ? cache.bytes : cache.bytes / threads;
  }
  return levels;
}

}  // namespace fattn_bench
