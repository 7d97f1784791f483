// fattn-bench — unit tests of the read bandwidth's buffer arithmetic (read_buffer.hpp).
// Every expected value is worked out by hand in the comment beside it.
#include <gtest/gtest.h>

#include "read_buffer.hpp"

namespace fattn_bench {
namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;
constexpr std::int64_t kGiB = std::int64_t{1} << 30;
// 2 threads × 8 vectors of 16 floats × 4 bytes = 1024 bytes: avx512 on two threads.
constexpr std::int64_t kGranule = 1024;

CacheLevel cache(int level, std::int64_t bytes, int shared_by_cpus) {
  CacheLevel c;
  c.level = level;
  c.bytes = bytes;
  c.shared_by_cpus = shared_by_cpus;
  return c;
}

TEST(LastLevelCache, NoneKnownIsZero) { EXPECT_EQ(last_level_cache_bytes({}, 4), 0); }

TEST(LastLevelCache, OneSharedInstance) {
  // the 2-core Zen 4 VM: L3 32 MiB shared by both CPUs → 32 MiB
  const std::vector<CacheLevel> caches{cache(1, 32 * 1024, 1), cache(2, kMiB, 1),
                                       cache(3, 32 * kMiB, 2)};
  EXPECT_EQ(last_level_cache_bytes(caches, 2), 32 * kMiB);
  EXPECT_EQ(last_level_cache_bytes(caches, 1), 32 * kMiB);
}

TEST(LastLevelCache, InstancesTheThreadsSpan) {
  // L3 of 32 MiB per 8 CPUs: 20 threads fill ceil(20 / 8) = 3 instances → 96 MiB
  const std::vector<CacheLevel> caches{cache(3, 32 * kMiB, 8)};
  EXPECT_EQ(last_level_cache_bytes(caches, 20), 96 * kMiB);
  // a sharing count of 0 (unreadable) counts as private: 2 threads → 2 × 32 MiB
  EXPECT_EQ(last_level_cache_bytes({cache(3, 32 * kMiB, 0)}, 2), 64 * kMiB);
}

TEST(ReadBufferBytes, AtLeastOneGibibyte) {
  // 8 × 32 MiB = 256 MiB < 1 GiB → 1 GiB (a multiple of the granule already)
  EXPECT_EQ(read_buffer_bytes(32 * kMiB, 0, kGranule), kGiB);
}

TEST(ReadBufferBytes, EightTimesALargeCache) {
  // 8 × 384 MiB (12 Zen 4 dies) = 3 GiB > 1 GiB
  EXPECT_EQ(read_buffer_bytes(384 * kMiB, 0, kGranule), 3 * kGiB);
}

TEST(ReadBufferBytes, BoundedByHalfTheAvailableMemory) {
  // 1 GiB wanted, 1 GiB available → half of it: 512 MiB
  EXPECT_EQ(read_buffer_bytes(32 * kMiB, kGiB, kGranule), 512 * kMiB);
  // 16 GiB available: no bound below 1 GiB
  EXPECT_EQ(read_buffer_bytes(32 * kMiB, 16 * kGiB, kGranule), kGiB);
}

TEST(ReadBufferBytes, WholeGranules) {
  // available 1000000 → 500000 = 488 × 1024 + 288 → 488 × 1024 = 499712
  EXPECT_EQ(read_buffer_bytes(0, 1000000, kGranule), 499712);
  // a granule of 3 × 512 = 1536 (3 threads): 2^30 = 699050 × 1536 + 1024 → 1073740800
  EXPECT_EQ(read_buffer_bytes(0, 0, 1536), 1073740800);
  // less than one granule available → one granule
  EXPECT_EQ(read_buffer_bytes(0, 100, kGranule), kGranule);
}

TEST(ThreadSlice, ContiguousEqualParts) {
  // 1024 floats on 4 threads: 256 each, thread 2 starts at 512
  const Slice s = thread_slice(1024, 4, 2);
  EXPECT_EQ(s.begin, 512);
  EXPECT_EQ(s.count, 256);
  // one thread reads everything
  const Slice all = thread_slice(1024, 1, 0);
  EXPECT_EQ(all.begin, 0);
  EXPECT_EQ(all.count, 1024);
}

TEST(GigabytesPerSecond, Decimal) {
  // 1 GiB in 0.05 s: 1073741824 / 0.05 / 1e9 = 21.47483648
  EXPECT_DOUBLE_EQ(gigabytes_per_second(static_cast<double>(kGiB), 0.05), 21.47483648);
}

}  // namespace
}  // namespace fattn_bench
