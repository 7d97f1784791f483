// fattn — what each CUDA C++ kernel takes, in one place: the forward families (by Kernel,
// for the plan of any kernel) and the C++ kernels of the GPU dispatch table (by their table
// names, for fattn::cuda_refusal and the table's choice). Each answer is "" where the
// kernel takes the call, else a sentence naming the argument, what the kernel takes and what
// the call has. Pure functions of the build and a CudaCall; nothing on a device is read.
// Plain C++ (no CUDA headers): host tests include it.
#pragma once

#include <cstdint>
#include <string>

#include "cuda/backend.hpp"
#include "cuda/device.hpp"
#include "fattn/cuda_refusal.hpp"

namespace fattn::cuda {

// Every CUDA kernel needs compute capability 8.0 or newer (cp.async, bfloat16 and tf32
// mma.sync); the Hopper kernels exactly kWgmmaCapability (device.hpp).
inline constexpr ComputeCapability kLeastCapability{8, 0};

// The C++ kernels of python/fattn/dispatch/table.json ("engine": "cuda_cpp"), in the order
// of refusal.cpp's table of them.
enum class TableKernel : std::uint8_t {
  fused_tma,           // Kernel::fused_tma's plain instantiation: no variants
  fused_tma_variants,  // its instantiation with a window, softcap, ALiBi or sinks
  fused_mma,
  fused_tf32x3,
  fused_tf32,          // float32 in TF32 mode: taken where allow_tf32 is set
  decode,              // the KV-cache decode kernel (decode.hpp)
  backward_tma,        // the Hopper backward
};

// The table kernel named `name`: an Error for a name that is not one of the table's C++
// kernels.
TableKernel table_kernel(const std::string& name);
const char* to_string(TableKernel kernel);
// The forward family a forward table kernel runs (Kernel::automatic for decode and
// backward_tma, which are no forward family).
Kernel forward_kernel(TableKernel kernel);

// The call of table entry `entry` with q's dtype, q's head dim and these options' variants,
// attn_mask and allow_tf32; its compute capability {0, 0} (the caller's to set).
CudaCall call_of(const char* entry, DType dtype, std::int64_t head_dim, const Options& options);

// The variants of a call a kernel may refuse, named as its arguments: "left window
// (window_left)", "softcap", "alibi_slopes", "sinks", joined by commas; "" for none.
std::string variant_names(const CudaCall& call);

// --- the forward families (any Kernel value but automatic) ------------------------------
// Why `kernel` does not take `call` on any device: q's dtype, attn_mask, the variants (a left
// window, softcap, ALiBi, sinks: those of kernels.hpp's takes_variants only; a right window
// every kernel takes), the head dim (at most the largest it is built for; the Hopper
// kernels: built at all).
std::string forward_refusal(Kernel kernel, const CudaCall& call);
// Why its machine code does not run at compute capability `cc`: the Hopper kernels need a
// build with them and exactly kWgmmaCapability, the others kLeastCapability or newer.
std::string capability_refusal(Kernel kernel, ComputeCapability cc);
// Why no CUDA kernel runs at compute capability `cc` ("" from kLeastCapability on).
std::string least_capability_refusal(ComputeCapability cc);

// --- the table's kernels -----------------------------------------------------------------
// Why `kernel` does not take `call` on any device (everything but call.major, call.minor):
// the entry it serves, the build, the dtype, the head dim, attn_mask, the variants, the TF32
// mode. An Error for an entry the table does not have.
std::string refusal_on_any_device(TableKernel kernel, const CudaCall& call);
// Why its machine code does not run at compute capability `cc`.
std::string capability_refusal(TableKernel kernel, ComputeCapability cc);
// Both, the device-independent reasons first: fattn::cuda_refusal's answer.
std::string refusal(TableKernel kernel, const CudaCall& call);

}  // namespace fattn::cuda
