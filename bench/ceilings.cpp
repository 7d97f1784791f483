// fattn-bench — FMA peak, STREAM-triad and read bandwidth (see ceilings.hpp).
#include "ceilings.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>

#include "amx_loops.hpp"
#include "dot_loops.hpp"
#include "fma_loops.hpp"
#include "read_bandwidth.hpp"

namespace fattn_bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kRepetitions = 7;           // best of
// Long enough to ride out a vCPU being descheduled for a few ms: with 30 ms runs a
// 2-thread peak of 117 GFLOP/s was once reported where 213-227 is usual (perf-log).
constexpr double kMinLoopSeconds = 0.15;
// acc ← acc·m + a converges to a / (1 − m) = 1: no overflow, no subnormals.
constexpr float kMultiplier = 0.999999f;
constexpr float kAddend = 1.0e-6f;

// Three arrays of 256 MiB: 768 MiB in all, 24× the 32 MiB L3.
constexpr std::int64_t kTriadArrayBytes = std::int64_t{256} << 20;
constexpr double kTriadScalar = 3.0;
constexpr double kMebibyte = 1 << 20;
constexpr double kGiga = 1e9;  // FLOP/s → GFLOP/s, B/s → GB/s (decimal, as STREAM)
// FMA loop iterations of the first try, doubled until a run is long enough.
constexpr std::int64_t kFirstIterations = 1 << 16;
constexpr int kTriadArrays = 3;
constexpr int kTriadCountedBytes = kTriadArrays * sizeof(double);  // read b, read c, write a
constexpr int kTriadWithAllocateBytes = 4 * sizeof(double);  // + write-allocate read of a

volatile float g_checksum_sink;  // keeps the FMA loops' results alive

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

const FmaLoops& loops_for(fattn::Isa isa) {
  switch (isa) {
#if defined(__x86_64__)
    case fattn::Isa::amx:  // AVX-512 plus AMX tiles: its vector units are avx512's
    case fattn::Isa::avx512: return avx512_fma_loops;
    case fattn::Isa::avx2: return avx2_fma_loops;
#endif
    default: return portable_fma_loops;
  }
}

// Seconds for `threads` threads to run `loop` for `iterations` each.
double time_on_all_threads(float (*loop)(std::int64_t, float, float), std::int64_t iterations,
                           int threads) {
  const auto start = Clock::now();
  float checksum = 0;
#pragma omp parallel num_threads(threads) reduction(+ : checksum)
  checksum += loop(iterations, kMultiplier, kAddend);
  const double seconds = seconds_since(start);
  g_checksum_sink = checksum;
  return seconds;
}

// Best GFLOP/s over kRepetitions, after doubling the iterations until one run takes
// at least kMinLoopSeconds.
double peak_gflops(float (*loop)(std::int64_t, float, float), std::int64_t flops_per_iteration,
                   int threads) {
  std::int64_t iterations = kFirstIterations;
  while (time_on_all_threads(loop, iterations, threads) < kMinLoopSeconds) iterations *= 2;
  double best = 0;
  for (int rep = 0; rep < kRepetitions; ++rep) {
    const double seconds = time_on_all_threads(loop, iterations, threads);
    const double flops =
        static_cast<double>(flops_per_iteration) * static_cast<double>(iterations) * threads;
    best = std::max(best, flops / seconds / kGiga);
  }
  return best;
}

// Best triad time in seconds.
double best_triad_seconds(std::int64_t n, int threads) {
  // new double[n] leaves the pages untouched: the first touch below places them.
  std::unique_ptr<double[]> a(new double[n]), b(new double[n]), c(new double[n]);
  double* pa = a.get();
  double* pb = b.get();
  double* pc = c.get();
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    pa[i] = 0.0;
    pb[i] = 1.0;
    pc[i] = 2.0;
  }
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < kRepetitions; ++rep) {
    const auto start = Clock::now();
#pragma omp parallel for simd num_threads(threads) schedule(static)
    for (std::int64_t i = 0; i < n; ++i) pa[i] = pb[i] + kTriadScalar * pc[i];
    best = std::min(best, seconds_since(start));
  }
  g_checksum_sink = static_cast<float>(pa[n / 2]);
  return best;
}

// The vector peak of every ISA this CPU supports, widest first; the ISA in use is
// measured once.
std::vector<Ceilings::IsaPeak> all_isa_peaks(const Ceilings& in_use, int threads) {
  std::vector<Ceilings::IsaPeak> peaks;
  for (fattn::Isa isa : {fattn::Isa::avx512, fattn::Isa::avx2, fattn::Isa::portable}) {
    if (!fattn::cpu_supports(isa)) continue;
    const FmaLoops& loops = loops_for(isa);
    const double gflops =
        loops.isa == in_use.isa
            ? in_use.fma_peak_gflops
            : peak_gflops(loops.vector_loop, loops.vector_flops_per_iteration, threads);
    peaks.push_back({loops.isa, gflops});
  }
  peaks.push_back({"scalar", in_use.scalar_fma_peak_gflops});
  return peaks;
}

}  // namespace

Ceilings measure_ceilings(fattn::Isa isa, int threads, bool roofline) {
  const FmaLoops& loops = loops_for(isa);
  Ceilings c;
  c.isa = loops.isa;
  c.threads = threads;
  c.fma_peak_gflops = peak_gflops(loops.vector_loop, loops.vector_flops_per_iteration, threads);
  c.scalar_fma_peak_gflops =
      peak_gflops(loops.scalar_loop, loops.scalar_flops_per_iteration, threads);

  const std::int64_t n = kTriadArrayBytes / static_cast<std::int64_t>(sizeof(double));
  const double seconds = best_triad_seconds(n, threads);
  c.bandwidth_gbs = static_cast<double>(n) * kTriadCountedBytes / seconds / kGiga;
  c.bandwidth_with_write_allocate_gbs =
      static_cast<double>(n) * kTriadWithAllocateBytes / seconds / kGiga;
  c.triad_array_mib = static_cast<double>(kTriadArrayBytes) / kMebibyte;
  const std::vector<CacheLevel> caches = detect_data_caches();
  const ReadBandwidth read = measure_read_bandwidth(isa, threads, caches);
  c.read_bandwidth_gbs = read.all_threads_gbs;
  c.read_bandwidth_one_thread_gbs = read.one_thread_gbs;
  c.read_bandwidth_buffer_mib = static_cast<double>(read.buffer_bytes) / kMebibyte;
  c.read_bandwidth_isa = read.isa;
  // cpu_supports(amx) also asks Linux for the tile state the loop needs.
  if (amx_tile_loop.loop && fattn::cpu_supports(fattn::Isa::amx) &&
      (roofline || isa == fattn::Isa::amx))
    c.amx_bf16_peak_gflops =
        peak_gflops(amx_tile_loop.loop, amx_tile_loop.bf16_flops_per_iteration, threads);
  if (bf16_dot_loop.loop && fattn::cpu_has_bf16_dot_products())
    c.bf16_dot_peak_gflops =
        peak_gflops(bf16_dot_loop.loop, bf16_dot_loop.bf16_flops_per_iteration, threads);
  if (roofline) {
    c.fma_peaks = all_isa_peaks(c, threads);
    c.bandwidth_levels = measure_cache_bandwidth(isa, threads, caches);
  }
  LevelBandwidth dram;
  dram.level = "DRAM";
  dram.working_set_bytes = static_cast<std::int64_t>(kTriadArrays) * kTriadArrayBytes;
  dram.bandwidth_gbs = c.bandwidth_gbs;
  c.bandwidth_levels.push_back(dram);
  return c;
}

std::string cpu_model_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  const std::string key = "model name";
  while (std::getline(cpuinfo, line)) {
    if (line.compare(0, key.size(), key) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto first = line.find_first_not_of(" \t", colon + 1);
    return first == std::string::npos ? "unknown" : line.substr(first);
  }
  return "unknown";
}

Roof roof_for(const fattn::ForwardPlan& plan, const Ceilings& ceilings) {
  const char* name = fattn::to_string(plan.products);
  if (plan.products == fattn::Products::bf16_dot && ceilings.bf16_dot_peak_gflops > 0)
    return {name, ceilings.bf16_dot_peak_gflops};
  if (plan.products == fattn::Products::amx && ceilings.amx_fp32_roof_gflops() > 0)
    return {name, ceilings.amx_fp32_roof_gflops()};
  return {fattn::to_string(fattn::Products::fma), ceilings.fma_peak_gflops};
}

const char* roof_mark(const std::string& roof) {
  if (roof == fattn::to_string(fattn::Products::bf16_dot)) return " dot";
  if (roof == fattn::to_string(fattn::Products::amx)) return " amx";
  return "";
}

}  // namespace fattn_bench
