// fattn — instantiates the CPU kernels for one instruction set.
//
// The build compiles this file once per ISA with that ISA's flags, defining
//   FATTN_VECTOR_BYTES  64 (AVX-512), 32 (AVX2+FMA) or 16 (portable)
//   FATTN_KERNELS       the name of the table: avx512_kernels, avx2_kernels, portable_kernels
//   FATTN_ISA           the Isa enumerator
// Everything here is a template instantiated on Simd<FATTN_VECTOR_BYTES>, a type
// unique to this unit, so code built with wide instructions never leaks into
// another unit's symbols.
#include "cpu/backward.hpp"
#include "cpu/decode.hpp"
#include "cpu/fused.hpp"
#include "cpu/kernels.hpp"
#include "cpu/naive.hpp"

namespace fattn::cpu {
namespace {

using S = Simd<FATTN_VECTOR_BYTES>;

std::int64_t workspace_floats(const detail::Problem& p, bool naive, int workers) {
  return Workspace<S>(p, naive, workers).total;
}

std::int64_t backward_workspace_floats(const detail::Problem& p, bool naive, int workers) {
  return BackwardWorkspace<S>(p, naive, workers).total;
}

std::int64_t decode_workspace_floats(const detail::Problem& p, int workers, std::int64_t splits) {
  return DecodePlan<S>(p, workers, splits).total;
}

}  // namespace

const Kernels FATTN_KERNELS = {Isa::FATTN_ISA,        TileOps<S>::Br,     workspace_floats,
                               fused_forward<S>,      naive_forward<S>,   backward_workspace_floats,
                               fused_backward<S>,     naive_backward<S>,  decode_workspace_floats,
                               decode_forward<S>};

}  // namespace fattn::cpu
