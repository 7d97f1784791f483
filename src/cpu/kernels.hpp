// fattn — the CPU kernels of one instruction set, as a table the dispatcher picks from.
#pragma once

#include <cstdint>
#include <vector>

#include "model/parallel.hpp"
#include "model/problem.hpp"

namespace fattn::cpu {

// A forward or backward kernel: true when it ran; false when the inputs are not what its
// table takes (the AMX kernels: a value that does not split into bfloat16 parts, a NaN, an
// infinity or |x| > 3e38), having maybe written part of the outputs: the caller runs the
// table's fallback kernel, which rewrites every output, in the same working memory.
using KernelFn = bool (*)(const detail::Problem& p, const detail::Exec& exec, float* workspace);

// What a call asks of the decode kernel's schedule: Options::kv_splits and
// Options::decode_prefetch_tiles and decode_prefetch_level as given (0 and -1: the kernel
// chooses).
struct DecodeRequest {
  std::int64_t splits = 0;
  int prefetch_tiles = -1;
  int prefetch_level = -1;
  static DecodeRequest of(const Options& o) {
    return {o.kv_splits, o.decode_prefetch_tiles, o.decode_prefetch_level};
  }
};

struct Kernels {
  Isa isa;
  int query_tile;  // Br: query rows per work item
  // Floats of working memory for this problem (naive or fused) with `workers` threads
  // (this table's own; the caller leases room for the fallback's too).
  std::int64_t (*workspace_floats)(const detail::Problem& p, bool naive, int workers);
  KernelFn fused;
  KernelFn naive;
  // The backward (cpu/backward/backward.hpp): working memory, fused and naive. The fused
  // kernels (forward and backward) of every table take a ragged problem whole (its
  // sequences' items in one parallel section); the naive ones one sequence at a time.
  std::int64_t (*backward_workspace_floats)(const detail::Problem& p, bool naive, int workers);
  KernelFn fused_backward;
  KernelFn naive_backward;
  // The decode kernel (cpu/decode/decode.hpp), scheduled as `request` asks.
  std::int64_t (*decode_workspace_floats)(const detail::Problem& p, int workers,
                                          const DecodeRequest& request);
  void (*decode)(const detail::Problem& p, const detail::Exec& exec, float* workspace,
                 const DecodeRequest& request);
  // How decode cuts and reads this problem (ForwardPlan::decode).
  DecodePlan (*decode_plan)(const detail::Problem& p, int workers, const DecodeRequest& request);
  // What the forward's products run on in kernel `impl` (naive, fused or decode).
  Products (*products)(const detail::Problem& p, Impl impl);
  // The table whose forward and backward kernels run where this one's return false (null:
  // they always run; the AMX table's is the AVX-512 one).
  const Kernels* fallback;
};

// Built from kernels_isa.cpp, once per instruction set. avx512 and avx2 exist only on x86-64;
// avx512_bf16 (avx512 built with AVX512-BF16, for bfloat16 inputs) where the compiler has
// it (FATTN_HAVE_AVX512_BF16); amx (kernels_amx.cpp) where the compiler has AMX
// intrinsics (FATTN_HAVE_AMX).
extern const Kernels amx_kernels;
extern const Kernels avx512_kernels;
extern const Kernels avx512_bf16_kernels;
extern const Kernels avx2_kernels;
extern const Kernels portable_kernels;

// The table for an ISA this CPU supports (the caller checks), or the best one; for
// bfloat16 inputs on avx512, the avx512_bf16 table where bf16_products (automatic:
// bf16_products_choice()) is bf16_dot and cpu_has_bf16_dot_products().
const Kernels& kernels_for(Isa isa, DType dtype = DType::float32,
                           Bf16Products bf16_products = Bf16Products::automatic);
// Whether bfloat16 inputs on avx512 take vdpbf16ps under this option on this CPU.
bool runs_bf16_dot(Bf16Products bf16_products);

// Float64 reference: plain loops, for tests (cpu/reference.cpp).
void reference_forward(const detail::Problem& p, const detail::Exec& exec);
// One row of it: writes head_dim values, returns the logsumexp.
double reference_row(const detail::Problem& p, std::int64_t b, std::int64_t h, std::int64_t i,
                     double* out_row);
// The float64 reference backward (a problem from make_backward_problem).
void reference_backward(const detail::Problem& p, const detail::Exec& exec);
// The sinks' gradient dsinks[h] = −Σ_(b,i) e^(sink_h − lse) · (dout·out − dlse), from the
// forward's out and lse (float64 sums in a fixed order): the kernels' backward with sinks.
void sink_gradients(const detail::Problem& p, const detail::Exec& exec);

}  // namespace fattn::cpu
