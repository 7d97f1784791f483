// fattn — what each CUDA C++ kernel takes (refusal.hpp). Every rule that decides whether a
// CUDA kernel may run a call is here once: the plan (plan.cpp), the device checks
// (device.cpp), the decode and backward refusals (kvcache.cpp, backward.cpp) and the
// dispatch table's choice (table_choice.cpp) ask these functions.
#include "cuda/refusal.hpp"

#include <cstddef>
#include <iterator>
#include <string>
#include <vector>

#include "cuda/decode.hpp"           // decode_head_dims
#include "cuda/dispatch_lookup.hpp"  // the table's entries and kernels
#include "cuda/host_checks.hpp"      // join, compiled_dim_for
#include "cuda/kernels.hpp"          // the forward families' table

namespace fattn::cuda {
namespace {

// The decode kernel copies rows in 16-byte chunks: head dims in multiples of 8 16-bit values.
constexpr std::int64_t kDecodeHeadDimMultiple = 8;

struct TableKernelRules {
  TableKernel kernel;
  const char* name;     // table.json's
  const char* entry;    // the table entry it serves
  Kernel forward;       // the forward family it runs (Kernel::automatic: none)
};

constexpr TableKernelRules kTableKernels[] = {
    {TableKernel::fused_tma, "fused_tma", "forward", Kernel::fused_tma},
    {TableKernel::fused_tma_variants, "fused_tma_variants", "forward", Kernel::fused_tma},
    {TableKernel::fused_mma, "fused_mma", "forward", Kernel::fused_mma},
    {TableKernel::fused_tf32x3, "fused_tf32x3", "forward", Kernel::fused_tf32x3},
    {TableKernel::fused_tf32, "fused_tf32", "forward", Kernel::fused_tf32},
    {TableKernel::decode, "decode", "kvcache", Kernel::automatic},
    {TableKernel::backward_tma, "backward_tma", "backward", Kernel::automatic},
};

constexpr bool every_table_kernel_in_order() {
  for (std::size_t i = 0; i < std::size(kTableKernels); ++i)
    if (static_cast<std::size_t>(kTableKernels[i].kernel) != i) return false;
  return true;
}
static_assert(every_table_kernel_in_order(), "kTableKernels lists TableKernel's values in order");

const TableKernelRules& rules_of(TableKernel kernel) {
  return kTableKernels[static_cast<std::size_t>(kernel)];
}

std::string text(ComputeCapability cc) {
  return std::to_string(cc.major) + "." + std::to_string(cc.minor);
}

bool sixteen_bit(DType dtype) { return dtype == DType::float16 || dtype == DType::bfloat16; }

bool has_lower_edge_or_mods(const CudaCall& call) {
  return call.window_left >= 0 || call.softcap || call.alibi || call.sinks;
}

std::string kernel_name(Kernel kernel) {
  return std::string("the ") + to_string(kernel) + " CUDA kernel";
}

// The Hopper kernels exist where the build made them (cmake/cuda.cmake: FATTN_CUDA_WGMMA).
std::string hopper_build_refusal(Kernel kernel) {
  if (!hopper_head_dims(kernel).empty()) return {};
  return "this build has no " + std::string(to_string(kernel)) +
         " CUDA kernel (the wgmma kernels are built when CMAKE_CUDA_ARCHITECTURES has 90 and "
         "FATTN_CUDA_WGMMA is not OFF)";
}

std::string inputs_refusal(Kernel kernel, DType dtype) {
  const Inputs inputs = family(kernel).inputs;
  if (inputs == Inputs::sixteen_bit && !sixteen_bit(dtype))
    return kernel_name(kernel) + " takes float16 or bfloat16, got " + to_string(dtype);
  if (inputs == Inputs::float32 && dtype != DType::float32)
    return kernel_name(kernel) + " takes float32, got " + to_string(dtype);
  return {};
}

std::string variants_refusal(Kernel kernel, const CudaCall& call) {
  if (!has_lower_edge_or_mods(call) || takes_variants(kernel)) return {};
  return kernel_name(kernel) + " takes no " + variant_names(call) +
         " (the fused_tma kernel, float16/bfloat16 at head dims up to 256 on compute capability "
         "9.0, and the float64 reference do; fattn's Triton kernels take them on every GPU)";
}

std::string head_dim_refusal(Kernel kernel, std::int64_t head_dim) {
  const Method method = family(kernel).method;
  if (method == Method::naive || method == Method::reference ||
      method == Method::chosen_per_call)
    return {};  // any head dim the validation takes
  const std::string dim = "head dim " + std::to_string(head_dim);
  if (is_wgmma(kernel)) {
    if (const std::string why = hopper_build_refusal(kernel); !why.empty()) return dim + ": " + why;
    const std::vector<int> dims = hopper_head_dims(kernel);
    if (compiled_dim_for(dims, head_dim) != 0) return {};
    return dim + " is larger than every head dim the " + to_string(kernel) +
           " CUDA kernel is built for (" + join(dims) + "); use the fused_mma kernel";
  }
  if (compiled_dim_for(supported_head_dims(), head_dim) != 0) return {};
  return dim + " is larger than every head dim the fused CUDA kernels are built for (" +
         supported_head_dims_text() +
         "); rebuild with it in FATTN_CUDA_HEAD_DIMS, or use Impl::naive";
}

// The two instantiations of the TMA kernel are two table kernels (two sets of machine code):
// the table's variants (a left window, softcap, ALiBi, sinks) decide which one a call is.
std::string instantiation_refusal(TableKernel kernel, const CudaCall& call) {
  const bool variants = dispatch::has_variants(call);
  if (kernel == TableKernel::fused_tma && variants)
    return "fused_tma is the TMA kernel's plain instantiation, which takes no left window, "
           "softcap, ALiBi or sinks, got " + variant_names(call) + " (fused_tma_variants takes them)";
  if (kernel == TableKernel::fused_tma_variants && !variants)
    return "fused_tma_variants is the TMA kernel's instantiation for a left window, softcap, ALiBi or "
           "sinks, and the call has none of them (fused_tma runs it)";
  return {};
}

// Impl::automatic runs float32 in TF32 mode only where the caller allows it (Options::allow_tf32).
std::string tf32_mode_refusal(TableKernel kernel, const CudaCall& call) {
  if (kernel != TableKernel::fused_tf32 || call.allow_tf32) return {};
  return "fused_tf32 runs float32 in TF32 mode, which needs allow_tf32 = true, got false "
         "(fused_tf32x3 keeps float32 accuracy)";
}

std::string decode_rules(const CudaCall& call) {
  if (!sixteen_bit(call.dtype))
    return std::string("the CUDA decode kernel takes float16 or bfloat16, got ") +
           to_string(call.dtype);
  const std::vector<int> dims = decode_head_dims();
  if (call.head_dim % kDecodeHeadDimMultiple != 0 || compiled_dim_for(dims, call.head_dim) == 0)
    return "head dim " + std::to_string(call.head_dim) +
           ": the CUDA decode kernel takes multiples of " +
           std::to_string(kDecodeHeadDimMultiple) + " up to " + std::to_string(dims.back());
  if (call.attn_mask) return "the CUDA decode kernel takes no attn_mask";
  return {};
}

std::string backward_rules(const CudaCall& call) {
  const std::vector<int> dims = backward_head_dims();
  if (dims.empty())
    return "this build has no Hopper backward (it is built for sm_90a when "
           "CMAKE_CUDA_ARCHITECTURES has 90 and FATTN_CUDA_WGMMA is not OFF)";
  if (!sixteen_bit(call.dtype))
    return std::string("the Hopper backward takes float16 or bfloat16, got ") +
           to_string(call.dtype);
  if (compiled_dim_for(dims, call.head_dim) == 0)
    return "the Hopper backward takes head dims up to " + std::to_string(dims.back()) + ", got " +
           std::to_string(call.head_dim);
  if (call.attn_mask) return "the Hopper backward takes no attn_mask";
  return {};
}

std::string entry_refusal(TableKernel kernel, const CudaCall& call) {
  dispatch::entry_of(call);  // an Error for an entry the table does not have
  const TableKernelRules& rules = rules_of(kernel);
  if (call.entry == rules.entry) return {};
  return std::string(rules.name) + " runs the dispatch table's " + rules.entry + " entry, got " +
         call.entry;
}

}  // namespace

TableKernel table_kernel(const std::string& name) {
  dispatch::cpp_kernel_named(name);  // an Error for a name the table gives no C++ kernel
  for (const TableKernelRules& rules : kTableKernels)
    if (name == rules.name) return rules.kernel;
  throw Error("fattn: the dispatch table's CUDA C++ kernel '" + name +
              "' has no rules in this build of fattn (src/cuda/refusal.cpp)");
}

const char* to_string(TableKernel kernel) { return rules_of(kernel).name; }

Kernel forward_kernel(TableKernel kernel) { return rules_of(kernel).forward; }

CudaCall call_of(const char* entry, DType dtype, std::int64_t head_dim, const Options& options) {
  CudaCall call;
  call.entry = entry;
  call.dtype = dtype;
  call.head_dim = head_dim;
  call.window_left = options.window_left;
  call.window_right = options.window_right;
  call.softcap = options.softcap != 0.0;
  call.alibi = options.alibi_slopes != nullptr;
  call.sinks = options.sinks != nullptr;
  call.attn_mask = options.attn_mask != nullptr;
  call.allow_tf32 = options.allow_tf32;
  return call;
}

std::string variant_names(const CudaCall& call) {
  std::string names;
  auto add = [&](bool on, const char* name) {
    if (on) names += (names.empty() ? "" : ", ") + std::string(name);
  };
  add(call.window_left >= 0, "left window (window_left)");
  add(call.softcap, "softcap");
  add(call.alibi, "alibi_slopes");
  add(call.sinks, "sinks");
  return names;
}

std::string forward_refusal(Kernel kernel, const CudaCall& call) {
  if (std::string why = inputs_refusal(kernel, call.dtype); !why.empty()) return why;
  if (call.attn_mask)
    return kernel_name(kernel) +
           " takes no attn_mask (the CUDA C++ kernels take no attn_mask yet; the CPU kernels and "
           "fattn's Triton kernels do)";
  if (std::string why = variants_refusal(kernel, call); !why.empty()) return why;
  return head_dim_refusal(kernel, call.head_dim);
}

std::string least_capability_refusal(ComputeCapability cc) {
  if (cc.major > kLeastCapability.major ||
      (cc.major == kLeastCapability.major && cc.minor >= kLeastCapability.minor))
    return {};
  return "the CUDA kernels need compute capability " + text(kLeastCapability) +
         " or newer (cp.async, bf16 and tf32 mma.sync), got " + text(cc);
}

std::string capability_refusal(Kernel kernel, ComputeCapability cc) {
  if (!is_wgmma(kernel)) return least_capability_refusal(cc);
  if (std::string why = hopper_build_refusal(kernel); !why.empty()) return why;
  if (cc.major == kWgmmaCapability.major && cc.minor == kWgmmaCapability.minor) return {};
  return kernel_name(kernel) + " is built for sm_90a and runs on compute capability " +
         text(kWgmmaCapability) + " (Hopper) only, got " + text(cc);
}

std::string refusal_on_any_device(TableKernel kernel, const CudaCall& call) {
  if (std::string why = entry_refusal(kernel, call); !why.empty()) return why;
  if (kernel == TableKernel::decode) return decode_rules(call);
  if (kernel == TableKernel::backward_tma) return backward_rules(call);
  if (std::string why = forward_refusal(forward_kernel(kernel), call); !why.empty()) return why;
  if (std::string why = instantiation_refusal(kernel, call); !why.empty()) return why;
  return tf32_mode_refusal(kernel, call);
}

std::string capability_refusal(TableKernel kernel, ComputeCapability cc) {
  if (kernel == TableKernel::decode) return least_capability_refusal(cc);
  if (kernel != TableKernel::backward_tma) return capability_refusal(forward_kernel(kernel), cc);
  if (cc.major == kWgmmaCapability.major && cc.minor == kWgmmaCapability.minor) return {};
  return "the Hopper backward runs on compute capability " + text(kWgmmaCapability) +
         " (sm_90a), got " + text(cc);
}

std::string refusal(TableKernel kernel, const CudaCall& call) {
  if (std::string why = refusal_on_any_device(kernel, call); !why.empty()) return why;
  return capability_refusal(kernel, ComputeCapability{call.major, call.minor});
}

}  // namespace fattn::cuda
