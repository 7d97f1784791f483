// fattn — the AMX kernel table: forward and backward, naive and fused, on AMX tiles
// (cpu/amx/forward.hpp, cpu/amx/backward.hpp, cpu/amx/naive_backward.hpp).
//
// Built with AMX and AVX-512BW flags, and only called where cpu_supports(Isa::amx) has
// asked Linux for the tile state. Its templates are instantiated on AmxSimd, a type of
// this unit alone, so none of its AMX-flagged code can stand in for the AVX-512 unit's
// copies of the same templates on a CPU without AMX.
#include "cpu/amx/backward.hpp"
#include "cpu/amx/forward.hpp"
#include "cpu/amx/naive_backward.hpp"
#include "cpu/decode/decode.hpp"
#include "cpu/kernels.hpp"

namespace fattn::cpu {
namespace {

struct AmxSimd : Simd<64> {};
using S = AmxSimd;

// The AMX kernels' own working memory. On inputs that do not split into bfloat16 parts
// they return false and the caller runs the AVX-512 kernels (the table's fallback) in the
// same memory, which it leases for either.
std::int64_t workspace_floats(const detail::Problem& p, bool naive, int workers) {
  return AmxWorkspace<S>(p, naive, workers).total;
}

std::int64_t backward_workspace_floats(const detail::Problem& p, bool naive, int workers) {
  if (p.is_ragged() && !naive)  // the naive backward takes one sequence at a time
    return RaggedBackward<S, AmxBackwardMainloop<S>>(p, workers).total();
  return naive ? AmxNaiveBackwardWorkspace<S>(p, workers).total
               : AmxBackwardWorkspace<S>(p, workers).total;
}

// The decode kernel is memory-bound at the shapes it is chosen for (a few query rows per
// kv head): it runs the AVX-512 FMA loop here too, with no bfloat16 split.
std::int64_t decode_workspace_floats(const detail::Problem& p, int workers, const DecodeRequest& request) {
  return DecodeWorkspace<S>(p, workers, request).total;
}

// The naive and fused kernels on tiles; the decode kernel on AVX-512 FMAs (above).
Products products(const detail::Problem&, Impl impl) {
  return impl == Impl::decode ? Products::fma : Products::amx;
}

}  // namespace

const Kernels amx_kernels = {Isa::amx,             AmxOps<S>::Br,         workspace_floats,
                             amx_fused_forward<S>, amx_naive_forward<S>,  backward_workspace_floats,
                             amx_fused_backward<S>, amx_naive_backward<S>, decode_workspace_floats,
                             decode_forward<S>,    decode_plan<S>,        products,
                             &avx512_kernels};

}  // namespace fattn::cpu
