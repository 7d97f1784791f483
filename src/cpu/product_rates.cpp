// fattn — the multiply-add rates of one core, and the bfloat16 products chosen by them.
//
// bfloat16 inputs on avx512 have two ways to multiply: vdpbf16ps on pairs of the inputs'
// own bits, or widened to float32 and fed to the FMAs. Which is faster depends on the
// core, not on the feature flag: on Zen 4/5 vdpbf16ps does twice the FMAs' multiply-adds
// per second, on an Emerald Rapids core half (docs/16bit.md). So the choice is made by
// timing both here, once per process.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fattn/attention.hpp"

#include "cpu/common/peak_loops.hpp"

namespace fattn {
namespace {

using cpu::peak::kDotFlopsPerRound;
using cpu::peak::kFmaFlopsPerRound;
// One timed run lasts about this long; the best of kRuns counts (a preempted run is slow,
// never fast). A first untimed run lets the core reach its AVX-512 clock.
constexpr double kRunSeconds = 1e-3;
constexpr int kRuns = 3;

// GFLOP/s of loop(rounds): rounds grown until a run lasts kRunSeconds, then the best of
// kRuns runs of that length.
double peak_gflops(float (*loop)(std::int64_t), std::int64_t flops_per_round) {
  using Clock = std::chrono::steady_clock;
  volatile float sink = 0.0f;  // the checksums, so the loops cannot be dropped
  const auto seconds = [&](std::int64_t rounds) {
    const auto start = Clock::now();
    sink = sink + loop(rounds);
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  std::int64_t rounds = 1024;
  while (seconds(rounds) < kRunSeconds && rounds < (std::int64_t{1} << 40)) rounds *= 2;
  double best = 0.0;
  for (int run = 0; run < kRuns; ++run)
    best = std::max(best, static_cast<double>(rounds * flops_per_round) / seconds(rounds));
  return best * 1e-9;
}

Bf16ProductsChoice choose_bf16_products() {
  Bf16ProductsChoice choice;
  const char* forced = std::getenv(kCpuBf16Variable);
  if (forced != nullptr && *forced != '\0') {
    const std::string name(forced);
    if (name != to_string(Bf16Products::bf16_dot) && name != to_string(Bf16Products::fma))
      throw Error(std::string("fattn: ") + kCpuBf16Variable +
                  " must be bf16_dot or fma (or unset: the faster on this CPU); got '" + name + "'");
    choice.products = parse_bf16_products(name);
    if (choice.products == Bf16Products::bf16_dot && !cpu_has_bf16_dot_products())
      throw Error(std::string("fattn: ") + kCpuBf16Variable +
                  "=bf16_dot, but this CPU or build has no AVX512-BF16 on avx512" +
                  cpu_unsupported_reason());
    choice.reason = std::string(kCpuBf16Variable) + "=" + name;
    return choice;
  }
  if (!cpu_supports(Isa::avx512)) {
    choice.reason = std::string("no avx512 here") + cpu_unsupported_reason() +
                    ": bfloat16 widened to float32 FMAs";
    return choice;
  }
  if (!cpu_has_bf16_dot_products()) {
    choice.reason = "no AVX512-BF16 in this CPU or build: bfloat16 widened to float32 FMAs";
    return choice;
  }
  const ProductRates rates = measure_product_rates();
  choice.fma_gflops = rates.fma_gflops;
  choice.bf16_dot_gflops = rates.bf16_dot_gflops;
  const bool dot = rates.bf16_dot_gflops >= rates.fma_gflops;
  choice.products = dot ? Bf16Products::bf16_dot : Bf16Products::fma;
  const auto gflops = [](double g) { return std::to_string(static_cast<long long>(g + 0.5)); };
  choice.reason = std::string("timed on one core: vdpbf16ps ") + gflops(rates.bf16_dot_gflops) +
                  (dot ? " >= " : " < ") + "float32 FMA " + gflops(rates.fma_gflops) + " GFLOP/s";
  return choice;
}

}  // namespace

ProductRates measure_product_rates() {
  ProductRates rates;
#if defined(FATTN_PEAK_LOOPS)
  if (cpu_supports(Isa::avx512)) {
    peak_gflops(cpu::peak::fma512_rounds, kFmaFlopsPerRound);  // the AVX-512 clock, untimed
    rates.fma_gflops = peak_gflops(cpu::peak::fma512_rounds, kFmaFlopsPerRound);
  }
#endif
#if defined(FATTN_PEAK_BF16_DOT)
  if (cpu_has_bf16_dot_products())
    rates.bf16_dot_gflops = peak_gflops(cpu::peak::bf16_dot_rounds, kDotFlopsPerRound);
#endif
  return rates;
}

const Bf16ProductsChoice& bf16_products_choice() {
  // A throwing initialiser leaves the static uninitialised: every call that asks throws.
  static const Bf16ProductsChoice choice = choose_bf16_products();
  return choice;
}

}  // namespace fattn
