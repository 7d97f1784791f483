// fattn — which CPU kernels this machine can run.
#include "cpu/kernels.hpp"

namespace fattn {

bool cpu_supports(Isa isa) {
  switch (isa) {
    case Isa::automatic:
    case Isa::portable:
      return true;
#if defined(__x86_64__) || defined(__i386__)
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    case Isa::avx512:
    case Isa::avx2:
      return false;
#endif
  }
  return false;
}

Isa best_cpu_isa() {
  for (Isa isa : {Isa::avx512, Isa::avx2})
    if (cpu_supports(isa)) return isa;
  return Isa::portable;
}

int cpu_query_tile(Isa isa) { return cpu::kernels_for(isa).query_tile; }

namespace cpu {

const Kernels& kernels_for(Isa isa) {
  if (isa == Isa::automatic) isa = best_cpu_isa();
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case Isa::avx512: return avx512_kernels;
    case Isa::avx2: return avx2_kernels;
#endif
    default: return portable_kernels;
  }
}

}  // namespace cpu
}  // namespace fattn
