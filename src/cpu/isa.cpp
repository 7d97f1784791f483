// fattn — which CPU kernels this machine can run.
#include "cpu/kernels.hpp"

#include <cstdlib>
#include <string>

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace fattn {
namespace {

// Linux hands the AMX tile state (8 KiB of registers) only to processes that ask for
// it (arch_prctl ARCH_REQ_XCOMP_PERM, kernel 5.16+); the request is process-wide and
// made once. A kernel or hypervisor that refuses it leaves AMX unsupported.
bool amx_granted() {
#if defined(__linux__) && defined(__x86_64__) && defined(FATTN_HAVE_AMX)
  static const bool granted = [] {
    constexpr long kRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
    constexpr long kTileData = 18;               // XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return granted;
#else
  return false;
#endif
}

int isa_rank(Isa isa) {
  switch (isa) {
    case Isa::portable: return 0;
    case Isa::avx2: return 1;
    case Isa::avx512: return 2;
    case Isa::amx: return 3;
    case Isa::automatic: break;
  }
  return 4;
}

// The widest ISA this process may use: FATTN_CPU_ISA (amx, avx512, avx2, portable) caps
// what cpu_supports reports, so a machine runs as one without the wider units would
// (an AVX-512 machine's test run as an AVX2-only CPU's, say). Unset or empty: no cap.
// Read once; a name it does not know is an error at every call that asks.
Isa isa_cap() {
  static const Isa cap = [] {
    const char* value = std::getenv(kCpuIsaCapVariable);
    if (value == nullptr || *value == '\0') return Isa::amx;
    const std::string name(value);
    for (Isa isa : {Isa::amx, Isa::avx512, Isa::avx2, Isa::portable})
      if (name == to_string(isa)) return isa;
    throw Error(std::string("fattn: ") + kCpuIsaCapVariable +
                " must be one of amx, avx512, avx2, portable (or unset); got '" + name + "'");
  }();
  return cap;
}

bool hardware_supports(Isa isa) {
  switch (isa) {
    case Isa::automatic:
    case Isa::portable:
      return true;
#if defined(__x86_64__) || defined(__i386__)
    case Isa::amx:
#if defined(FATTN_AMX_EMULATION) && defined(FATTN_HAVE_AMX)
      // The tile instructions emulated (cpu/amx/emulation.hpp): the unit's others remain.
      return cpu_supports(Isa::avx512) && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512bf16");
#else
      return cpu_supports(Isa::avx512) && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("amx-tile") &&
             __builtin_cpu_supports("amx-bf16") && amx_granted();
#endif
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");  // 16-bit conversions (cpu/common/elements.hpp)
#else
    case Isa::amx:
    case Isa::avx512:
    case Isa::avx2:
      return false;
#endif
  }
  return false;
}

}  // namespace

bool cpu_supports(Isa isa) {
  return isa == Isa::automatic || (isa_rank(isa) <= isa_rank(isa_cap()) && hardware_supports(isa));
}

std::string cpu_unsupported_reason() {
  std::string reason = std::string(" (best: ") + to_string(best_cpu_isa());
  if (isa_cap() != Isa::amx)
    reason += std::string("; ") + kCpuIsaCapVariable + "=" + to_string(isa_cap()) + " caps it";
  return reason + ")";
}

// Fastest first: amx runs the attention products ~2× faster than avx512 at D = 64-128
// on the 2-core Sapphire Rapids VM (docs/perf-log.md, "AMX kernels").
Isa best_cpu_isa() {
  for (Isa isa : {Isa::amx, Isa::avx512, Isa::avx2}) {
#if defined(FATTN_AMX_EMULATION)
    if (isa == Isa::amx) continue;  // emulated: for the tests that ask for it, not fast
#endif
    if (cpu_supports(isa)) return isa;
  }
  return Isa::portable;
}

// Below this many keys the avx512 kernels beat the AMX ones: a query tile's fixed costs
// on AMX (splitting Q, the tile unit's pipeline filling at each key tile) are not repaid.
// Fused amx/avx512 time, two threads, B=2 H=8, medians of 2 rounds (docs/perf-log.md,
// "AMX kernels", small S): D=64 1.21 at 128 keys, 1.02 at 384, 0.93 at 512; D=128 1.32,
// 1.12, 1.02, and 0.96 at 768.
constexpr std::int64_t kAmxMinKeys = 512;

Isa automatic_cpu_isa(std::int64_t kv_len) {
  const Isa best = best_cpu_isa();
  return best == Isa::amx && kv_len < kAmxMinKeys ? Isa::avx512 : best;
}

int cpu_query_tile(Isa isa) { return cpu::kernels_for(isa).query_tile; }

bool cpu_has_bf16_dot_products() {
#if (defined(__x86_64__) || defined(__i386__)) && defined(FATTN_HAVE_AVX512_BF16)
  return cpu_supports(Isa::avx512) && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

namespace cpu {

bool runs_bf16_dot(Bf16Products products) {
  if (products == Bf16Products::automatic) products = bf16_products_choice().products;
  return products == Bf16Products::bf16_dot && cpu_has_bf16_dot_products();
}

const Kernels& kernels_for(Isa isa, DType dtype, Bf16Products bf16_products) {
  if (isa == Isa::automatic) isa = best_cpu_isa();
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
#if defined(FATTN_HAVE_AMX)
    case Isa::amx: return amx_kernels;
#endif
#if defined(FATTN_HAVE_AVX512_BF16)
    case Isa::avx512:
      return dtype == DType::bfloat16 && runs_bf16_dot(bf16_products) ? avx512_bf16_kernels
                                                                       : avx512_kernels;
#else
    case Isa::avx512: return avx512_kernels;
#endif
    case Isa::avx2: return avx2_kernels;
#endif
    default: return portable_kernels;
  }
}

}  // namespace cpu
}  // namespace fattn
