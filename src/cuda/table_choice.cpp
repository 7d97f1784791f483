// fattn — the GPU dispatch table's choice on the C++ side (table_choice.hpp).
#include "cuda/table_choice.hpp"

#include <cuda_runtime_api.h>

#include <string>

#include "cuda/dispatch_lookup.hpp"  // the table's rows
#include "cuda/verified.hpp"

namespace fattn::cuda {

ComputeCapability current_capability() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // no device: nothing runs, and the next CUDA call must not see it
    return {};
  }
  return compute_capability(device);
}

std::string first_candidate(const CudaCall& call, bool triton_runs,
                            const std::function<std::string(TableKernel)>& refusal_of,
                            const std::function<bool(const std::string&)>& admitted) {
  const dispatch::Row* row = dispatch::row_for(call);
  if (!row) return {};
  for (int i = 0; i < row->candidate_count; ++i) {
    const std::string name(row->candidates[i]);
    const dispatch::KernelRow* kernel = dispatch::kernel_named(name);
    if (admitted && !admitted(name)) continue;
    if (kernel->engine == dispatch::Engine::triton) {
      if (triton_runs) return name;
      continue;
    }
    if (refusal_of(table_kernel(name)).empty()) return name;
  }
  return {};
}

Kernel automatic_kernel_for(const CudaCall& call) {
  const auto takes = [&](TableKernel kernel) { return refusal(kernel, call); };
  const std::string architecture = dispatch::architecture_of(call.major, call.minor);
  std::string chosen = first_candidate(call, false, takes, [&](const std::string& name) {
    return verified(name, architecture);
  });
  if (chosen.empty()) {  // none verified: one a GPU has run, else the first that takes it
    chosen = first_candidate(call, false, takes, [](const std::string& name) {
      return dispatch::kernel_named(name)->ran_on_gpu;
    });
    if (chosen.empty()) chosen = first_candidate(call, false, takes);
    if (chosen.empty()) return kernel_for(Impl::automatic, call.dtype, call.allow_tf32);
    unverified_default(chosen, architecture, call.entry);
  }
  return forward_kernel(table_kernel(chosen));
}

}  // namespace fattn::cuda
