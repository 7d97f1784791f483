// fattn — the cache level the decode kernel's software prefetch fills on this core.
//
// The decode kernel asks for each key tile's rows a tile ahead (cpu/decode/ops.hpp,
// Prefetch). PREFETCHT0 fills L1; a tile asked for a tile ahead does not stay in L1 beside
// the tile being computed, so each of its lines crosses L2 → L1 twice (once for the hint,
// once for the load) and holds an L1 miss buffer on the way. Where the core keeps
// PREFETCHT1 in L2, the line waits there and crosses once. Measured (fattn-bench --decode,
// Hq 32, Hkv 8, D 128, 32k keys, 2 threads, the levels alternated in one run;
// docs/perf-log.md, 2026-12-07): on a Zen 4 core, which keeps PREFETCHT1 in L2 (this probe:
// a hinted line loads at L2's latency), PREFETCHT1 read 21-57 % more on the AVX2 table in
// every dtype and the same or up to 62 % more on AVX-512 (16-key pages most; within ±7 %
// where the kernel is compute-bound: q8_0, 16 query rows); on a Zen 3 core, where every
// hint fills L1 (AMD's guide), the levels read the same.
// Which the core does is a property of the core, not of its feature flags, so it is timed
// here once per process: a line of L2 asked for by each hint, then loaded.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "fattn/attention.hpp"

namespace fattn {
namespace {

#if defined(__x86_64__) || defined(_M_X64)
constexpr bool kHasProbe = true;
#else
constexpr bool kHasProbe = false;  // PREFETCHT0/T1 are x86's: elsewhere the default stands
#endif

// Lines chased (8 KiB: within every L1 and L2), and a buffer read between their loads into
// L2 and the probe to push them out of L1 (8× a 32 KiB L1, 5× a 48 KiB one; with the
// lines, half of the smallest L2 the CPU kernels meet, Zen 3's 512 KiB).
constexpr int kLines = 128;
constexpr std::size_t kEvictBytes = std::size_t{256} << 10;
// The hints' lines have this long to arrive before the chase (an L2 → L1 fill takes tens of
// nanoseconds; 128 of them, a few hundred at most).
constexpr double kSettleSeconds = 5e-6;
// Rounds of the three cases, alternated; the fastest of each counts (a preempted or
// migrated round is slow, never fast).
constexpr int kRounds = 15;

struct alignas(64) Line {  // one cache line
  const Line* next;
};

enum class Hint { none, t0, t1 };

struct Probe {
  std::vector<Line> lines;
  std::vector<unsigned char> evict;
  std::uint64_t sink = 0;

  Probe() : lines(kLines), evict(kEvictBytes, 1) {
    // One line per 64 bytes, linked in a random cycle so that no hardware prefetcher
    // guesses the next.
    std::vector<int> order(kLines);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin() + 1, order.end(), std::mt19937(12345));
    for (int i = 0; i < kLines; ++i) line(order[i]).next = &line(order[(i + 1) % kLines]);
  }
  Line& line(int i) { return lines[static_cast<std::size_t>(i)]; }

  // Nanoseconds a load of one line that lies in L2, after the hint asked for it.
  double load_ns(Hint hint) {
    using Clock = std::chrono::steady_clock;
    for (int i = 0; i < kLines; ++i) sink += reinterpret_cast<std::uintptr_t>(line(i).next);
    for (std::size_t b = 0; b < evict.size(); b += 64) sink += evict[b];
    for (int i = 0; i < kLines; ++i) {
      if (hint == Hint::t0) __builtin_prefetch(&line(i), 0, 3);
      if (hint == Hint::t1) __builtin_prefetch(&line(i), 0, 2);
    }
    const auto settle = Clock::now();
    while (std::chrono::duration<double>(Clock::now() - settle).count() < kSettleSeconds) {
    }
    const auto start = Clock::now();
    const Line* at = &line(0);
    for (int i = 0; i < kLines; ++i) at = at->next;
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
    sink += reinterpret_cast<std::uintptr_t>(at);
    return ns / kLines;
  }
};

std::string ns_text(double ns) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", ns);
  return text;
}

DecodePrefetchLevelChoice choose_decode_prefetch_level() {
  DecodePrefetchLevelChoice choice;
  if (!kHasProbe) {
    choice.reason = "no probe on this architecture: PREFETCHT0's level, the default";
    return choice;
  }
  Probe probe;
  PrefetchLatencies& t = choice.latencies;
  t = {1e30, 1e30, 1e30};
  for (int round = 0; round < kRounds; ++round) {
    t.unhinted_ns = std::min(t.unhinted_ns, probe.load_ns(Hint::none));
    t.t0_ns = std::min(t.t0_ns, probe.load_ns(Hint::t0));
    t.t1_ns = std::min(t.t1_ns, probe.load_ns(Hint::t1));
  }
  volatile std::uint64_t keep = probe.sink;  // the chases cannot be dropped
  (void)keep;
  choice.level = decode_prefetch_level_for(t);
  const std::string timed = "a line of L2 loads in " + ns_text(t.unhinted_ns) + " ns, " +
                            ns_text(t.t0_ns) + " after PREFETCHT0, " + ns_text(t.t1_ns) +
                            " after PREFETCHT1";
  if (!prefetch_probe_tells_levels(t))
    choice.reason = timed + ": the probe cannot tell L1 from L2 here; PREFETCHT0, the default";
  else if (choice.level == 2)
    choice.reason = "this core keeps PREFETCHT1 in L2 (" + timed + ")";
  else
    choice.reason = "PREFETCHT1 fills L1 on this core, as PREFETCHT0 does (" + timed + ")";
  return choice;
}

}  // namespace

bool prefetch_probe_tells_levels(const PrefetchLatencies& t) {
  return t.t0_ns < kPrefetchProbeL1Share * t.unhinted_ns;
}

int decode_prefetch_level_for(const PrefetchLatencies& t) {
  if (!prefetch_probe_tells_levels(t)) return 1;
  return t.t1_ns > 0.5 * (t.t0_ns + t.unhinted_ns) ? 2 : 1;
}

const DecodePrefetchLevelChoice& decode_prefetch_level_choice() {
  static const DecodePrefetchLevelChoice choice = choose_decode_prefetch_level();
  return choice;
}

}  // namespace fattn
