// fattn — instantiates the CPU kernels for one instruction set.
//
// The build compiles this file once per unit of src/cpu/isa_flags.json with its flags,
// defining
//   FATTN_VECTOR_BYTES  64 (AVX-512), 32 (AVX2+FMA) or 16 (portable)
//   FATTN_KERNELS       the name of the table: avx512_kernels, avx512_bf16_kernels,
//                       avx2_kernels, portable_kernels
//   FATTN_ISA           the Isa enumerator (avx512 for both 64-byte tables)
// Everything here is a template instantiated on UnitSimd, a type of this unit alone, so
// code built with one unit's instructions never stands in for another unit's copy of the
// same template (avx512 and avx512_bf16 both have 64-byte vectors).
#include "cpu/backward/backward.hpp"
#include "cpu/backward/ragged.hpp"
#include "cpu/decode/decode.hpp"
#include "cpu/forward/dot_bf16.hpp"
#include "cpu/forward/fused.hpp"
#include "cpu/kernels.hpp"
#include "cpu/forward/naive.hpp"

namespace fattn::cpu {
namespace {

struct UnitSimd : Simd<FATTN_VECTOR_BYTES> {};
using S = UnitSimd;

// The fused kernel: in the avx512_bf16 unit bfloat16 inputs run on bfloat16 dot products
// (cpu/forward/dot_bf16.hpp, on_bf16_dot_products), everything else on float32 FMAs.
std::int64_t workspace_floats(const detail::Problem& p, bool naive, int workers) {
#if defined(FATTN_AVX512_BF16)
  if (!naive && on_bf16_dot_products<S>(p.dtype)) return dot_bf16_workspace_floats<S>(p, workers);
#endif
  return Workspace<S>(p, naive, workers).total;
}

// The kernels take every input (no fallback): each returns true.
bool fused(const detail::Problem& p, const detail::Exec& exec, float* memory) {
#if defined(FATTN_AVX512_BF16)
  if (on_bf16_dot_products<S>(p.dtype)) {
    dot_bf16_forward<S>(p, exec, memory);
    return true;
  }
#endif
  fused_forward<S>(p, exec, memory);
  return true;
}

bool naive(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  naive_forward<S>(p, exec, memory);
  return true;
}

// A ragged batch (attention_varlen_backward) runs the fused backward over all its sequences
// at once (cpu/backward/ragged.hpp); the naive backward takes one sequence at a time.
std::int64_t backward_workspace_floats(const detail::Problem& p, bool naive, int workers) {
  if (p.is_ragged() && !naive) return ragged_backward_workspace_floats<S>(p, workers);
  return BackwardWorkspace<S>(p, naive, workers).total;
}

bool backward(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  if (p.is_ragged())
    ragged_fused_backward<S>(p, exec, memory);
  else
    fused_backward<S>(p, exec, memory);
  return true;
}

bool backward_naive(const detail::Problem& p, const detail::Exec& exec, float* memory) {
  naive_backward<S>(p, exec, memory);
  return true;
}

std::int64_t decode_workspace_floats(const detail::Problem& p, int workers, const DecodeRequest& request) {
  return DecodeWorkspace<S>(p, workers, request).total;
}

// bfloat16 dot products where fused() and the decode kernel take them (the decode kernel
// on a cache it reads in place: it stages other caches as float32); FMAs elsewhere.
Products products(const detail::Problem& p, Impl impl) {
  const bool dot_kernel = impl == Impl::fused || (impl == Impl::decode && DecodeOps<S>::reads_in_place(p));
  return dot_kernel && on_bf16_dot_products<S>(p.dtype) ? Products::bf16_dot : Products::fma;
}

}  // namespace

const Kernels FATTN_KERNELS = {Isa::FATTN_ISA,     TileOps<S>::Br, workspace_floats,
                               fused,              naive,          backward_workspace_floats,
                               backward,           backward_naive, decode_workspace_floats,
                               decode_forward<S>,  decode_plan<S>, products,
                               nullptr};

}  // namespace fattn::cpu
