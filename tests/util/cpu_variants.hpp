// fattn tests — the CPU kernel variants (implementation × instruction set) the CPU suites
// run each case on, and the skip for an instruction set this machine lacks.
#pragma once

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "fattn/fattn.hpp"

namespace fattn_test {

using fattn::Impl;
using fattn::Isa;

struct Variant {
  Impl impl;
  Isa isa;
};

inline std::string variant_name(const Variant& v) {
  return std::string(fattn::to_string(v.impl)) + "_" + fattn::to_string(v.isa);
}

// For gtest's parameter printing (and so ctest's test list).
inline void PrintTo(const Variant& v, std::ostream* os) { *os << variant_name(v); }

// naive and fused, each on amx, avx512, avx2 and portable.
inline std::vector<Variant> kernel_variants() {
  std::vector<Variant> vs;
  for (Impl impl : {Impl::naive, Impl::fused})
    for (Isa isa : {Isa::amx, Isa::avx512, Isa::avx2, Isa::portable}) vs.push_back({impl, isa});
  return vs;
}

// The forward kernels: naive, fused and decode, each on amx, avx512, avx2 and portable.
inline std::vector<Variant> forward_variants() {
  std::vector<Variant> vs = kernel_variants();
  for (Isa isa : {Isa::amx, Isa::avx512, Isa::avx2, Isa::portable}) vs.push_back({Impl::decode, isa});
  return vs;
}

// Skips the current test when this CPU cannot run `isa` (GTEST_SKIP returns from the test
// body, so this has to be a macro).
#define FATTN_SKIP_IF_UNSUPPORTED(isa)                                                    \
  do {                                                                                     \
    if (!fattn::cpu_supports(isa))                                                         \
      GTEST_SKIP() << "this CPU does not support isa " << fattn::to_string(isa)            \
                   << " (best: " << fattn::to_string(fattn::best_cpu_isa()) << ")";        \
  } while (0)

}  // namespace fattn_test
